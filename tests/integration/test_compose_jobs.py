"""The compose deployment's one-shot MinIO job, run exactly as docker-compose.yml runs it
(`python -m stack bootstrap-minio`, its secrets in the mounted bootstrap.env), against the real test-stack MinIO."""

from __future__ import annotations

import io
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from minio import Minio
from minio.error import S3Error

from stack import compose
from stack import secrets as sec
from streaming.core.config import PROJECT_ROOT, load_settings

pytestmark = pytest.mark.integration


def _bootstrap(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stack", "bootstrap-minio", "--timeout", "30"],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bootstrap_minio_job_creates_a_private_bucket_and_scoped_keys(
    test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    bucket = f"compose-{uuid.uuid4().hex[:10]}"
    fresh = sec.generate()  # new writer/reader users, as a new secrets folder would bring
    fresh[sec.ROOT_USER], fresh[sec.ROOT_PASSWORD] = stack_secrets[sec.ROOT_USER], stack_secrets[sec.ROOT_PASSWORD]
    compose.write_secret_files(tmp_path / "secrets", compose.generate_values(fresh))
    env = {k: v for k, v in test_env.items() if not k.startswith("IOTLAKE_STORAGE__") or k.endswith("ENDPOINT")}
    env = {k: v for k, v in env.items() if k not in sec.NAMES}  # nothing from the environment
    env["IOTLAKE_STORAGE__BASE_URI"] = f"s3a://{bucket}/lake"
    env["IOTLAKE_STORAGE__SECRETS_FILE"] = str(tmp_path / "secrets" / "bootstrap.env")  # as mounted by compose

    first = _bootstrap(env)
    assert first.returncode == 0, first.stderr
    assert f"bucket {bucket!r} private" in first.stdout
    again = _bootstrap(env)
    assert again.returncode == 0, f"not idempotent: {again.stderr}"

    settings = load_settings(env=env)
    host = settings.storage.endpoint.split("://", 1)[1]

    def client(access: str, secret: str) -> Minio:
        return Minio(host, access_key=access, secret_key=secret, secure=False, region=settings.storage.region)

    writer = client(fresh[sec.WRITER_ACCESS_KEY], fresh[sec.WRITER_SECRET_KEY])
    reader = client(fresh[sec.READER_ACCESS_KEY], fresh[sec.READER_SECRET_KEY])
    writer.put_object(bucket, "lake/probe.txt", io.BytesIO(b"ok"), 2)
    assert reader.get_object(bucket, "lake/probe.txt").read() == b"ok"
    with pytest.raises(S3Error) as refused:
        reader.put_object(bucket, "lake/nope.txt", io.BytesIO(b"no"), 2)
    assert refused.value.code == "AccessDenied"
    with pytest.raises(S3Error) as refused:
        writer.make_bucket(f"{bucket}-other")
    assert refused.value.code == "AccessDenied"
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{settings.storage.endpoint}/{bucket}/lake/probe.txt", timeout=5)
    assert anonymous.value.code == 403


def test_bootstrap_minio_job_names_missing_secrets(test_env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in test_env.items() if k not in sec.NAMES}
    env["IOTLAKE_STORAGE__SECRETS_FILE"] = str(tmp_path / "absent.env")
    done = _bootstrap(env)
    assert done.returncode == 2
    assert "MINIO_ROOT_USER" in done.stderr and "make secrets" in done.stderr and "absent.env" in done.stderr
    assert "Traceback" not in done.stderr
