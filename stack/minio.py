"""MinIO on loopback (API on storage.endpoint, console on port + 1) and its bootstrap: a private bucket,
a writer and a reader policy scoped to that bucket, and one user for each."""

from __future__ import annotations

import json
import os
from typing import Any

from minio import Minio, MinioAdmin
from minio.credentials import StaticProvider
from minio.error import MinioAdminException, S3Error

from stack import proc
from stack import secrets as sec
from stack.addresses import HostPort, bind_host, minio_api, minio_console
from stack.install import Installed
from stack.layout import StackLayout
from streaming.core import http
from streaming.core.config import Settings
from streaming.core.errors import StackError

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
SETTING = "storage.endpoint (IOTLAKE_STORAGE__ENDPOINT)"

# What S3A and Delta need to read and write tables, and nothing else (no bucket creation or policy changes).
WRITER_BUCKET_ACTIONS = ("s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads")
WRITER_OBJECT_ACTIONS = (
    "s3:GetObject",
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:ListMultipartUploadParts",
    "s3:AbortMultipartUpload",
)
READER_BUCKET_ACTIONS = ("s3:ListBucket", "s3:GetBucketLocation")
READER_OBJECT_ACTIONS = ("s3:GetObject",)


def _policy(bucket: str, bucket_actions: tuple[str, ...], object_actions: tuple[str, ...]) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": list(bucket_actions), "Resource": [f"arn:aws:s3:::{bucket}"]},
            {"Effect": "Allow", "Action": list(object_actions), "Resource": [f"arn:aws:s3:::{bucket}/*"]},
        ],
    }


def writer_policy(bucket: str) -> dict[str, Any]:
    """Read, write and delete objects of one bucket (what S3A + Delta need); no bucket administration."""
    return _policy(bucket, WRITER_BUCKET_ACTIONS, WRITER_OBJECT_ACTIONS)


def reader_policy(bucket: str) -> dict[str, Any]:
    """Read-only access to one bucket, for other engines."""
    return _policy(bucket, READER_BUCKET_ACTIONS, READER_OBJECT_ACTIONS)


def policy_names(bucket: str) -> tuple[str, str]:
    return f"iotlake-{bucket}-writer", f"iotlake-{bucket}-reader"


def service(layout: StackLayout) -> proc.Service:
    return proc.Service(
        name="minio", pidfile=layout.pidfile("minio"), log=layout.log("minio"), marker=str(layout.minio_data)
    )


def address(settings: Settings) -> HostPort:
    return minio_api(settings.storage.endpoint)


def answers(api: HostPort, timeout: float = 1.0) -> bool:
    """True if GET /minio/health/live answers 200."""
    return http.answers(f"http://{bind_host(api)}:{api.port}/minio/health/live", timeout)


def _argv(inst: Installed, layout: StackLayout, api: HostPort) -> list[str]:
    console = minio_console(api)
    return [
        str(inst.minio),
        "server",
        str(layout.minio_data),
        "--address",
        f"{bind_host(api)}:{api.port}",
        "--console-address",
        f"{bind_host(console)}:{console.port}",
    ]


def check_can_start(settings: Settings, layout: StackLayout) -> int | None:
    """The pid of our running MinIO (same ports), or None after checking its ports are free."""
    api = address(settings)
    ports = {"API": api, "console": minio_console(api)}
    return proc.reuse_or_require_free(
        "MinIO", service(layout), f"--address {bind_host(api)}:{api.port} ", ports, SETTING
    )


def launch(settings: Settings, layout: StackLayout, inst: Installed, secrets: dict[str, str]) -> tuple[int, bool]:
    """Start MinIO detached unless ours already runs. Returns (pid, reused)."""
    pid = check_can_start(settings, layout)
    if pid is not None:
        return pid, True
    svc = service(layout)
    api = address(settings)
    layout.make_dirs()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIO_")}
    env.update(
        MINIO_ROOT_USER=secrets[sec.ROOT_USER],
        MINIO_ROOT_PASSWORD=secrets[sec.ROOT_PASSWORD],
        MINIO_UPDATE="off",
        MINIO_BROWSER_LOGIN_ANIMATION="off",
    )
    return proc.start(svc, _argv(inst, layout, api), env=env, cwd=layout.home), False


def wait_ready(settings: Settings, layout: StackLayout, pid: int, timeout: float = START_TIMEOUT_S) -> float:
    api = address(settings)
    return proc.wait_ready(service(layout), pid, lambda: answers(api), timeout, f"GET /minio/health/live on {api}")


def stop(layout: StackLayout, timeout: float = STOP_TIMEOUT_S) -> int | None:
    return proc.stop(service(layout), timeout)


def bootstrap(settings: Settings, secrets: dict[str, str], endpoint: str | None = None) -> None:
    """As root: create the bucket (private), the writer and reader policies and users. Idempotent.

    endpoint: host:port of the S3 API; default the native stack's loopback address from storage.endpoint
    (the compose minio-init job passes the service's address instead)."""
    if endpoint is None:
        api = address(settings)
        endpoint = f"{bind_host(api)}:{api.port}"
    bucket = settings.storage.bucket
    root, password = secrets[sec.ROOT_USER], secrets[sec.ROOT_PASSWORD]
    client = Minio(endpoint, access_key=root, secret_key=password, secure=False, region=settings.storage.region)
    admin = MinioAdmin(endpoint=endpoint, credentials=StaticProvider(root, password), secure=False)
    writer_name, reader_name = policy_names(bucket)
    step = "creating the bucket"
    try:
        if not client.bucket_exists(bucket):
            try:
                client.make_bucket(bucket)
            except S3Error as e:
                if e.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
        step = "making the bucket private"
        _make_private(client, bucket)
        step = "adding the policies"
        admin.policy_add(writer_name, policy=writer_policy(bucket))
        admin.policy_add(reader_name, policy=reader_policy(bucket))
        step = "adding the users"
        for key, secret, policy in (
            (secrets[sec.WRITER_ACCESS_KEY], secrets[sec.WRITER_SECRET_KEY], writer_name),
            (secrets[sec.READER_ACCESS_KEY], secrets[sec.READER_SECRET_KEY], reader_name),
        ):
            admin.user_add(key, secret)
            _set_policy(admin, policy, key)
    except (S3Error, MinioAdminException, ValueError) as e:
        raise StackError(
            f"MinIO bootstrap failed while {step} (bucket {bucket!r} on {endpoint}): {e}. If the root "
            "credentials were refused, the data dir was made with another secrets file: restore that file, "
            "or stop the stack and delete the MinIO data dir to start afresh."
        ) from e


def _make_private(client: Minio, bucket: str) -> None:
    """Remove any bucket policy: no anonymous access."""
    try:
        client.get_bucket_policy(bucket)
    except S3Error as e:
        if e.code == "NoSuchBucketPolicy":
            return
        raise
    client.delete_bucket_policy(bucket)


def _set_policy(admin: MinioAdmin, policy: str, user: str) -> None:
    """Attach exactly this policy to the user (no-op if it is attached already)."""
    try:
        info = json.loads(admin.user_info(user))
    except (MinioAdminException, ValueError):
        info = {}
    if info.get("policyName") == policy:
        return
    admin.policy_set(policy, user=user)
