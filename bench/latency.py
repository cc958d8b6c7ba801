"""Produce -> queryable latency at a fixed rate, with the RSS of the job and of the whole local stack."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench import floor as plain_append
from bench.ingest import floor_output, per_batch, steady_shares
from bench.job import FAULTS, BenchError, MetricsPoller, Proc, ingest_argv, sim_argv, wait_until_up
from bench.lake import delta_commits, readings_cdf, table_cdf, trigger_times
from bench.procs import ProcSampler
from bench.stack import BenchStack, free_port
from bench.stats import least_squares, median, parse_batch_lines, percentile, summarize
from streaming.core.config import IngestConfig, Settings, load_settings, parse_duration
from streaming.lake.status import stream_status


@dataclass(frozen=True)
class LatencyParams:
    name: str = "latency"  # of the workload: its topic, tables, checkpoint and logs
    rate: int = 5000
    duration_s: float = 180.0
    warmup_s: float = 10.0
    trigger_interval: str = IngestConfig.trigger_interval  # the trigger the service ships with
    devices: int = 200
    parcels: int = 20
    faults: bool = True
    drain_timeout_s: float = 1200.0
    floor: bool = True  # then the same traffic into a plain append (bench.floor --trigger): the latency floor


def wait_drained(settings: Settings, job: Proc, timeout: float) -> float:
    """Seconds until the query's checkpoint has every message of the topic (lag 0); BenchError otherwise."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        if not job.alive():
            raise BenchError(f"{job.name} exited with {job.popen.returncode}:\n{job.tail()}")
        if stream_status(settings).total_lag == 0:
            return time.monotonic() - started
        time.sleep(0.5)
    raise BenchError(f"{job.name} still lags after {timeout:.0f} s; log {job.log}")


def wait_ready(floor: Proc, timeout: float) -> float:
    """Seconds until the live floor printed plain_append.READY; BenchError if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not floor.alive():
            raise BenchError(f"python -m bench.floor exited with {floor.popen.returncode}:\n{floor.tail()}")
        if plain_append.READY in floor.text():
            return time.monotonic() - floor.started
        time.sleep(0.25)
    raise BenchError(f"python -m bench.floor did not start within {timeout:.0f} s; log {floor.log}")


def simulate(settings: Settings, params: LatencyParams, env: dict[str, str], workdir: Path, summary: Path) -> Proc:
    """sensor-sim at the run's rate for its duration (with make run's fault mix unless params.faults is off)."""
    argv = sim_argv(
        settings.kafka.bootstrap_servers,
        settings.kafka.topic,
        summary,
        rate=params.rate,
        duration=params.duration_s,
        extra=(
            "--devices", str(params.devices), "--parcels", str(params.parcels),
            *(FAULTS if params.faults else ()),
        ),
    )  # fmt: skip
    return Proc.spawn("sensor-sim", argv, env, workdir / f"{summary.stem}.log")


def run_floor_latency(stack: BenchStack, workdir: Path, params: LatencyParams) -> dict[str, Any]:
    """The same traffic (rate, duration, faults, trigger) into a plain append on a topic of its own: produce ->
    committed with no validation, dedup, quarantine or device_state. The figures the job's are quoted against."""
    env = stack.workload(f"{params.name}-floor", workdir)
    settings = load_settings(env=env)
    trigger = f"{parse_duration(params.trigger_interval, 'trigger_interval'):.3f} seconds"  # as the job sets it
    argv = [
        sys.executable, "-m", "bench.floor",
        "--checkpoint", env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"], "--trigger", trigger,
    ]  # fmt: skip
    floor = Proc.spawn("floor", argv, env, workdir / f"{params.name}-floor.log")
    sim: Proc | None = None
    try:
        up_s = wait_ready(floor, timeout=600)
        sim = simulate(settings, params, env, workdir, workdir / f"{params.name}-floor-sim.json")
        sim_code = sim.wait(params.duration_s + 180)
        if sim_code != 0:
            raise BenchError(f"sensor-sim exited {sim_code}:\n{sim.tail()}")
        drain_s = wait_drained(settings, floor, params.drain_timeout_s)
    finally:
        if sim is not None:
            sim.stop()
        code = floor.stop(timeout=180)
    batches = [b for b in floor_output(floor, code)["batches"] if b["rows"]]
    values, warm = latencies(table_cdf(settings, plain_append.TABLE, starting_version=0), params.warmup_s)
    if not values:
        raise BenchError(f"no rows in the floor's table after the warm-up window; log {floor.log}")
    return {
        "rows_after_warmup": len(values),
        "warmup_rows_left_out": warm,
        "latency_s": summarize(values),
        "latency_p50_s": round(percentile(values, 50), 3),
        "latency_p99_s": round(percentile(values, 99), 3),
        "until_ready_s": round(up_s, 2),
        "drain_after_sim_s": round(drain_s, 2),
        "batches": len(batches),
        "batch_messages": summarize([b["rows"] for b in batches], 1),
        "batch_seconds": summarize([b["seconds"] for b in batches]),
        "batch_rows_seconds": [[b["rows"], b["seconds"]] for b in batches],  # in order, those with rows
    }


def latencies(rows: pa.Table, warmup_s: float) -> tuple[list[float], int]:
    """Per row: commit timestamp - Kafka timestamp, in s; rows produced in the first warmup_s are left out.

    Returns (latencies, rows left out).
    """
    kafka_ms = [t.timestamp() * 1000 for t in rows.column("kafka_timestamp").to_pylist()]
    commit_ms = [t.timestamp() * 1000 for t in rows.column("_commit_timestamp").to_pylist()]
    if not kafka_ms:
        return [], 0
    cutoff = min(kafka_ms) + warmup_s * 1000
    kept = [(c - k) / 1000 for k, c in zip(kafka_ms, commit_ms, strict=True) if k >= cutoff]
    return kept, len(kafka_ms) - len(kept)


def steady_latencies(rows: pa.Table) -> list[float]:
    """Latencies of the rows produced after the first batch with readings committed (JIT warm-up over)."""
    commit_ms = [t.timestamp() * 1000 for t in rows.column("_commit_timestamp").to_pylist()]
    kafka_ms = [t.timestamp() * 1000 for t in rows.column("kafka_timestamp").to_pylist()]
    if not commit_ms:
        return []
    first = min(commit_ms)
    return [(c - k) / 1000 for k, c in zip(kafka_ms, commit_ms, strict=True) if k > first]


def commit_clock_check(settings: Settings, rows: pa.Table) -> dict[str, Any]:
    """How the CDF's _commit_timestamp compares with each commit's commitInfo.timestamp (precision check)."""
    commits = {c.version: c for c in delta_commits(settings, settings.tables.readings.name)}
    versions = rows.column("_commit_version").to_pylist()
    stamps = rows.column("_commit_timestamp").to_pylist()
    seen: dict[int, float] = {}
    for v, t in zip(versions, stamps, strict=True):
        seen.setdefault(int(v), t.timestamp() * 1000)
    diffs = [seen[v] - commits[v].timestamp_ms for v in seen if v in commits]
    visible = [
        (commits[v].written_ms or 0) - seen[v] for v in seen if v in commits and commits[v].written_ms is not None
    ]
    sub_second = sum(1 for v in seen.values() if v % 1000) / max(len(seen), 1)
    return {
        "versions": len(seen),
        "cdf_minus_commitinfo_ms": summarize(diffs, 1),
        "commit_file_written_after_cdf_timestamp_ms": summarize(visible, 1),
        "cdf_timestamps_with_ms_fraction": round(sub_second, 3),
    }


def run_latency(stack: BenchStack, workdir: Path, params: LatencyParams, echo: Any = print) -> dict[str, Any]:
    """Job running continuously, sensor-sim at a fixed rate, drain, stop; latencies from the CDF."""
    metrics_port = free_port()
    env = stack.workload(
        params.name,
        workdir,
        IOTLAKE_INGEST__TRIGGER_INTERVAL=params.trigger_interval,
        IOTLAKE_INGEST__METRICS_PORT=str(metrics_port),
    )
    settings = load_settings(env=env)
    checkpoint = Path(env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])
    poller = MetricsPoller(f"http://127.0.0.1:{metrics_port}/metrics")
    sampler = ProcSampler()
    for name, pid in stack.service_pids().items():
        sampler.track(name, pid)
    job = Proc.spawn("ingest", ingest_argv(available_now=False), env, workdir / f"{params.name}-ingest.log")
    sampler.track("job", job.pid)
    sampler.start()
    poller.start()
    sim: Proc | None = None
    summary_path = workdir / f"{params.name}-sim.json"
    try:
        up_s = wait_until_up(job, poller, timeout=600)
        echo(f"{params.name}: job up after {up_s:.0f} s; sensor-sim at {params.rate}/s for {params.duration_s:.0f} s")
        sim = simulate(settings, params, env, workdir, summary_path)
        sampler.track("simulator", sim.pid)
        sim_code = sim.wait(params.duration_s + 180)
        if sim_code != 0:
            raise BenchError(f"sensor-sim exited {sim_code}:\n{sim.tail()}")
        drain_s = wait_drained(settings, job, params.drain_timeout_s)
        echo(f"{params.name}: drained {drain_s:.1f} s after the simulator stopped; stopping the job (SIGTERM)")
    finally:
        if sim is not None:
            sim.stop()
        code = job.stop(timeout=180)
        poller.stop()
        sampler.stop()
    if code not in (0, None):
        raise BenchError(f"iotlake ingest exited {code} after SIGTERM:\n{job.tail()}")
    rows = readings_cdf(settings)
    values, warm = latencies(rows, params.warmup_s)
    if not values:
        raise BenchError("no readings rows after the warm-up window")
    batches = [b for b in parse_batch_lines(job.text()) if b.messages]  # the first trigger may find nothing
    parts = per_batch(settings, batches, checkpoint)
    shares = steady_shares(parts)
    triggers = [t.committed - t.planned for t in trigger_times(checkpoint) if t.committed is not None]
    result = {
        "rows": rows.num_rows,
        "rows_after_warmup": len(values),
        "warmup_rows_left_out": warm,
        "latency_s": summarize(values),
        "latency_p50_s": round(percentile(values, 50), 3),
        "latency_p99_s": round(percentile(values, 99), 3),
        "latency_s_produced_after_first_commit": summarize(steady_latencies(rows)),
        "commit_clock": commit_clock_check(settings, rows),
        "job_until_metrics_up_s": round(up_s, 2),
        "drain_after_sim_s": round(drain_s, 2),
        "simulator": _load_json(summary_path),
        "batches": len(batches),
        "batch_messages": summarize([b.messages for b in batches], 1),
        "batch_seconds": summarize([b.seconds for b in batches]),
        "trigger_seconds": summarize(triggers),
        "per_batch": parts,
        "share_of_batch_time": shares,
        "batch_parts_mean_s": {
            k: round(sum(p.get(k, 0.0) for p in parts[1:]) / max(len(parts) - 1, 1), 3) for k in shares
        },
        "readings_merge_growth": merge_growth(parts),
        "bound": latency_bound(percentile([b.seconds for b in batches], 50) if batches else 0.0, shares),
        "progress_phases_s": poller.reports[-20:],
        "lag_after_batch_messages": [r.get("lag_messages") for r in poller.reports],
        "progress_phase_means_s": _phase_means(poller.reports),
        "procs": sampler.summary(),
        "job_rss_peak_gib": sampler.peak_gib("job"),
        "stack_rss_peak_gib": sampler.peak_gib("all"),
    }
    echo(
        f"{params.name}: p50 {result['latency_p50_s']:.2f} s, p99 {result['latency_p99_s']:.2f} s over "
        f"{len(values):,} rows; RSS peak job {result['job_rss_peak_gib']:.2f} GiB, "
        f"stack {result['stack_rss_peak_gib']:.2f} GiB"
    )
    if params.floor:
        echo(f"{params.name}: the same traffic into a plain append (python -m bench.floor --trigger), its own topic")
        floor = run_floor_latency(stack, workdir, params)
        result.update(floor_figures(result, floor))
        echo(
            f"{params.name}: floor p50 {floor['latency_p50_s']:.2f} s, p99 {floor['latency_p99_s']:.2f} s; "
            f"job / floor p50 {result['latency_p50_over_floor']}, p99 {result['latency_p99_over_floor']}"
        )
    return result


def floor_figures(job: dict[str, Any], floor: dict[str, Any]) -> dict[str, Any]:
    """The floor's run and its latencies beside the job's, as ratios (job / floor) rounded to 0.01."""
    return {
        "floor": floor,
        "floor_latency_p50_s": floor["latency_p50_s"],
        "floor_latency_p99_s": floor["latency_p99_s"],
        "latency_p50_over_floor": round(job["latency_p50_s"] / floor["latency_p50_s"], 2),
        "latency_p99_over_floor": round(job["latency_p99_s"] / floor["latency_p99_s"], 2),
    }


@dataclass(frozen=True)
class TinyParams:
    """Small batches from the running job: a trickle of messages, the trigger the service ships with."""

    rate: int = 5  # messages/s: a batch of the job takes seconds, so a batch holds tens of messages
    duration_s: float = 120.0
    max_messages: int = 100
    skip: int = 2  # batches with messages left out at the start: JVM, JIT and Delta caches warming up
    floor: bool = True  # then the same trickle into a plain append (bench.floor --trigger): its tiny batch


def tiny_figures(parts: list[dict[str, Any]], max_messages: int, skip: int) -> dict[str, Any]:
    """tiny_batch_s: the median whole trigger (offsets written -> three tables -> commit written) of the batches of
    1..max_messages messages after the first `skip` batches with messages; BenchError when there are none."""
    tiny = [p for p in parts[skip:] if 1 <= p["messages"] <= max_messages and "trigger_s" in p]
    if not tiny:
        sizes = [p["messages"] for p in parts]
        raise BenchError(f"no batch of 1..{max_messages} messages after the first {skip} (batches: {sizes})")
    upserting = [p["trigger_s"] for p in tiny if "device_state_merge_s" in p]  # the others only folded theirs
    return {
        "tiny_batch_s": round(median([p["trigger_s"] for p in tiny]), 3),
        "tiny_batch_foreach_s": round(median([p["foreach_batch_s"] for p in tiny]), 3),
        "tiny_batches": len(tiny),
        "tiny_trigger_s": summarize([p["trigger_s"] for p in tiny]),
        "tiny_messages": summarize([p["messages"] for p in tiny], 1),
        "tiny_batches_upserting_device_state": len(upserting),
        "tiny_trigger_s_upserting_device_state": summarize(upserting),
        "tiny_trigger_s_folding_device_state": summarize(
            [p["trigger_s"] for p in tiny if "device_state_merge_s" not in p]
        ),
    }


def run_tiny(stack: BenchStack, workdir: Path, params: TinyParams, echo: Any = print) -> dict[str, Any]:
    """A trickle of messages into the running job: the fixed cost of a batch, end to end."""
    run = LatencyParams(name="tiny", rate=params.rate, duration_s=params.duration_s, warmup_s=0.0, floor=params.floor)
    latency = run_latency(stack, workdir, run, echo=echo)
    result = {**tiny_figures(latency["per_batch"], params.max_messages, params.skip), "latency": latency}
    echo(
        f"tiny: {result['tiny_batches']} batches of {result['tiny_messages'].get('p50', 0):.0f} messages (p50): "
        f"{result['tiny_batch_s']:.2f} s a trigger, {result['tiny_batch_foreach_s']:.2f} s in foreachBatch; "
        f"{result['tiny_batches_upserting_device_state']} of them upserted device_state"
    )
    if params.floor:
        floor_s = floor_tiny_batch_s(latency["floor"]["batch_rows_seconds"], params.max_messages, params.skip)
        result["floor_tiny_batch_s"] = floor_s
        result["tiny_batch_over_floor"] = round(result["tiny_batch_s"] / floor_s, 2) if floor_s else None
        echo(f"tiny: the plain append's batches of 1..{params.max_messages} messages took {floor_s} s (median)")
    return result


def floor_tiny_batch_s(batches: list[list[float]], max_messages: int, skip: int) -> float | None:
    """The floor's tiny_batch_s: the median trigger of its batches of 1..max_messages rows after the first `skip`
    with rows (`batches`: [rows, seconds] in order), as tiny_figures takes the job's; None when there are none."""
    tiny = [seconds for rows, seconds in batches[skip:] if 1 <= rows <= max_messages]
    return round(median(tiny), 3) if tiny else None


def merge_growth(parts: list[dict[str, Any]], skip: int = 3) -> dict[str, Any] | None:
    """How the readings MERGE's time grows with the rows already in the table, over one run's batches.

    A least-squares fit, readings_merge_s ~ intercept + a * (table rows before the batch) + b * (batch messages),
    over the batches after the first `skip` (warm-up); the table starts empty, so its rows before a batch are the
    readings the batches before it inserted. None when fewer than 5 batches remain or the fit is degenerate.
    """
    rows_before, xs, ys = 0, [], []
    for i, p in enumerate(parts):
        merge_s = p.get("readings_merge_s")
        if i >= skip and merge_s is not None and p.get("messages"):
            xs.append([1.0, rows_before / 1e6, p["messages"] / 1e4])
            ys.append(float(merge_s))
        rows_before += p.get("inserted") or 0
    if len(xs) < 5:
        return None
    try:
        (intercept, per_million, per_10k), r2 = least_squares(xs, ys)
    except ValueError:
        return None
    return {
        "s_per_million_table_rows": round(per_million, 3),
        "s_per_10k_batch_messages": round(per_10k, 3),
        "intercept_s": round(intercept, 3),
        "r2": round(r2, 3),
        "batches": len(xs),
        "table_rows_at_end": rows_before,
    }


def latency_bound(batch_p50_s: float, shares: dict[str, float]) -> str:
    """Latency is waiting for the next trigger plus one whole batch; what that batch spends its time on."""
    top = sorted(shares.items(), key=lambda kv: -kv[1])[:3]
    parts = ", ".join(f"{k} {v:.0%}" for k, v in top)
    return f"a row waits for the running batch to end, then for its own batch (p50 {batch_p50_s:.1f} s): {parts}"


def _phase_means(reports: list[dict[str, Any]]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for r in reports:
        for phase, s in r["phases_s"].items():
            sums[phase] = sums.get(phase, 0.0) + s
    return {p: round(v / len(reports), 3) for p, v in sorted(sums.items())} if reports else {}


def _load_json(path: Path) -> dict[str, Any]:
    import json

    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {
        k: data[k] for k in ("sent_total", "valid_distinct", "duplicates", "malformed_total", "msgs_per_s") if k in data
    }
