"""`make run`: the whole pipeline live on the native stack (Kafka, MinIO, ingest, sidecar, simulator), then a
summary with the tables before and after a final compaction.

The ingest job and the sidecar run under a supervisor (stack.supervise): a dead one is restarted with
backoff, and too many deaths within a window end the run with exit 1, naming the log. Every log the run
writes or the stack's services write is rotated by size while it runs (stack.logrotate).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stack import api, logkeeper, logrotate, proc
from stack import prometheus as prom
from stack.layout import StackLayout
from stack.supervise import GaveUp, RestartPolicy, SupervisedChild, Supervisor
from streaming.core.catalog import lake_tables, resolve_table
from streaming.core.config import Settings, load_settings
from streaming.core.errors import StackError, first_line
from streaming.core.prometheus import scrape
from streaming.lake.health import Commit
from streaming.lake.lakelog import commits_since, open_table
from streaming.lake.status import stream_status, table_status

REFRESH_S = 2.0
DRAIN_POLL_S = 0.5  # the drain is timed at this resolution
INGEST_START_TIMEOUT_S = 300.0
DRAIN_TIMEOUT_S = 180.0
SIDECAR_INTERVAL = "30 seconds"  # the demo's sidecar measures (and compacts what crossed a bar) this often
DEMO_FAULT_RATES = {"duplicate": 0.02, "out-of-order": 0.02, "late": 0.01, "malformed": 0.01}
DEMO_FAULTS = tuple(arg for kind, rate in DEMO_FAULT_RATES.items() for arg in (f"--{kind}-rate", str(rate)))


INGEST_ARGV = (sys.executable, "-m", "streaming.cli", "ingest")
SIDECAR_ARGV = (sys.executable, "-m", "streaming.cli", "maintain")


@dataclass
class Child:
    """A finite process `make run` started (the simulator), with its log file (appended, rotated)."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout: float = 60.0) -> int | None:
        return proc.stop_child(self.process, timeout)

    def tail(self, lines: int = 15) -> str:
        return proc.tail(self.log, lines)


@dataclass
class Timeline:
    """What a newcomer watches in `make run`: how soon readings are queryable, how far the stream lags behind the
    simulator, and how long it drains once the simulator stops."""

    rate: int
    trigger_s: float
    sim_started_ms: int = 0  # wall clock (epoch ms) when the simulator was started: it sends at once
    readings_version: int | None = None  # readings' version just before that: later commits are this run's
    first_readings_s: float | None = None
    peak_lag: int = 0
    drain_s: float | None = None

    def lines(self) -> list[str]:
        first = (
            f"first readings committed {self.first_readings_s:.1f} s after the simulator started"
            if self.first_readings_s is not None
            else "no readings committed during this run"
        )
        interval = max(self.rate * self.trigger_s, 1.0)
        lag = (
            f"peak lag {self.peak_lag:,} messages ({self.peak_lag / interval:.1f} trigger intervals' worth at "
            f"{self.rate:,}/s and {self.trigger_s:g} s; sampled every {REFRESH_S:g} s)"
        )
        drain = (
            f"drained {self.drain_s:.1f} s after the simulator stopped (checked every {DRAIN_POLL_S:g} s)"
            if self.drain_s is not None
            else f"not drained within {DRAIN_TIMEOUT_S:.0f} s of the simulator stopping"
        )
        return [first, lag, drain]


def first_insert_after(commits: Iterable[Commit], since_ms: int) -> float | None:
    """Seconds from since_ms to the first commit after it that inserted rows (the stream's MERGE; not the
    sidecar's OPTIMIZE, not a MERGE that found only duplicates)."""
    stamps = [
        c.timestamp_ms
        for c in commits
        if c.timestamp_ms >= since_ms and c.operation == "MERGE" and c.metrics.get("numTargetRowsInserted", 0) > 0
    ]
    return (min(stamps) - since_ms) / 1000 if stamps else None


def _first_readings_s(settings: Settings, timeline: Timeline) -> float | None:
    """From the readings table's own commit timestamps: its commits since the simulator started."""
    commits = commits_since(settings, resolve_table(settings, "readings").uri, timeline.readings_version)
    return first_insert_after(commits, timeline.sim_started_ms)


def _spawn(name: str, argv: list[str], layout: StackLayout, env: dict[str, str]) -> Child:
    log = layout.log(name)
    return Child(name, proc.spawn(name, argv, log, env), log)


def supervisor(
    settings: Settings,
    layout: StackLayout,
    env: dict[str, str],
    policy: RestartPolicy | None = None,
    rotation: logrotate.RotationPolicy | None = None,
) -> tuple[Supervisor, SupervisedChild]:
    """The supervisor of the ingest job (and the sidecar, if maintenance.enabled), not started yet; it also
    rotates the simulator's and the services' logs. Returns it and the ingest child."""
    ingest = SupervisedChild("ingest", INGEST_ARGV, env, layout.log("ingest"), policy)
    children = [ingest]
    if settings.maintenance.enabled:
        sidecar_env = {"IOTLAKE_MAINTENANCE__INTERVAL": SIDECAR_INTERVAL, **env}
        children.append(SupervisedChild("maintain", SIDECAR_ARGV, sidecar_env, layout.log("maintain"), policy))
    others = [layout.log("sensor-sim"), *logkeeper.service_logs(layout)]
    return Supervisor(children, rotation, other_logs=others), ingest


def _report(events: list[str]) -> None:
    for event in events:
        print(event, file=sys.stderr, flush=True)


def _table_versions(settings: Settings) -> dict[str, int | None]:
    """Each table's version (None: not created yet)."""
    out: dict[str, int | None] = {}
    for table in lake_tables(settings):
        delta = open_table(settings, table.uri)
        out[table.name] = None if delta is None else delta.version()
    return out


def _wait_for_ingest(sup: Supervisor, ingest: SupervisedChild, metrics_url: str) -> None:
    """Until the job's query is up. A death on the way is the supervisor's (restart or GaveUp); the start-up
    deadline counts from the latest (re)start."""
    while True:
        _report(sup.tick())
        if ingest.pid is not None and scrape(metrics_url).get("iot_ingest_query_up") == 1.0:
            return
        since = ingest.clock() - (ingest.started_at or ingest.clock())
        if ingest.pid is not None and since > INGEST_START_TIMEOUT_S:
            raise StackError(f"the streaming job did not start within {INGEST_START_TIMEOUT_S:.0f} s; see {ingest.log}")
        time.sleep(0.5)


def _sidecar_text(sidecar: dict[str, float]) -> str:
    if not sidecar:
        return "sidecar -"
    return (
        f"sidecar cycles {int(sidecar.get('iot_maintenance_cycles_total', 0))} "
        f"compacted {int(sidecar.get('iot_maintenance_files_compacted_total', 0))} files, "
        f"readings {int(sidecar.get('iot_table_files{table=readings}', 0))} files "
        f"({int(sidecar.get('iot_table_small_files{table=readings}', 0))} small)"
    )


def _live_line(
    started: float,
    settings: Settings,
    metrics: dict[str, float],
    last: dict[str, Any],
    sup: Supervisor,
    timeline: Timeline,
) -> str:
    stream = stream_status(settings)
    timeline.peak_lag = max(timeline.peak_lag, stream.total_lag)
    produced = sum(stream.latest_offsets.values())
    now = time.monotonic()
    rate = (produced - last.get("produced", 0)) / max(now - last.get("at", started), 1e-6)
    last.update(produced=produced, at=now)
    versions = _table_versions(settings)
    shown = " ".join(f"{name}=v{v if v is not None else '-'}" for name, v in versions.items())
    return (
        f"[{now - started:6.0f}s] produced {produced:>9,} ({rate:>8,.0f}/s)  "
        f"readings +{int(metrics.get('iot_ingest_merged_rows_total{kind=inserted,table=readings}', 0)):>9,}  "
        f"quarantined {int(metrics.get('iot_ingest_quarantined_rows_total', 0)):>6,}  "
        f"lag {stream.total_lag:>7,}  batches {int(metrics.get('iot_ingest_batches_total', 0)):>4}  {shown}  "
        + _sidecar_text(scrape(_sidecar_url(settings)))
        + (f"  {deaths}" if (deaths := sup.deaths_text()) else "")
    )


def _sidecar_url(settings: Settings) -> str:
    return f"http://{settings.maintenance.metrics_host}:{settings.maintenance.metrics_port}/metrics"


def _quarantine_by_reason(settings: Settings) -> Counter[str]:
    table = open_table(settings, resolve_table(settings, "quarantine").uri)
    if table is None:
        return Counter()
    return Counter(table.to_pyarrow_table(columns=["reason"]).column("reason").to_pylist())


def run_pipeline(
    settings: Settings,
    layout: StackLayout,
    duration: float,
    rate: int,
    devices: int,
    policy: RestartPolicy | None = None,
    rotation: logrotate.RotationPolicy | None = None,
) -> int:
    """Start everything, show it live, stop after `duration` seconds (or Ctrl-C / SIGTERM), drain, summarize.

    The ingest job and the sidecar are restarted by `policy` when they die; 1 if it gave up (or the job failed).
    """
    api.up(settings, layout)
    settings = load_settings(settings.source)  # picks up the writer's keys generated by `up`
    metrics_url = f"http://{settings.ingest.metrics_host}:{settings.ingest.metrics_port}/metrics"
    env = dict(os.environ)
    summary_path = layout.home / "sensor-sim-summary.json"
    sup, ingest = supervisor(settings, layout, env, policy, rotation)
    sim: Child | None = None
    timeline = Timeline(rate, settings.ingest.trigger_interval_s)
    started = time.monotonic()
    interrupted = False
    gave_up: GaveUp | None = None
    previous_term = signal.signal(signal.SIGTERM, _interrupt)  # the children run in their own sessions
    try:
        for child in sup.children:
            print(f"starting {child.name} (log {child.log}) ...", flush=True)
            child.start()
        _wait_for_ingest(sup, ingest, metrics_url)
        print(
            f"streaming job up ({time.monotonic() - started:.0f} s); starting sensor-sim at {rate}/s",
            flush=True,
        )
        sim_argv = [
            sys.executable, "-m", "producers",
            "--bootstrap-servers", settings.kafka.bootstrap_servers,
            "--topic", settings.kafka.topic,
            "--rate", str(rate),
            "--duration", str(duration),
            "--devices", str(devices),
            "--summary-json", str(summary_path),
            "--metrics-port", str(prom.SIMULATOR_METRICS_PORT),  # Prometheus' sensor-sim target
            *DEMO_FAULTS,
        ]  # fmt: skip
        timeline.readings_version = _table_versions(settings).get(settings.tables.readings.name)
        timeline.sim_started_ms = round(time.time() * 1000)
        sim = _spawn("sensor-sim", sim_argv, layout, env)
        started = time.monotonic()
        last: dict[str, Any] = {}
        try:
            while sim.process.poll() is None:
                _report(sup.tick())
                print(_live_line(started, settings, scrape(metrics_url), last, sup, timeline), flush=True)
                _sleep_until(sim, REFRESH_S)
        except KeyboardInterrupt:
            interrupted = True
            print("\nstopping the simulator, then draining the stream ...", flush=True)
            sim.process.send_signal(signal.SIGINT)
            sim.process.wait(60)
        if sim.process.returncode not in (0, None) and not interrupted:
            print(f"sensor-sim exited with {sim.process.returncode}:\n{sim.tail()}", file=sys.stderr)
        stopped = time.monotonic()
        shown = stopped - REFRESH_S
        while time.monotonic() < stopped + DRAIN_TIMEOUT_S:
            _report(sup.tick())  # a job that dies while draining is restarted and resumes from its checkpoint
            if time.monotonic() - shown >= REFRESH_S:
                shown = time.monotonic()
                print(_live_line(started, settings, scrape(metrics_url), last, sup, timeline), flush=True)
            if stream_status(settings).total_lag == 0:
                timeline.drain_s = time.monotonic() - stopped
                break
            time.sleep(DRAIN_POLL_S)
    except GaveUp as e:
        gave_up = e
        print(f"\nerror: {e}", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        if sim is not None:
            sim.stop()
        code = sup.stop(timeout=120)["ingest"]  # the sidecar first, then the job
    ok = gave_up is None and code in (0, None)
    compaction = _final_compaction(settings, layout, env) if ok else None
    if timeline.sim_started_ms:
        timeline.first_readings_s = _first_readings_s(settings, timeline)
    print_summary(settings, layout, summary_path, ingest.log, code, compaction, sup.summary(), timeline)
    if gave_up is not None:
        print(f"\ngave up: {first_line(gave_up)}", file=sys.stderr)
    return 0 if ok else 1


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM: stop like Ctrl-C (drain, stop the children) instead of dying and leaving them running."""
    raise KeyboardInterrupt


def _final_compaction(settings: Settings, layout: StackLayout, env: dict[str, str]) -> list[dict[str, Any]] | None:
    """With the stream stopped, `iotlake optimize` every table: the files before and after, for the summary."""
    print("stream stopped; compacting the tables once (iotlake optimize) ...", flush=True)
    log = layout.logs / "optimize.log"
    with os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, logrotate.LOG_MODE), "wb") as handle:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "streaming.cli", "optimize", "--json"],
                stdout=subprocess.PIPE,
                stderr=handle,
                env=env,
                timeout=900,
                check=False,
                umask=proc.PRIVATE_UMASK,
            )
        except subprocess.TimeoutExpired:
            print(f"optimize did not finish within 900 s; see {log}", file=sys.stderr)
            return None
    try:
        results: list[dict[str, Any]] = json.loads(done.stdout or b"[]")
    except ValueError:
        results = []
    if done.returncode not in (0, 1) or not isinstance(results, list):
        print(f"optimize exited with {done.returncode}; see {log}", file=sys.stderr)
        return None
    return results


def _sleep_until(child: Child, seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.process.wait(seconds)


def print_summary(
    settings: Settings,
    layout: StackLayout,
    summary_path: Path,
    ingest_log: Path,
    code: int | None,
    compaction: list[dict[str, Any]] | None = None,
    supervision: list[str] | None = None,
    timeline: Timeline | None = None,
) -> None:
    sent = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    print("\n=== summary " + "=" * 60)
    if sent:
        print(
            f"sent:        {sent.get('sent_total', 0):,} messages at {sent.get('msgs_per_s', 0):,.0f}/s "
            f"({sent.get('valid_distinct', 0):,} distinct valid, {sent.get('duplicates', 0):,} duplicates, "
            f"{sent.get('malformed_total', 0):,} malformed, {sent.get('late', 0):,} late, "
            f"{sent.get('out_of_order', 0):,} out of order, {sent.get('delivery_failed', 0)} failed)"
        )
    t = settings.tables
    for spec in (t.readings, t.device_state, t.quarantine):
        s = table_status(settings, spec.name)
        if s.exists:
            print(f"{spec.name + ':':<13}{s.rows:>10,} rows  v{s.version}  {s.files} files  {s.uri}")
        else:
            print(f"{spec.name + ':':<13}(not created)")
    reasons = _quarantine_by_reason(settings)
    if reasons:
        print("quarantined: " + ", ".join(f"{reason} {n:,}" for reason, n in reasons.most_common()))
    for r in compaction or []:
        print(
            f"compaction:  {r['table']} {r['partition'] or '(table)'}: {r['files_before']} -> {r['files_after']} files "
            f"({r['bytes_rewritten'] / 2**20:.1f} MiB rewritten, {r['duration_s']:.1f} s, {r['outcome']})"
        )
    if compaction == []:
        print("compaction:  nothing to compact (no partition with two or more small files)")
    stream = stream_status(settings)
    for line in timeline.lines() if timeline is not None and timeline.sim_started_ms else []:
        print(f"timing:      {line}")
    print(f"stream:      last batch {stream.last_batch_id}, lag {stream.total_lag}, checkpoint {stream.checkpoint}")
    print(f"ingest exit: {code}  (log {ingest_log})")
    for line in supervision or []:
        print(f"supervisor:  {line}")
    print("tables:      rows of every run so far; start afresh: `make down`, remove var/ and checkpoints/ingest")
    print(
        "next:        `make status`, `.venv/bin/iotlake status`, MinIO console at "
        f"http://{settings.storage.endpoint.split('://')[-1].rsplit(':', 1)[0]}:"
        f"{int(settings.storage.endpoint.rsplit(':', 1)[1]) + 1} (root login in {settings.storage.secrets_file}), "
        "`make down` to stop Kafka, MinIO and Prometheus"
    )
    print(
        f"prometheus:  {prom.url(settings)} (targets: {prom.url(settings)}/targets, alerts: "
        f"{prom.url(settings)}/alerts); dashboards to import into Grafana: monitoring/grafana/dashboards/"
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    policy = RestartPolicy(max_restarts=args.max_restarts, window_s=args.restart_window)
    return run_pipeline(settings, StackLayout.default(), args.duration, args.rate, args.devices, policy)
