"""The test stack's services as another local user would meet them: no lifecycle API, no readable state."""

from __future__ import annotations

import io
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from minio import Minio

from stack import StackLayout, proc, status, up
from stack import prometheus as prom
from stack.addresses import minio_api
from streaming.core.config import Settings
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def _post(url: str) -> int:
    request = urllib.request.Request(url, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def _reload_stamp(base: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("prometheus_config_last_reload_success_timestamp_seconds "):
                return float(line.split()[1])
    raise AssertionError("Prometheus exposes no prometheus_config_last_reload_success_timestamp_seconds")


def test_prometheus_refuses_quit_and_reload_over_http(settings: Settings) -> None:
    base = prom.url(settings)
    assert _post(f"{base}/-/quit") == 403
    assert _post(f"{base}/-/reload") == 403
    assert prom.answers(base), "Prometheus stopped after a POST /-/quit"


def test_a_second_up_reloads_the_running_prometheus_by_sighup(settings: Settings, stack_layout: StackLayout) -> None:
    base = prom.url(settings)
    before = _reload_stamp(base)
    up(settings, stack_layout, echo=None)
    wait_for(lambda: _reload_stamp(base) > before, timeout=30, message="Prometheus to reload its config")


def _loose(root: Path) -> list[str]:
    """Entries under root (root included) that a group or other user could read, write or enter.

    The services keep running while this walks: an entry that vanishes between listing and
    stat (MinIO empties its .trash on its own) is gone, not loose, so it is skipped.
    """
    paths = [root]
    for parent, dirs, files in os.walk(root):  # os.walk skips directories that vanish
        paths += [Path(parent, name) for name in (*dirs, *files)]
    found = []
    for path in paths:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISLNK(mode) and stat.S_IMODE(mode) & 0o077:
            found.append(f"{oct(stat.S_IMODE(mode))} {path}")
    return found


def test_stack_home_and_service_data_are_private(
    settings: Settings, stack_layout: StackLayout, stack_secrets: dict[str, str]
) -> None:
    api = minio_api(settings.storage.endpoint)
    client = Minio(
        f"{api.host}:{api.port}",
        access_key=settings.storage.access_key,
        secret_key=settings.storage.secret_key,
        secure=False,
        region=settings.storage.region,
    )
    prefix = settings.storage.base_uri.split("://", 1)[1].split("/", 1)[1]
    client.put_object(settings.storage.bucket, f"{prefix}/private.txt", io.BytesIO(b"x"), 1)
    assert stat.S_IMODE(stack_layout.home.stat().st_mode) == 0o700
    loose = [
        *_loose(stack_layout.minio_data),
        *_loose(stack_layout.kafka_data),
        *_loose(prom.data(stack_layout)),
        *_loose(stack_layout.logs),
    ]
    assert loose == [], "\n".join(loose[:20])
    assert os.stat(settings.storage.secrets_file).st_mode & 0o077 == 0


def test_the_log_keeper_runs_beside_the_services(settings: Settings, stack_layout: StackLayout) -> None:
    keeper = status(settings, stack_layout)["logkeeper"]
    assert keeper["state"] == "running" and isinstance(keeper["pid"], int), keeper
    assert f"--home {stack_layout.home} " in (proc.cmdline(keeper["pid"]) or "")
