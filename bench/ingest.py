"""Sustained end-to-end ingest: preload a topic, then time `iotlake ingest --available-now` on it."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.job import FAULTS, BenchError, MetricsPoller, Proc, ingest_argv, run_sim, sim_argv, wait_until_up
from bench.lake import by_batch, delta_commits, trigger_times
from bench.procs import ProcSampler
from bench.stack import BenchStack, free_port
from bench.stats import BREAKDOWN_KEYS, BatchLine, batch_breakdown, median, parse_batch_lines, steady_rate, summarize
from streaming.core.config import Settings, load_settings

STARTED_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ iotlake\.ingest: streaming query \S+ started")


PRELOAD_KEYS = ("sent_total", "valid_distinct", "duplicates", "malformed_total", "late", "out_of_order", "msgs_per_s")


@dataclass(frozen=True)
class SustainedParams:
    events: int = 2_000_000
    max_offsets_per_trigger: int = 250_000
    devices: int = 200
    parcels: int = 20
    seed: int = 42
    faults: bool = True
    floor: bool = True  # also time the plain append of the same topic (bench.floor) in the same run
    timeout_s: float = 3600.0


def query_started_at(log_text: str) -> float | None:
    """Epoch seconds of the job's 'streaming query ... started' log line."""
    for line in log_text.splitlines():
        m = STARTED_LINE.match(line.strip())
        if m:
            return datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def per_batch(settings: Settings, batches: list[BatchLine], checkpoint: Path) -> list[dict[str, Any]]:
    """Each batch: messages, foreachBatch seconds, trigger seconds, and where the time went."""
    t = settings.tables
    commits = {name: by_batch(delta_commits(settings, name)) for name in (t.quarantine.name, t.readings.name)}
    commits[t.device_state.name] = by_batch(delta_commits(settings, t.device_state.name))
    triggers = {x.batch_id: x for x in trigger_times(checkpoint)}
    rows = []
    for b in batches:
        readings = commits[t.readings.name].get(b.batch_id)
        row: dict[str, Any] = {
            "batch_id": b.batch_id,
            "messages": b.messages,
            "inserted": b.inserted,
            "events_per_second": round(b.messages / b.seconds) if b.seconds else None,
            **batch_breakdown(
                b,
                commits[t.quarantine.name].get(b.batch_id),
                readings,
                commits[t.device_state.name].get(b.batch_id),
            ),
        }
        trig = triggers.get(b.batch_id)
        if trig is not None and trig.committed is not None:
            row["trigger_s"] = round(trig.committed - trig.planned, 3)
            row["outside_foreach_batch_s"] = round(row["trigger_s"] - b.seconds, 3)
        if readings is not None:
            m = readings.metrics
            row["readings_merge_metrics"] = {
                k: m[k]
                for k in (
                    "numSourceRows",
                    "numTargetRowsInserted",
                    "numTargetFilesAdded",
                    "scanTimeMs",
                    "rewriteTimeMs",
                    "executionTimeMs",
                )
                if k in m
            }
        rows.append(row)
    return rows


def steady_shares(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Share of foreachBatch time per part, over the batches after the first (JVM warm-up) one."""
    steady = rows[1:] if len(rows) > 1 else rows
    total = sum(r["foreach_batch_s"] for r in steady) or 1.0
    present = [k for k in BREAKDOWN_KEYS if any(k in r for r in steady)]
    return {k: round(sum(r.get(k, 0.0) for r in steady) / total, 3) for k in present}


def bound_statement(steady_cpu: float, machine_busy: float, cores: int, shares: dict[str, float]) -> str:
    """One sentence on what limits throughput, from CPU use and the biggest share of batch time."""
    top = max(shares, key=lambda k: shares[k]) if shares else "?"
    if steady_cpu >= 0.8 * cores:
        cpu = f"CPU-bound: the job used {steady_cpu:.2f} of {cores} cores"
    elif machine_busy >= 0.8 * cores:
        cpu = (
            f"CPU-bound machine: the job used {steady_cpu:.2f} cores while the machine was "
            f"{machine_busy:.2f}/{cores} busy (other work took the rest)"
        )
    else:
        cpu = f"not CPU-bound: the job used {steady_cpu:.2f} of {cores} cores (machine {machine_busy:.2f} busy)"
    return f"{cpu}; the largest share of steady-state batch time is {top} ({shares.get(top, 0):.0%})"


def floor_checkpoint(env: dict[str, str]) -> Path:
    """The floor's checkpoint: beside the workload's own, so each run (each topic) starts from nothing."""
    return Path(env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"] + "-floor")


def run_floor(env: dict[str, str], workdir: Path, timeout_s: float) -> dict[str, Any]:
    """`python -m bench.floor` on the workload's topic and storage, in its own JVM; its JSON result."""
    checkpoint = floor_checkpoint(env)
    argv = [sys.executable, "-m", "bench.floor", "--checkpoint", str(checkpoint)]
    floor = Proc.spawn("floor", argv, env, workdir / f"{checkpoint.name}.log")
    try:
        code = floor.wait(timeout_s)
    finally:
        floor.stop()
    return floor_output(floor, code)


def floor_output(floor: Proc, code: int | None) -> dict[str, Any]:
    """The JSON line `python -m bench.floor` prints when it ends; BenchError if it failed."""
    lines = [line for line in floor.text().splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        raise BenchError(f"python -m bench.floor exited {code}:\n{floor.tail()}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_sustained(stack: BenchStack, workdir: Path, params: SustainedParams, echo: Any = print) -> dict[str, Any]:
    """Preload `events` messages, then run the job with --available-now; rates, batches, phases, CPU."""
    metrics_port = free_port()
    env = stack.workload(
        "sustained",
        workdir,
        IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER=str(params.max_offsets_per_trigger),
        IOTLAKE_INGEST__METRICS_PORT=str(metrics_port),
    )
    settings = load_settings(env=env)
    checkpoint = Path(env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])
    # Event times end before the wall clock (1 ms apart) so nothing counts as from the future.
    start = datetime.now(UTC) - timedelta(milliseconds=params.events * 1.0 + 120_000)
    summary_path = workdir / "sustained-preload.json"
    argv = sim_argv(
        settings.kafka.bootstrap_servers,
        settings.kafka.topic,
        summary_path,
        rate=0,
        count=params.events,
        extra=(
            "--devices", str(params.devices), "--parcels", str(params.parcels), "--seed", str(params.seed),
            "--start-time", start.isoformat(), "--time-step-ms", "1", *(FAULTS if params.faults else ()),
        ),
    )  # fmt: skip
    echo(f"sustained: preloading {params.events:,} events into {settings.kafka.topic} ...")
    preload = run_sim(argv, env, workdir / "sustained-preload.log", summary_path, params.timeout_s)
    echo(f"sustained: preloaded {preload['sent_total']:,} in {preload['elapsed_s']:.1f} s; starting the job")

    poller = MetricsPoller(f"http://127.0.0.1:{metrics_port}/metrics")
    sampler = ProcSampler()
    job = Proc.spawn("ingest", ingest_argv(available_now=True), env, workdir / "sustained-ingest.log")
    spawned_at = time.time()
    sampler.track("job", job.pid)
    sampler.start()
    poller.start()
    try:
        up_s = wait_until_up(job, poller, timeout=600)
        code = job.wait(params.timeout_s)
        wall = time.monotonic() - job.started
    finally:
        job.stop()
        poller.stop()
        sampler.stop()
    if code != 0:
        raise BenchError(f"iotlake ingest --available-now exited {code}:\n{job.tail()}")
    text = job.text()
    batches = parse_batch_lines(text)
    processed = sum(b.messages for b in batches)
    if processed != preload["sent_total"]:
        raise BenchError(f"the job processed {processed:,} messages of {preload['sent_total']:,}; log {job.log}")
    started_at = query_started_at(text)
    rows = per_batch(settings, batches, checkpoint)
    shares = steady_shares(rows)
    # CPU over the steady window: from the end of batch 0 to the end of the last batch.
    window = (
        (batches[0].logged_at.timestamp() - spawned_at, batches[-1].logged_at.timestamp() - spawned_at)
        if len(batches) > 1
        else (0.0, float("inf"))
    )
    steady_cpu = sampler.mean_cpu("job", *window)
    machine_busy = sampler.mean_machine_busy(*window)
    cores = os.cpu_count() or 1
    result = {
        "events": processed,
        "preload": {k: preload[k] for k in PRELOAD_KEYS},
        "job_wall_s": round(wall, 2),
        "job_until_metrics_up_s": round(up_s, 2),
        "job_startup_s": round(started_at - spawned_at, 2) if started_at else None,
        "total_events_per_s": round(processed / wall, 1),
        "steady_events_per_s": round(steady_rate(batches, skip=1) or 0.0, 1),
        "steady_foreach_batch_events_per_s": round(
            sum(b.messages for b in batches[1:]) / sum(b.seconds for b in batches[1:]), 1
        )
        if len(batches) > 1
        else None,
        "batches": rows,
        "batch_seconds": summarize(b.seconds for b in batches),
        "steady_share_of_batch_time": shares,
        "progress_phases_s": poller.reports,
        "steady_job_cpu_cores": steady_cpu,
        "steady_machine_busy_cores": machine_busy,
        "job_rss_peak_gib": sampler.peak_gib("job"),
        "bound": bound_statement(steady_cpu, machine_busy, cores, shares),
        "median_steady_batch_s": round(median([b.seconds for b in batches[1:]]), 2) if len(batches) > 1 else None,
    }
    echo(
        f"sustained: {processed:,} events in {wall:.1f} s = {result['total_events_per_s']:,.0f} events/s total, "
        f"{result['steady_events_per_s']:,.0f} events/s steady (after batch 0); {result['bound']}"
    )
    if params.floor:
        floor = run_floor(env, workdir, params.timeout_s)
        if floor["rows"] != processed:
            raise BenchError(f"the floor read {floor['rows']:,} messages, the job {processed:,}; see {workdir}")
        result["floor"] = floor
        result["floor_append_events_per_s"] = floor["steady_events_per_s"]
        if floor["steady_events_per_s"]:
            result["sustained_over_floor"] = round(result["steady_events_per_s"] / floor["steady_events_per_s"], 3)
        echo(
            f"sustained: floor (plain append of the same topic) {floor['steady_events_per_s']:,.0f} events/s steady; "
            f"job / floor = {result.get('sustained_over_floor')}"
        )
    return result
