"""docker-compose.yml run for real on podman: healthchecks, scraping, exact counts through faults, a
down/up from the same volumes, and what a container exposes. One project for the whole module (the
`deployed` fixture); the tests run in file order and each adds to what the simulator has sent."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from deltalake.exceptions import TableNotFoundError

from streaming.core import http
from tests.deploy.conftest import Deployed
from tests.integration.lake import assert_tables_match

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
        assert_tables_match(d.settings, d.env, d.expected())
    except (AssertionError, TableNotFoundError, OSError):  # not caught up yet, or no table yet
        return False
    return True


def wait_exact(d: Deployed, timeout: float = 600) -> None:
    """Wait until the tables hold exactly what the simulator sent, then assert it (naming what differs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not _tables_match(d):
        time.sleep(2.0)
    assert_tables_match(d.settings, d.env, d.expected())


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
