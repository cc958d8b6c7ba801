"""The container deployment, for real: the images built here, podman's Docker API up, and one compose project
(every service of docker-compose.yml but Grafana) on free loopback ports, torn down with its volumes at the
end (stack.containers.scratch_deployment). `make deploy-test` runs this folder; `make test` doesn't (see the
README's deployment section)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from stack import containers
from streaming.core.config import Settings, load_settings

TOPIC = "sensor-readings"
OVERRIDES = (Path(__file__).with_name("compose.test.yml"),)


@dataclass
class Deployed:
    """The running project, what it was started with, and what the simulator has sent to it so far."""

    scratch: containers.Scratch
    settings: Settings  # the host's view: MinIO and Kafka on their published loopback ports, the reader key
    summaries: list[dict[str, Any]] = field(default_factory=list)
    seed: int = 100

    @property
    def deployment(self) -> containers.Deployment:
        return self.scratch.deployment

    @property
    def ports(self) -> dict[str, int]:
        return self.scratch.ports

    @property
    def secrets(self) -> dict[str, str]:
        return self.scratch.secrets

    def simulate(self, count: int, rate: int, faults: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        """Start the simulator: `count` messages at `rate`/s, a new seed each call. Finish with `finish`."""
        self.seed += 1
        start = datetime.now(UTC) - timedelta(minutes=30)
        return self.deployment.simulator(
            self.scratch.out,
            self.scratch.out / f"simulator-{self.seed}.log",
            "--bootstrap-servers", "kafka:19092", "--topic", TOPIC,
            "--count", str(count), "--rate", str(rate), "--seed", str(self.seed),
            "--devices", "40", "--parcels", "5", "--start-time", start.isoformat(), "--time-step-ms", "10",
            "--summary-json", f"/out/summary-{self.seed}.json", "--metrics-port", "9110", "--quiet",
            *faults,
        )  # fmt: skip

    def finish(self, run: subprocess.Popen[str], timeout: float = 600) -> dict[str, Any]:
        """Wait for a simulator run; its summary (exact counts of what Kafka acknowledged), kept for totals."""
        code = run.wait(timeout)
        log = self.scratch.out / f"simulator-{self.seed}.log"
        assert code == 0, f"simulator exited {code}:\n{log.read_text()[-3000:]}"
        summary = json.loads((self.scratch.out / f"summary-{self.seed}.json").read_text())
        self.summaries.append(summary)
        return summary

    def expected(self) -> dict[str, Any]:
        """Every run's summary as one: counts add up, each device's newest event wins."""
        return merge_summaries(self.summaries)


def merge_summaries(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of several simulator runs with distinct seeds (distinct event ids): totals add, the
    malformed kinds add, and each device's newest event is the latest (event_time, seq) of all runs."""
    merged: dict[str, Any] = {"valid_distinct": 0, "malformed_total": 0, "sent_total": 0}
    by_kind: dict[str, int] = {}
    latest: dict[str, dict[str, Any]] = {}
    for s in summaries:
        for key in ("valid_distinct", "malformed_total", "sent_total"):
            merged[key] += s[key]
        for kind, n in s["malformed_by_kind"].items():
            by_kind[kind] = by_kind.get(kind, 0) + n
        for device, newest in s["latest_by_device"].items():
            old = latest.get(device)
            if old is None or (newest["event_time"], newest["seq"]) > (old["event_time"], old["seq"]):
                latest[device] = newest
    return {**merged, "malformed_by_kind": by_kind, "latest_by_device": latest}


@pytest.fixture(scope="session")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    with containers.scratch_deployment(tmp_path_factory.mktemp("deploy"), TOPIC, OVERRIDES) as scratch:
        yield Deployed(scratch, load_settings(env={**os.environ, **scratch.host_env()}))
