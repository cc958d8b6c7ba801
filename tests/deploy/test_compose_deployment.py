"""docker-compose.yml run for real on podman: healthchecks, scraping, exact counts through faults, a
down/up from the same volumes, and what a container exposes. One project for the whole module (the
`deployed` fixture); the tests run in file order and each adds to what the simulator has sent."""

from __future__ import annotations

import json
import operator
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from stack import compose, containers
from streaming.core import http
from streaming.core.prometheus import samples
from streaming.core.storage import delta_rs_uri
from tests.deploy.conftest import TOPIC, Deployed
from tests.integration.lake import assert_tables_match, read_table, reader_options

T = TypeVar("T")

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

FAULTS = ("--duplicate-rate", "0.05", "--out-of-order-rate", "0.05", "--late-rate", "0.05", "--malformed-rate", "0.04")
LONG_RUNNING = ("minio", "kafka", "ingest", "maintain", "prometheus")
TABLES = ("readings", "quarantine", "device_state")


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


def test_the_job_starts_from_its_image_with_no_route_to_any_registry(deployed: Deployed, offline_network: str) -> None:
    """The app image runs the job on a network that reaches Kafka and MinIO only (read-only root, as in compose):
    the baked-in jars and log store are all it needs. It reads the topic from the start into a new prefix, which
    then holds exactly what the simulator sent."""
    image = deployed.deployment.images.app
    reach = (
        "import socket\n"
        "for h in ('repo1.maven.org', 'pypi.org'):\n"
        "    try:\n"
        "        socket.create_connection((h, 443), 5)\n"
        "        print(h, 'reached')\n"
        "    except OSError as e:\n"
        "        print(h, 'unreachable:', e)\n"
    )
    cut = deployed.deployment.podman_cmd("run", "--rm", "--network", offline_network, image, "python", "-c", reach)
    verdicts = {line.split()[0]: line.split()[1] for line in cut.stdout.splitlines() if line.strip()}
    assert verdicts == {"repo1.maven.org": "unreachable:", "pypi.org": "unreachable:"}, cut.stdout + cut.stderr
    prefix = f"offline-{uuid.uuid4().hex[:8]}"
    base_uri = f"s3a://{deployed.settings.storage.bucket}/{prefix}"
    writer = compose.secrets_dir(deployed.scratch.env_file) / "writer.env"
    env = {
        "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": "kafka:19092",
        "IOTLAKE_KAFKA__TOPIC": TOPIC,
        "IOTLAKE_STORAGE__ENDPOINT": "http://minio:9000",
        "IOTLAKE_STORAGE__SECRETS_FILE": "/run/secrets/writer.env",
        "IOTLAKE_STORAGE__BASE_URI": base_uri,
        "IOTLAKE_INGEST__CHECKPOINT_LOCATION": "/tmp/checkpoint",
        "IOTLAKE_INGEST__METRICS_PORT": "0",
        "IOTLAKE_SPARK__MASTER": "local[2]",
        "IOTLAKE_SPARK__PREINSTALLED_JARS": "true",
    }
    argv = ["run", "--rm", "--network", offline_network, "--read-only", "--tmpfs", "/tmp:size=2g,mode=1777"]
    argv += ["-v", f"{writer}:/run/secrets/writer.env:ro"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    job = deployed.deployment.podman_cmd(*argv, image, "iotlake", "ingest", "--available-now", timeout=900)
    assert job.returncode == 0, (job.stdout + job.stderr)[-4000:]
    offline = replace(deployed.settings, storage=replace(deployed.settings.storage, base_uri=base_uri))
    assert_tables_match(offline, deployed.secrets, deployed.expected())


def _readings(d: Deployed) -> int:
    try:
        return len(read_table(d.settings, "readings", d.secrets))
    except (TableNotFoundError, OSError):
        return 0


def _while_producing(d: Deployed, fault: Callable[[], object], count: int = 30_000, rate: int = 1_000) -> None:
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


def _optimizing(d: Deployed) -> bool:
    """Whether the sidecar runs an OPTIMIZE right now (its iot_maintenance_in_progress, read inside its container)."""
    probe = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9109/metrics', timeout=5).read().decode())"
    result = d.deployment.podman_cmd("exec", d.deployment.container("maintain"), "python", "-c", probe)
    if result.returncode != 0:
        return False
    shown = samples(result.stdout)
    return any(v == 1 for k, v in shown.items() if k.startswith("iot_maintenance_in_progress{operation=optimize,"))


def _optimize_commits_since(d: Deployed, since: float) -> int:
    """OPTIMIZE commits of every table at or after `since` (Unix seconds), from the tables' logs."""
    count = 0
    for name in TABLES:
        uri = delta_rs_uri(d.settings.storage.table_uri(name))
        try:
            history = DeltaTable(uri, storage_options=reader_options(d.settings, d.secrets)).history(limit=200)
        except TableNotFoundError:
            continue
        count += sum(1 for c in history if c.get("operation") == "OPTIMIZE" and c["timestamp"] >= since * 1000)
    return count


def test_a_sidecar_killed_mid_optimize_loses_and_duplicates_nothing_and_compacts_again(deployed: Deployed) -> None:
    """SIGKILL of the sidecar while its OPTIMIZE runs (compose.test.yml makes it compact every few batches): the
    restart policy brings it back, the tables stay exact, and the next cycle compacts again."""
    interrupted: list[float] = []

    def kill_mid_optimize() -> None:
        for _ in range(5):  # an OPTIMIZE that commits between the check and the kill doesn't count; try again
            settle(lambda: _optimizing(deployed), bool, 600, "the sidecar to start an OPTIMIZE")
            checked = time.time()
            restarts = int(deployed.deployment.inspect("maintain", "{{.RestartCount}}"))
            os.kill(int(deployed.deployment.inspect("maintain", "{{.State.Pid}}")), signal.SIGKILL)
            settle(
                lambda: int(deployed.deployment.inspect("maintain", "{{.RestartCount}}")),
                partial(operator.lt, restarts),  # restarts < the count now
                120,
                "the restart policy to bring the sidecar back",
            )
            if _optimize_commits_since(deployed, checked) == 0:
                interrupted.append(checked)
                return
        raise AssertionError("every OPTIMIZE committed before the kill reached it; none was interrupted")

    _while_producing(deployed, kill_mid_optimize, count=240_000, rate=2_000)
    wait_healthy(deployed)
    settle(
        lambda: _optimize_commits_since(deployed, interrupted[0]),
        lambda n: n > 0,
        300,
        "the restarted sidecar to commit an OPTIMIZE",
    )
    wait_exact(deployed)  # after its OPTIMIZE too: compaction changed no row


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


@pytest.fixture
def offline_network(deployed: Deployed) -> Iterator[str]:
    """An internal podman network (no route beyond it) on which the project's Kafka and MinIO answer by name."""
    name = f"{deployed.deployment.project}-offline-{uuid.uuid4().hex[:6]}"
    created = deployed.deployment.podman_cmd("network", "create", "--internal", name)
    assert created.returncode == 0, created.stderr
    try:
        for service in ("kafka", "minio"):
            joined = deployed.deployment.podman_cmd(
                "network", "connect", "--alias", service, name, deployed.deployment.container(service)
            )
            assert joined.returncode == 0, joined.stderr
        yield name
    finally:
        for service in ("kafka", "minio"):
            deployed.deployment.podman_cmd("network", "disconnect", name, deployed.deployment.container(service))
        deployed.deployment.podman_cmd("network", "rm", "--force", name)


# Services whose image writes outside its volumes (docker-compose.yml's x-read-only; apache/kafka renders its
# configuration into /opt/kafka/config at start).
WRITABLE_ROOT = {"kafka", "kafka-init"}


def test_every_other_container_has_a_read_only_root(deployed: Deployed) -> None:
    inspect = deployed.deployment.podman_cmd
    flags = {
        service: inspect("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", cid).stdout.strip()
        for service, cid in _project_containers(deployed).items()
    }
    assert {s: f for s, f in flags.items() if s not in WRITABLE_ROOT} == {
        s: "true" for s in flags if s not in WRITABLE_ROOT
    }
    for service in ("ingest", "maintain", "minio", "prometheus"):
        wrote = deployed.deployment.podman_cmd("exec", deployed.deployment.container(service), "touch", "/probe")
        assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr, (service, wrote.stderr)


def _files_holding(root: Path, values: dict[str, str]) -> list[str]:
    """Files under `root` (not following links) that contain any of the values; 'path: NAME' for each."""
    wanted = {name: value.encode() for name, value in values.items()}
    found = []
    for folder, _, files in os.walk(root):
        for file in files:
            path = Path(folder, file)
            if path.is_symlink() or not path.is_file():
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            found += [f"{path.relative_to(root)}: {name}" for name, value in wanted.items() if value in data]
    return found


def test_no_generated_secret_in_any_image_file(deployed: Deployed) -> None:
    """Every file of every image the project runs, searched for each generated value (the history test above
    covers the build's commands)."""
    secrets = _generated_secrets(deployed)
    leaks = []
    for image in set(deployed.deployment.images.env().values()):
        mounted = deployed.deployment.podman_cmd("image", "mount", image)
        assert mounted.returncode == 0, mounted.stderr
        try:
            root = Path(mounted.stdout.strip())
            assert (root / "etc").is_dir(), f"{image} mounted at {root} without its files"
            leaks += [f"{image} {hit}" for hit in _files_holding(root, secrets)]
        finally:
            deployed.deployment.podman_cmd("image", "unmount", image)
    assert leaks == []
