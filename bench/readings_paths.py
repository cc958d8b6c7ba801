"""`python -m bench.readings_paths`: three ways to write a batch's readings, side by side on one warm JVM.

Each batch of the preloaded topic (`make run`'s fault mix) is validated and deduplicated once, as the job does,
then written to three tables of its own, in an order that alternates from batch to batch:
- `merge`: the job's insert-only MERGE (`LakeTables.merge_readings`), dates and event-time ranges as literals;
- `split`: the high-water-mark fast path: rows later than the table's newest reading are appended, the rest go
  through the same insert-only MERGE, narrowed to their own dates and buckets;
- `append`: a plain append of every row, no dedup against the table: the floor of the write alone.
No transaction ids. `merge` and `split` must end with the same readings, or the run fails.
Writes bench/results/<date>-readings-paths.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from bench import report
from bench.profile import produce
from bench.stack import bench_stack
from streaming.core.config import load_settings
from streaming.core.session import build_session
from streaming.pipeline import batch
from streaming.pipeline.ingest import kafka_stream
from streaming.pipeline.rules import Rules
from streaming.pipeline.tables import LakeTables

RESULTS = Path(__file__).resolve().parent / "results"
PATHS = ("merge", "split", "append")


def _split_write(tables: LakeTables, rows: DataFrame, mark_ms: int | None) -> int:
    """Append the rows later than `mark_ms`, MERGE the rest; returns the number of rows that took the MERGE."""
    mark = F.timestamp_millis(F.lit(mark_ms)) if mark_ms is not None else None
    fresh = rows if mark is None else rows.where(F.col("event_time") > mark)
    fresh.write.format("delta").mode("append").save(tables.readings_uri)
    if mark is None:
        return 0
    late = rows.where(F.col("event_time") <= mark)
    bucket = F.floor(F.unix_millis("event_time") / batch.TIME_BUCKET_MS)
    counts = late.groupBy(bucket.alias("b")).count().collect()
    if counts:
        buckets = [int(r["b"]) for r in counts]
        dates = sorted({batch.date_of(b * batch.TIME_BUCKET_MS) for b in buckets})
        tables.merge_readings(late, dates, batch.time_ranges(buckets), None, False)
    return sum(int(r["count"]) for r in counts)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.readings_paths", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=2_000_000, help="preloaded messages (default 2000000)")
    p.add_argument("--per-trigger", type=int, default=250_000, help="maxOffsetsPerTrigger (default 250000)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    load = report.machine()["loadavg_at_start"]
    seconds: dict[str, list[float]] = {path: [] for path in PATHS}
    late_rows: list[int] = []
    with bench_stack(echo=None) as stack, tempfile.TemporaryDirectory(prefix="iotlake-paths-") as work:
        env = stack.workload("paths", Path(work), IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER=str(args.per_trigger))
        settings = load_settings(env=env)

        def tables_of(suffix: str) -> LakeTables:
            storage = replace(settings.storage, base_uri=f"{settings.storage.base_uri}-{suffix}")
            return LakeTables(spark, replace(settings, storage=storage))

        spark = build_session(settings, app_name="iotlake-readings-paths")
        produce(settings, args.messages, seed=1)
        rules = Rules.from_settings(settings)
        tables = {path: tables_of(path) for path in PATHS}
        for t in tables.values():
            t.ensure()
        mark: list[int | None] = [None]

        def write_batch(raw: DataFrame, batch_id: int) -> None:
            info = batch.BatchInfo(batch_id, datetime.now(UTC))
            validated = batch.validate(raw, rules, info).persist(StorageLevel.MEMORY_AND_DISK)
            stats = batch.summarize(batch.batch_stats(validated).collect(), rules)
            rows = batch.readings(validated, rules).persist(StorageLevel.MEMORY_AND_DISK)
            rows.count()
            order = PATHS[batch_id % 3 :] + PATHS[: batch_id % 3]
            for path in order:
                began = time.monotonic()
                if path == "merge":
                    tables[path].merge_readings(
                        rows, stats.dates, batch.time_ranges(stats.buckets), None, False, stats.id_range
                    )
                elif path == "split":
                    late_rows.append(_split_write(tables[path], rows, mark[0]))
                else:
                    rows.write.format("delta").mode("append").save(tables[path].readings_uri)
                seconds[path].append(round(time.monotonic() - began, 3))
            if stats.newest_event_ms is not None:
                mark[0] = max(mark[0] or 0, stats.newest_event_ms)
            print(f"batch {batch_id}: " + ", ".join(f"{p} {seconds[p][-1]:.2f} s" for p in PATHS), flush=True)
            rows.unpersist()
            validated.unpersist()

        stream = kafka_stream(spark, settings).writeStream.foreachBatch(write_batch)
        query = stream.option("checkpointLocation", f"{work}/checkpoint").trigger(availableNow=True).start()
        query.awaitTermination()
        counts = {p: _distinct_and_total(t) for p, t in tables.items()}
        spark.stop()
    if counts["merge"] != counts["split"] or counts["merge"][0] != counts["merge"][1]:
        raise RuntimeError(f"merge and split stored different readings: {counts}")
    result = {
        "date": datetime.now(UTC).date().isoformat(),
        "commit": report.git_commit(),
        "load_average": load,
        "command": shlex.join(["python", "-m", "bench.readings_paths", *(sys.argv[1:] if argv is None else argv)]),
        "messages": args.messages,
        "per_trigger": args.per_trigger,
        "seconds_per_batch": seconds,
        "median_after_batch_0_s": {p: round(statistics.median(s[1:]), 2) for p, s in seconds.items() if len(s) > 1},
        "split_rows_through_merge": late_rows,
        "readings_distinct_total": counts,
    }
    _write(result, args.out)
    return 0


def _distinct_and_total(tables: LakeTables) -> tuple[int, int]:
    df = tables.spark.read.format("delta").load(tables.readings_uri)
    return df.select(*batch.READING_KEY).distinct().count(), df.count()


def _write(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{result['date']}-readings-paths"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    medians = result["median_after_batch_0_s"]
    lines = [
        f"# Readings write paths, {result['date']}",
        "",
        f"Commit `{result['commit']['commit'][:12]}`; load average at start {result['load_average']}; "
        f"command `{result['command']}`.",
        "",
        "| path | median s per batch (after batch 0) | every batch, s |",
        "|---|---|---|",
        *[f"| {p} | {medians.get(p)} | {', '.join(str(s) for s in result['seconds_per_batch'][p])} |" for p in PATHS],
        "",
        f"Rows the split sent through its MERGE, per batch: {result['split_rows_through_merge']}.",
        f"Readings (distinct keys, rows) per table: {result['readings_distinct_total']}.",
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
