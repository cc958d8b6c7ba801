"""docker-compose.yml run for real on podman: healthchecks, scraping, exact counts through faults, a
down/up from the same volumes, and what a container exposes. One project for the whole module (the
`deployed` fixture); the tests run in file order and each adds to what the simulator has sent."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from deltalake.exceptions import TableNotFoundError

from stack import compose, containers
from streaming.core import http
from tests.deploy.conftest import Deployed
from tests.integration.lake import assert_tables_match, read_table

T = TypeVar("T")

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

FAULTS = ("--duplicate-rate", "0.05", "--out-of-order-rate", "0.05", "--late-rate", "0.05", "--malformed-rate", "0.04")
LONG_RUNNING = ("minio", "kafka", "ingest", "maintain", "prometheus")


def settle(read: Callable[[], T], ok: Callable[[T], bool], timeout: float, message: str) -> T:
    """Poll `read()` until `ok` holds for its value and return it; on the deadline, fail showing the last one."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if ok(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message}; last: {value!r}")
        time.sleep(2.0)


def wait_healthy(d: Deployed, timeout: float = 600) -> None:
    settle(
        lambda: {s: d.deployment.health(s) for s in LONG_RUNNING},
        lambda states: set(states.values()) == {"healthy"},
        timeout,
        "every long-running service to be healthy",
    )


def _tables_match(d: Deployed) -> bool:
    try:
        assert_tables_match(d.settings, d.secrets, d.expected())
    except (AssertionError, TableNotFoundError, OSError):  # not caught up yet, or no table yet
        return False
    return True


def wait_exact(d: Deployed, timeout: float = 600) -> None:
    """Wait until the tables hold exactly what the simulator sent, then assert it (naming what differs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not _tables_match(d):
        time.sleep(2.0)
    assert_tables_match(d.settings, d.secrets, d.expected())


def test_every_service_becomes_healthy(deployed: Deployed) -> None:
    wait_healthy(deployed)
    one_shots = {s: deployed.deployment.state(s) for s in ("minio-init", "kafka-init")}
    assert one_shots == {"minio-init": "exited", "kafka-init": "exited"}, one_shots


def test_simulator_to_tables_exact_counts_and_prometheus_scrapes_every_target(deployed: Deployed) -> None:
    run = deployed.simulate(30_000, 1_000, FAULTS)  # 30 s: long enough for Prometheus to scrape it
    url = f"http://127.0.0.1:{deployed.ports['PROMETHEUS_PORT']}/api/v1/targets"

    def targets() -> dict[str, str]:
        body = http.get_json(url, 5.0) or {"data": {"activeTargets": []}}
        return {t["labels"]["job"]: t["health"] for t in body["data"]["activeTargets"]}

    settle(
        targets,
        lambda up: up == {"iotlake-ingest": "up", "iotlake-maintain": "up", "sensor-sim": "up", "prometheus": "up"},
        120,
        "Prometheus to scrape ingest, maintain, the simulator and itself",
    )
    summary = deployed.finish(run)
    assert min(summary["duplicates"], summary["late"], summary["out_of_order"], summary["malformed_total"]) > 0
    wait_exact(deployed)


def _readings(d: Deployed) -> int:
    try:
        return len(read_table(d.settings, "readings", d.secrets))
    except (TableNotFoundError, OSError):
        return 0


def _while_producing(d: Deployed, fault: Callable[[], None], count: int = 30_000, rate: int = 1_000) -> None:
    """Start the simulator, let ingest commit some of it, apply the fault, then the tables must be exact."""
    before = _readings(d)
    run = d.simulate(count, rate, FAULTS)
    settle(lambda: _readings(d), lambda n: n > before, 180, "ingest to commit some of this run")
    fault()
    d.finish(run)
    wait_exact(d)


def test_sigkill_of_the_ingest_container_restarts_it_and_counts_stay_exact(deployed: Deployed) -> None:
    restarts = int(deployed.deployment.inspect("ingest", "{{.RestartCount}}"))

    def kill() -> None:
        os.kill(int(deployed.deployment.inspect("ingest", "{{.State.Pid}}")), signal.SIGKILL)  # as the OOM killer would
        settle(
            lambda: (
                deployed.deployment.inspect("ingest", "{{.RestartCount}}"),
                deployed.deployment.inspect("ingest", "{{.State.Status}}"),
            ),
            lambda got: int(got[0]) > restarts and got[1] == "running",
            120,
            "the restart policy to bring ingest back",
        )

    _while_producing(deployed, kill)
    wait_healthy(deployed)


def test_minio_down_for_30_seconds_loses_and_duplicates_nothing(deployed: Deployed) -> None:
    def outage() -> None:
        deployed.deployment.compose("stop", "minio")
        time.sleep(30)  # the outage itself: MinIO stays down this long
        deployed.deployment.compose("start", "minio")

    _while_producing(deployed, outage)
    wait_healthy(deployed)


def test_a_kafka_restart_loses_and_duplicates_nothing(deployed: Deployed) -> None:
    _while_producing(deployed, lambda: deployed.deployment.compose("restart", "kafka"))
    wait_healthy(deployed)


def test_down_and_up_from_the_same_volumes_resumes_from_the_checkpoint(deployed: Deployed) -> None:
    deployed.deployment.compose("down", "--timeout", "120")
    deployed.deployment.up(*containers.CORE_SERVICES)
    wait_healthy(deployed)
    wait_exact(deployed)  # nothing lost with the containers, nothing re-applied by the new ones
    run = deployed.simulate(10_000, 2_000, FAULTS)
    deployed.finish(run)
    wait_exact(deployed)


# --- what a container exposes --------------------------------------------------------------------------


def _project_containers(d: Deployed) -> dict[str, str]:
    """service -> container id, for every container of the project (one-shot jobs included)."""
    out = d.deployment.compose("ps", "--all", "--format", "{{.Service}} {{.ID}}").stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def _generated_secrets(d: Deployed) -> dict[str, str]:
    return {name: value for name, value in d.secrets.items() if value}


def test_no_secret_in_any_containers_command_environment_or_image_history(deployed: Deployed) -> None:
    secrets = _generated_secrets(deployed)
    assert secrets.keys() == set(compose.SECRET_VARS)
    leaks = []
    for service, cid in _project_containers(deployed).items():
        config = json.loads(
            deployed.deployment.podman_cmd("inspect", "--format", "{{json .Config}}", cid).stdout or "{}"
        )
        shown = json.dumps({k: config.get(k) for k in ("Env", "Cmd", "Entrypoint", "Labels")})
        leaks += [f"{service}: {name} in its config" for name, value in secrets.items() if value in shown]
    for image in deployed.deployment.images.env().values():
        history = deployed.deployment.podman_cmd("history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
        assert history.strip(), f"no history for {image}"
        leaks += [f"{image}: {name} in its history" for name, value in secrets.items() if value in history]
    assert leaks == []


def test_every_service_runs_as_a_non_root_user(deployed: Deployed) -> None:
    users = {}
    for service in LONG_RUNNING:
        result = deployed.deployment.podman_cmd("exec", deployed.deployment.container(service), "id", "-u")
        assert result.returncode == 0, result.stderr
        users[service] = int(result.stdout)
    assert all(uid != 0 for uid in users.values()), users


def test_ports_are_published_on_loopback_only(deployed: Deployed) -> None:
    published = {}
    for service, cid in _project_containers(deployed).items():
        ports = json.loads(
            deployed.deployment.podman_cmd("inspect", "--format", "{{json .NetworkSettings.Ports}}", cid).stdout or "{}"
        )
        for bindings in (ports or {}).values():
            for b in bindings or []:
                published[f"{service}:{b['HostPort']}"] = b["HostIp"]
    assert published and set(published.values()) == {"127.0.0.1"}, published


def test_minio_refuses_anonymous_access_from_another_container(deployed: Deployed) -> None:
    bucket = deployed.settings.storage.bucket
    probe = (
        "import urllib.request, urllib.error\n"
        f"for url in ('http://minio:9000/{bucket}', 'http://minio:9000/{bucket}/', 'http://minio:9000/{bucket}/readings/_delta_log/'):\n"
        "    try:\n"
        "        print(url, urllib.request.urlopen(url, timeout=10).status)\n"
        "    except urllib.error.HTTPError as e:\n"
        "        print(url, e.code)\n"
    )
    result = deployed.deployment.compose(
        "run", "--rm", "--no-deps", "-T", "--entrypoint", "python", "simulator", "-c", probe,
        profiles=("simulator",),
        check=False,
    )  # fmt: skip
    codes = [line.rsplit(" ", 1)[-1] for line in result.stdout.splitlines() if line.startswith("http")]
    assert len(codes) == 3 and set(codes) == {"403"}, result.stdout + result.stderr
