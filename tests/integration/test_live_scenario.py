"""One live scenario on the test stack: `iotlake ingest` fed by `sensor-sim --metrics-port` (with faults, so
quarantine and duplicate series exist), and a sidecar (`iotlake maintain`) compacting aggressively beside it, all
scraped by the test stack's real Prometheus. Two things are checked on it, in this order:

- every Grafana panel's query returns at least one finite value; a panel whose metric no metrics module defines
  (the job's, the sidecar's, the simulator's) fails, naming it. Nothing is skipped;
- the stream keeps committing through ten sidecar cycles, and once the simulator stops, the tables hold exactly
  what it sent (last in the module: it stops the simulator).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil
import pytest
import yaml

from monitoring.grafana import build
from stack import ensure_topic
from stack import prometheus as prom
from stack.addresses import free_port
from stack.layout import StackLayout
from streaming.core.config import PROJECT_ROOT, Settings, load_settings
from streaming.core.prometheus import scrape
from streaming.pipeline import warmup
from tests.helpers import wait_for
from tests.integration.lake import assert_tables_match

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOW = "1m"  # what $__rate_interval becomes: 12 scrapes at the test stack's 5 s interval
READY_TIMEOUT_S = 900.0  # the sidecar needs two cycles (health is measured before it acts) and 10 commits
RULES = PROJECT_ROOT / "monitoring" / "rules" / "iotlake.yml"
TABLES = ("readings", "device_state", "quarantine")


@dataclass
class Scraped:
    """The running exporters and the Prometheus that scrapes them."""

    prometheus: str
    settings: Settings
    ports: dict[str, int]  # metrics port by process name
    summary: Path  # the simulator's summary JSON, written when it stops
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def tails(self) -> str:
        return "\n".join(f"--- {name} log\n{_tail(path)}" for name, path in self.logs.items())


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def query(base: str, expr: str) -> dict[str, Any]:
    """GET /api/v1/query; the decoded answer, also for errors (400 and 422 carry a JSON error)."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            answer: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as e:
        answer = json.loads(e.read() or b"{}") or {"status": "error", "error": f"HTTP {e.code}"}
    return answer


def problem(base: str, expr: str) -> str | None:
    """Why a panel query would show nothing (an error, no series, only NaN), or None if it has data."""
    answer = query(base, build.concrete(expr, WINDOW))
    if answer.get("status") != "success":
        return f"error: {answer.get('errorType')}: {answer.get('error')}"
    result = answer["data"]["result"]
    values = [sample["value"][1] for sample in result] if answer["data"]["resultType"] == "vector" else []
    if answer["data"]["resultType"] == "scalar":
        values = [result[1]]
    if not values:
        return "no data"
    if not any(math.isfinite(float(v)) for v in values):
        return f"only NaN/Inf: {values}"
    return None


def panel_targets() -> list[Any]:
    params = []
    for file, dashboard in build.committed().items():
        for panel, target in build.targets(dashboard):
            params.append(pytest.param(target["expr"], id=f"{file}:{panel['title']}:{target['refId']}"))
    return params


def _undefined_metrics(expr: str) -> list[str]:
    """The metrics a panel query reads that no metrics module defines."""
    return sorted(build.metric_names(expr) - {"up"} - build.defined_metric_names())


def _start(name: str, argv: list[str], env: dict[str, str], logs: Path, scraped: Scraped) -> None:
    log = logs / f"{name}.log"
    handle: IO[bytes] = log.open("wb")
    scraped.processes[name] = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env)
    handle.close()
    scraped.logs[name] = log


@pytest.fixture(scope="module")
def scraped(
    stack_env: dict[str, str], stack_layout: StackLayout, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scraped]:
    """ingest + simulator + sidecar running against a fresh topic and prefix, scraped by the test Prometheus.

    The sidecar cycles every 2 s and compacts even the open partition. The stream takes whatever has arrived: with a
    cap per batch near the simulator's rate it fell behind while the sidecar compacted, and took minutes to drain.
    """
    work = tmp_path_factory.mktemp("live-scenario")
    uid = uuid.uuid4().hex[:12]
    base = {**os.environ, **stack_env}
    bucket = load_settings(env=base).storage.bucket
    ingest_port = free_port()
    env = {
        **base,
        "IOTLAKE_STORAGE__BASE_URI": f"s3a://{bucket}/tests/{uid}",
        "IOTLAKE_KAFKA__TOPIC": f"test-{uid}",
        "IOTLAKE_KAFKA__PARTITIONS": "3",
        "IOTLAKE_INGEST__CHECKPOINT_LOCATION": str(work / "checkpoint"),
        "IOTLAKE_INGEST__METRICS_PORT": str(ingest_port),
        "IOTLAKE_INGEST__TRIGGER_INTERVAL": "2 seconds",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])),
    }
    sim_port = free_port({ingest_port})
    sidecar_port = free_port({ingest_port, sim_port})
    env |= {  # a sidecar that compacts eagerly, so that every maintenance series exists
        "IOTLAKE_MAINTENANCE__METRICS_PORT": str(sidecar_port),
        "IOTLAKE_MAINTENANCE__INTERVAL": "2 seconds",
        "IOTLAKE_MAINTENANCE__MIN_SMALL_FILES": "2",
        "IOTLAKE_MAINTENANCE__OPEN_PARTITION_MIN_SMALL_FILES": "4",
        "IOTLAKE_MAINTENANCE__RETRY_BACKOFF": "1 second",
        "IOTLAKE_MAINTENANCE__MAX_BACKOFF": "4 seconds",
    }
    settings: Settings = load_settings(env=env)
    ensure_topic(settings)
    ports = {"ingest": ingest_port, "sensor-sim": sim_port, "maintain": sidecar_port}
    scraped = Scraped(prometheus=prom.url(settings), settings=settings, ports=ports, summary=work / "summary.json")
    targets = {
        "iotlake-ingest": [f"127.0.0.1:{ingest_port}"],
        "iotlake-maintain": [f"127.0.0.1:{sidecar_port}"],
        "sensor-sim": [f"127.0.0.1:{sim_port}"],
        "prometheus": [str(prom.address(settings))],
    }
    prom.write_targets(stack_layout, targets)
    try:
        _start("ingest", [sys.executable, "-m", "streaming.cli", "ingest"], env, work, scraped)
        sim_argv = [
            sys.executable, "-m", "producers",
            "--bootstrap-servers", settings.kafka.bootstrap_servers,
            "--topic", settings.kafka.topic,
            "--rate", "100", "--duration", "3600", "--devices", "20", "--parcels", "4",
            "--duplicate-rate", "0.05", "--malformed-rate", "0.05", "--late-rate", "0.02", "--quiet",
            "--metrics-port", str(sim_port), "--seed", "1", "--summary-json", str(scraped.summary),
        ]  # fmt: skip
        _start("sensor-sim", sim_argv, env, work, scraped)
        _start("maintain", [sys.executable, "-m", "streaming.cli", "maintain"], env, work, scraped)
        yield scraped
    finally:
        for process in scraped.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in scraped.processes.values():
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        prom.write_targets(stack_layout, prom.native_targets(load_settings(env=base)))


@dataclass(frozen=True)
class SidecarStart:
    """The job's and the sidecar's counters when the sidecar first measured readings: the ten cycles count from
    here, so they overlap the panels' wait (a sidecar's cycles before it saw the table compact nothing)."""

    cycles: float
    batches: float


@pytest.fixture(scope="module")
def sidecar_start(scraped: Scraped) -> SidecarStart:
    """Wait (with a deadline) until the sidecar has measured readings; the counters at that point."""

    def measured_readings() -> bool:
        _alive(scraped)
        return "iot_table_version{table=readings}" in _scrape(scraped.ports["maintain"])

    try:
        wait_for(measured_readings, 900, 1.0, "the sidecar to measure readings")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{scraped.tails()}") from None
    cycles = _scrape(scraped.ports["maintain"]).get("iot_maintenance_cycles_total", 0.0)
    return SidecarStart(cycles, _scrape(scraped.ports["ingest"]).get("iot_ingest_batches_total", 0.0))


@pytest.fixture(scope="module")
def settled(scraped: Scraped, sidecar_start: SidecarStart) -> Scraped:
    """Wait (with a deadline) until every target is up and every runnable panel query has data."""
    expected_jobs = {"iotlake-ingest", "iotlake-maintain", "sensor-sim", "prometheus"}
    # A query on an undefined metric can never have data: test_panel_query_returns_data fails it by name,
    # without making every other test wait out the deadline first.
    runnable = [p.values[0] for p in panel_targets() if not _undefined_metrics(p.values[0])]

    def waiting_for() -> list[str]:
        for name, process in scraped.processes.items():
            if process.poll() is not None and name != "sensor-sim":
                raise AssertionError(f"{name} exited with {process.returncode}\n{scraped.tails()}")
        up = query(scraped.prometheus, "up == 1")
        jobs = {s["metric"]["job"] for s in up.get("data", {}).get("result", [])}
        waiting = [f"target {job} not up" for job in sorted(expected_jobs - jobs)]
        for expr in runnable:
            if why := problem(scraped.prometheus, expr):
                waiting.append(f"{expr}: {why}")
            else:
                first_data.setdefault(expr, time.monotonic() - started)
        return waiting

    started = time.monotonic()
    first_data: dict[str, float] = {}  # when each query first had data: the last ones set the fixture's time
    last: list[str] = []

    def check() -> bool:
        nonlocal last
        last = waiting_for()
        return not last

    try:
        wait_for(check, READY_TIMEOUT_S, interval=5, message="every panel query to return data")
    except AssertionError as e:
        raise AssertionError(f"{e}\nstill waiting for: {last}\n{scraped.tails()}") from None
    print(f"all panel queries had data after {time.monotonic() - started:.0f} s; the last:")
    for expr, seconds in sorted(first_data.items(), key=lambda item: -item[1])[:5]:
        print(f"  {seconds:5.0f} s  {expr}")
    return scraped


@pytest.mark.parametrize("expr", panel_targets())
def test_panel_query_returns_data(settled: Scraped, expr: str) -> None:
    undefined = _undefined_metrics(expr)
    assert not undefined, f"{expr}: reads {undefined}, defined in no metrics module"
    assert problem(settled.prometheus, expr) is None, (
        f"{build.concrete(expr, WINDOW)}: {problem(settled.prometheus, expr)}"
    )


def test_a_broken_panel_query_is_reported(settled: Scraped) -> None:
    """Negative control: the check above fails for a syntax error, an unknown metric and a NaN-only result."""
    assert (problem(settled.prometheus, "sum(rate(iot_ingest_input_rows_total[$__rate_interval])") or "").startswith(
        "error: bad_data"
    )
    assert problem(settled.prometheus, "sum(rate(iot_ingest_input_rowz_total[$__rate_interval]))") == "no data"
    assert (problem(settled.prometheus, "iot_ingest_query_up / 0 - iot_ingest_query_up / 0") or "").startswith(
        "only NaN"
    )


def test_every_alert_rule_is_loaded_and_healthy(settled: Scraped) -> None:
    expected = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    with urllib.request.urlopen(f"{settled.prometheus}/api/v1/rules?type=alert", timeout=10) as response:
        groups = json.load(response)["data"]["groups"]
    rules = {rule["name"]: rule for group in groups for rule in group["rules"]}
    assert set(rules) == expected
    unhealthy = {name: rule.get("lastError") for name, rule in rules.items() if rule["health"] != "ok"}
    assert unhealthy == {}


def _scrape(port: int) -> dict[str, float]:
    return scrape(f"http://127.0.0.1:{port}/metrics", timeout=5)


def _alive(scraped: Scraped) -> None:
    for name in ("ingest", "maintain"):
        process = scraped.processes[name]
        assert process.poll() is None, f"{name} exited {process.returncode}\n{scraped.tails()}"


def test_stream_keeps_running_through_ten_sidecar_cycles(
    scraped: Scraped, sidecar_start: SidecarStart, stack_secrets: dict[str, str]
) -> None:
    """The stream and a sidecar compacting aggressively (even the open partition) write the same tables while the
    simulator sends: no batch fails, conflicts are counted not fatal, the stream commits through ten sidecar cycles,
    and once the simulator stops the tables hold exactly what it sent. Last in the module: it stops the simulator."""
    settings, procs = scraped.settings, scraped.processes
    ingest_port, maintain_port = scraped.ports["ingest"], scraped.ports["maintain"]

    def reached(port: int, name: str, target: float) -> bool:
        _alive(scraped)
        return _scrape(port).get(name, 0.0) >= target

    try:
        # The sidecar and its JVM run at maintenance.niceness, below the stream: a compaction takes the CPU the
        # stream leaves.
        sidecar, stream = psutil.Process(procs["maintain"].pid), psutil.Process(procs["ingest"].pid)
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert {p.nice() for p in [sidecar, *sidecar.children(recursive=True)]} == {settings.maintenance.niceness}
        assert {p.nice() for p in [stream, *stream.children(recursive=True)]} == {base}
        ten_cycles = sidecar_start.cycles + 10
        wait_for(lambda: reached(maintain_port, "iot_maintenance_cycles_total", ten_cycles), 1200, 1.0, "ten cycles")
        batches = _scrape(ingest_port)["iot_ingest_batches_total"]
        simulator = procs["sensor-sim"]
        simulator.terminate()  # it flushes, then writes its summary of what Kafka acknowledged
        assert simulator.wait(120) in (0, 130), scraped.tails()
        summary = json.loads(scraped.summary.read_text())
        sent = summary["sent_total"]
        wait_for(lambda: reached(ingest_port, "iot_ingest_input_rows_total", sent), 900, 1.0, f"all {sent} messages")
        _alive(scraped)
        ingest, maintain = _scrape(ingest_port), _scrape(maintain_port)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{scraped.tails()}") from e
    procs["ingest"].terminate()
    assert procs["ingest"].wait(120) == 0, scraped.tails()
    assert ingest["iot_ingest_query_up"] == 1
    # The job started as `make run` starts it: with the warm-up batch first (the other tests' jobs skip it).
    assert f"warm-up batch of {warmup.MESSAGES} messages into scratch tables" in scraped.logs["ingest"].read_text()
    # The stream kept committing while the sidecar cycled (a 2-second trigger; ten cycles take far longer).
    assert batches - sidecar_start.batches >= 8, (sidecar_start, batches)
    assert maintain.get("iot_maintenance_files_compacted_total", 0.0) > 0, "the sidecar never compacted"
    assert maintain.get("iot_maintenance_failures_total", 0.0) == 0, scraped.tails()
    # VACUUM is due once a day: at most once per table in this run (a table backing off after a conflict may
    # not get its turn), never every cycle; and on these fresh tables, where it could delete nothing, not run.
    vacuums = [maintain.get(f"iot_maintenance_runs_total{{operation=vacuum,table={t}}}", 0) for t in TABLES]
    skipped = [maintain[f"iot_maintenance_vacuum_skipped_total{{table={t}}}"] for t in TABLES]
    assert vacuums == [0, 0, 0] and max(skipped) == 1, (vacuums, skipped)
    assert_tables_match(settings, stack_secrets, summary)
    # Every metric the sidecar names is exported, with a plausible value.
    for name in ("iot_table_files", "iot_table_bytes", "iot_table_rows", "iot_table_version"):
        assert maintain[f"{name}{{table=readings}}"] > 0, name
    assert 0 <= maintain["iot_table_small_file_ratio{table=readings}"] <= 1
    assert 0 <= maintain["iot_table_last_commit_age_seconds{table=readings}"] < 600
    assert maintain["iot_table_rows_inserted_total{table=readings}"] > 0
