"""The container deployment, for real: the images built here, podman's Docker API up, and one compose project
(every service of docker-compose.yml but Grafana) on free loopback ports, torn down with its volumes at the
end. `make deploy-test` runs this folder; `make test` doesn't (see the README's deployment section)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from stack import compose, containers
from stack.addresses import free_port
from stack.layout import StackLayout
from streaming.core.config import Settings, default_cache, load_settings

TOPIC = "sensor-readings"
OVERRIDES = (Path(__file__).with_name("compose.test.yml"),)


@dataclass
class Deployed:
    """The running project, what it was started with, and what the simulator has sent to it so far."""

    deployment: containers.Deployment
    ports: dict[str, int]
    env_file: Path
    env: dict[str, str]  # the env file's values
    secrets: dict[str, str]  # every generated secret, by name
    settings: Settings  # the host's view: MinIO and Kafka on their published loopback ports
    out: Path  # a folder the simulator's one-off containers write their summaries into
    summaries: list[dict[str, Any]] = field(default_factory=list)
    seed: int = 100

    def simulate(self, count: int, rate: int, faults: tuple[str, ...] = ()) -> subprocess.Popen[str]:
        """Start the simulator profile's container as a one-off run (with the service's network alias, so
        Prometheus scrapes it): `count` messages at `rate`/s, a new seed each call. Finish with `finish`."""
        self.seed += 1
        start = datetime.now(UTC) - timedelta(minutes=30)
        argv = self.deployment.argv(
            "run", "--rm", "--no-deps", "--use-aliases", "-T",
            "-v", f"{self.out}:/out",
            "simulator",
            "sensor-sim", "--bootstrap-servers", "kafka:19092", "--topic", TOPIC,
            "--count", str(count), "--rate", str(rate), "--seed", str(self.seed),
            "--devices", "40", "--parcels", "5", "--start-time", start.isoformat(), "--time-step-ms", "10",
            "--summary-json", f"/out/summary-{self.seed}.json", "--metrics-port", "9110", "--quiet",
            *faults,
            profiles=("simulator",),
        )  # fmt: skip
        env = containers.compose_env(self.deployment.podman, self.deployment.images)
        log = (self.out / f"simulator-{self.seed}.log").open("w")
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)

    def finish(self, run: subprocess.Popen[str], timeout: float = 600) -> dict[str, Any]:
        """Wait for a simulator run; its summary (exact counts of what Kafka acknowledged), kept for totals."""
        code = run.wait(timeout)
        log = self.out / f"simulator-{self.seed}.log"
        assert code == 0, f"simulator exited {code}:\n{log.read_text()[-3000:]}"
        summary = json.loads((self.out / f"summary-{self.seed}.json").read_text())
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
    home = tmp_path_factory.mktemp("deploy")
    layout = StackLayout(home=home, cache=default_cache())
    podman = containers.Podman.at(layout)
    containers.install_tools()
    containers.write_conf(podman)
    images = containers.build_images(podman, layout)
    env_file = home / "deploy.env"
    compose.write_env(env_file)
    used: set[int] = set()
    ports = {}
    for name in ("MINIO_API_PORT", "MINIO_CONSOLE_PORT", "KAFKA_HOST_PORT", "PROMETHEUS_PORT"):
        ports[name] = free_port(used)
        used.add(ports[name])
    with env_file.open("a") as f:  # later lines win
        f.write("".join(f"{k}={v}\n" for k, v in ports.items()))
        f.write(f"KAFKA_TOPIC={TOPIC}\n")
    env = compose.parse_env(env_file.read_text())
    secrets = compose.read_secret_files(compose.secrets_dir(env_file))
    out = home / "out"
    out.mkdir()
    out.chmod(0o777)  # the simulator's containers run as uid 10001
    settings = load_settings(
        env={
            **os.environ,
            "IOTLAKE_STORAGE__ENDPOINT": f"http://127.0.0.1:{ports['MINIO_API_PORT']}",
            "IOTLAKE_STORAGE__ACCESS_KEY": secrets["IOTLAKE_READER_ACCESS_KEY"],
            "IOTLAKE_STORAGE__SECRET_KEY": secrets["IOTLAKE_READER_SECRET_KEY"],
            "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{ports['KAFKA_HOST_PORT']}",
            "IOTLAKE_KAFKA__TOPIC": TOPIC,
        }
    )
    project = f"iotlake-test-{uuid.uuid4().hex[:8]}"
    deployment = containers.Deployment(layout, podman, project, env_file, images, OVERRIDES)
    with containers.api_service(podman), containers.health_ticker(podman, project):
        try:
            deployment.up(*containers.CORE_SERVICES)
            yield Deployed(deployment, ports, env_file, env, secrets, settings, out)
        finally:
            logs = deployment.compose("logs", "--no-color", "--timestamps", check=False, profiles=("simulator",))
            (home / "compose.log").write_text(logs.stdout + logs.stderr)
            print(f"compose logs: {home / 'compose.log'}; down: {shlex.join(deployment.argv('down'))}")
            deployment.down(volumes=True)
