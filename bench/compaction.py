"""What the sidecar's compaction buys and costs, side by side in one run.

1. A one-device-one-day query on a fragmented closed partition (many small appends), then one sidecar cycle
   (`Maintainer.cycle`: OPTIMIZE + Z-ORDER by device_id), then the same query: median time and files read.
2. Sustained ingest of the same preloaded messages twice, each into a table with the same fragmented closed
   partition: alone (before that table's compaction in 1), and while the sidecar (`iotlake maintain
   --once`, its own process at maintenance.niceness, as deployed) compacts a fragmented closed partition of the
   same readings table, started once the job committed its first batch. Events/s from the job's batch lines:
   steady state alone (start-up excluded) against the batches that ran while the sidecar's OPTIMIZE ran (its
   log gives each OPTIMIZE's end and duration).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.job import Proc, ingest_argv, run_sim, sim_argv
from bench.stack import BenchStack
from bench.stats import BatchLine, median, parse_batch_lines, steady_rate
from streaming.core.config import load_settings
from streaming.core.session import build_session
from streaming.lake.maintenance import Maintainer
from streaming.lake.metrics import MaintenanceMetrics
from streaming.pipeline.schema import READINGS_COLUMNS
from streaming.pipeline.tables import LakeTables


@dataclass(frozen=True)
class CompactionParams:
    appends: int = 40
    files_per_append: int = 25
    rows_per_append: int = 50_000
    devices: int = 200
    query_runs: int = 5
    ingest_events: int = 300_000
    max_offsets_per_trigger: int = 25_000
    timeout_s: float = 1800.0


def fragment(spark: Any, uri: str, day: date, params: CompactionParams) -> None:
    """`appends` small appends of one closed day into the readings table, `files_per_append` files each."""
    from pyspark.sql import functions as F

    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    for append in range(params.appends):
        given = {
            "event_id": F.concat(F.lit(f"bench-{day.isoformat()}-{append}-"), F.col("id").cast("string")),
            "device_id": F.concat(F.lit("device-"), F.lpad((F.col("id") % params.devices).cast("string"), 5, "0")),
            "parcel_id": F.concat(F.lit("parcel-"), (F.col("id") % 20).cast("string")),
            "seq": F.col("id") + append * params.rows_per_append,
            "event_time": F.lit(start) + F.make_interval(secs=(F.col("id") * 7 + append) % 86_000),
            "schema_version": F.lit(1),
            "air_temperature_c": F.rand(seed=append) * 30,
            "air_humidity_pct": F.rand(seed=append + 1) * 100,
            "event_date": F.lit(day),
        }
        cols = [given.get(c.name, F.lit(None)).cast(c.type).alias(c.name) for c in READINGS_COLUMNS]
        frame = spark.range(params.rows_per_append).select(*cols).repartition(params.files_per_append)
        frame.write.format("delta").mode("append").save(uri)


def one_device_one_day(spark: Any, uri: str, device: str, day: date) -> tuple[float, int, int]:
    """(seconds, files read, rows) of the query a dashboard runs: one device's readings of one day."""
    from pyspark.sql import functions as F

    frame = spark.read.format("delta").load(uri).where((F.col("device_id") == device) & (F.col("event_date") == day))
    started = time.perf_counter()
    row = frame.agg(F.count("*").alias("n"), F.avg("air_temperature_c")).first()
    seconds = time.perf_counter() - started
    files = frame.select(F.input_file_name()).distinct().count()
    return seconds, files, int(row["n"]) if row is not None else 0


def _query(spark: Any, uri: str, device: str, day: date, runs: int) -> dict[str, Any]:
    samples = [one_device_one_day(spark, uri, device, day) for _ in range(runs + 1)][1:]  # first run: warm-up
    return {
        "median_s": round(median([s[0] for s in samples]) or 0.0, 4),
        "runs_s": [round(s[0], 4) for s in samples],
        "files_read": samples[0][1],
        "rows": samples[0][2],
    }


def _ingest(
    env: dict[str, str],
    workdir: Path,
    name: str,
    params: CompactionParams,
    once_batching: Callable[[], None] | None = None,
) -> list[BatchLine]:
    """`iotlake ingest --available-now` on the preloaded topic; its batch lines. With `once_batching`, that runs
    after the job committed its first batch, so it overlaps the job's steady state, not its start-up."""
    log = workdir / f"{name}.log"
    proc = Proc.spawn(name, ingest_argv(available_now=True), env, log)
    try:
        if once_batching is not None:
            deadline = time.monotonic() + params.timeout_s
            while not parse_batch_lines(log.read_text()):
                if not proc.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} committed no batch (exit {proc.popen.poll()}):\n{proc.tail()}")
                time.sleep(0.2)
            once_batching()
        code = proc.wait(params.timeout_s)
    finally:
        proc.stop()
    if code != 0:
        raise RuntimeError(f"{name} exited {code}:\n{proc.tail()}")
    return parse_batch_lines(log.read_text())


def ran_during(batches: list[BatchLine], start: datetime, end: datetime) -> list[int]:
    """Indexes of the batches that ran while [start, end] lasted: each batch runs from the end of the one
    before it to its own end (the first batch is left out: its start is unknown)."""
    return [i for i in range(1, len(batches)) if batches[i].logged_at >= start and batches[i - 1].logged_at <= end]


def window_rate(batches: list[BatchLine], start: datetime, end: datetime) -> float | None:
    """Messages per second of the batches that ran during [start, end] (None: no such batch)."""
    overlapping = ran_during(batches, start, end)
    if not overlapping:
        return None
    first, last = overlapping[0], overlapping[-1]
    window = (batches[last].logged_at - batches[first - 1].logged_at).total_seconds()
    return sum(b.messages for b in batches[first : last + 1]) / window if window > 0 else None


SIDECAR_ONCE = [sys.executable, "-m", "streaming.cli", "maintain", "--once", "--json"]
# The sidecar's log line for one OPTIMIZE (streaming.lake.maintenance.Maintainer.optimize), at its end.
OPTIMIZE_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+: optimize readings .* in (?P<seconds>[\d.]+)s \["
)


def optimize_windows(log_text: str) -> list[tuple[datetime, datetime]]:
    """(start, end) of every OPTIMIZE of readings in a sidecar log, naive local time like the job's batch lines."""
    windows = []
    for line in log_text.splitlines():
        m = OPTIMIZE_LINE.match(line.strip())
        if m:
            end = datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f")
            windows.append((end - timedelta(seconds=float(m["seconds"])), end))
    return windows


def run_compaction(stack: BenchStack, workdir: Path, params: CompactionParams, echo: Any = print) -> dict[str, Any]:
    closed_day = datetime.now(UTC).date() - timedelta(days=2)
    envs = {
        name: stack.workload(
            f"compaction-{name}", workdir, IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER=str(params.max_offsets_per_trigger)
        )
        for name in ("alone", "during")
    }
    settings = {name: load_settings(env=env) for name, env in envs.items()}
    for name, env in envs.items():  # the same messages in both topics
        s = settings[name]
        summary = workdir / f"compaction-{name}-sim.json"
        argv = sim_argv(s.kafka.bootstrap_servers, s.kafka.topic, summary, rate=0, count=params.ingest_events,
                        extra=("--seed", "11", "--devices", str(params.devices)))  # fmt: skip
        run_sim(argv, env, workdir / f"compaction-{name}-sim.log", summary, params.timeout_s)
    spark = build_session(settings["alone"], app_name="iotlake-bench-compaction")
    result: dict[str, Any] = {"closed_day": closed_day.isoformat()}
    try:
        uris = {}
        for name in envs:
            tables = LakeTables(spark, settings[name])
            tables.ensure()
            started = time.monotonic()
            fragment(spark, tables.readings_uri, closed_day, params)
            uris[name] = tables.readings_uri
            echo(f"compaction: fragmented {name} table written in {time.monotonic() - started:.0f} s")
        device = "device-00007"
        before = _query(spark, uris["alone"], device, closed_day, params.query_runs)
        echo(f"compaction: before: {before['files_read']} files, median {before['median_s']:.3f} s")
        # Ingest alone into the fragmented table, as the other run starts on one: the same snapshot sizes.
        alone = steady_rate(_ingest(envs["alone"], workdir, "ingest-alone", params), skip=1)
        maintainer = Maintainer(spark, settings["alone"], MaintenanceMetrics())
        started = time.monotonic()
        report = maintainer.cycle(vacuum=False)
        result["cycle_s"] = round(time.monotonic() - started, 1)
        result["optimized"] = report.to_dict()["optimized"]
        after = _query(spark, uris["alone"], device, closed_day, params.query_runs)
        echo(f"compaction: after: {after['files_read']} files, median {after['median_s']:.3f} s")
        result["query"] = {
            "same_answer": before["rows"] == after["rows"],
            "before": before,
            "after": after,
            "speedup": round(before["median_s"] / after["median_s"], 2) if after["median_s"] else None,
            "files_ratio": round(after["files_read"] / before["files_read"], 4) if before["files_read"] else None,
        }

        # Ingest while the sidecar compacts the other table's closed partition.
        during_settings = settings["during"]
        window: dict[str, Any] = {}

        def compact() -> None:
            log = workdir / "sidecar-during.log"
            env = {**envs["during"], "IOTLAKE_MAINTENANCE__METRICS_PORT": "0"}
            sidecar = Proc.spawn("sidecar-during", SIDECAR_ONCE, env, log)
            code = sidecar.wait(params.timeout_s)
            text = log.read_text(errors="replace")
            windows = optimize_windows(text)
            if code != 0 or not windows:
                raise RuntimeError(f"the sidecar compacted nothing (exit {code}):\n{sidecar.tail()}")
            window["start"], window["end"] = min(w[0] for w in windows), max(w[1] for w in windows)
            result["concurrent_cycle"] = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
            result["sidecar_niceness"] = during_settings.maintenance.niceness

        batches = _ingest(envs["during"], workdir, "ingest-during", params, once_batching=compact)
        during = window_rate(batches, window["start"], window["end"])
        result["ingest"] = {
            "compaction_s": round((window["end"] - window["start"]).total_seconds(), 1),
            "batches_during_compaction": len(ran_during(batches, window["start"], window["end"])),
            "alone_events_per_s": round(alone or 0.0),
            "during_compaction_events_per_s": round(during) if during else None,
            "drop_pct": round(100 * (1 - during / alone), 1) if alone and during else None,
        }
        echo(f"compaction: ingest alone {alone or 0:.0f}/s, while compacting {during or 0:.0f}/s")
    finally:
        spark.stop()
    return result


def quick(params: CompactionParams) -> CompactionParams:
    return replace(params, appends=6, rows_per_append=10_000, ingest_events=60_000, max_offsets_per_trigger=10_000)
