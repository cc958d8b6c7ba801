"""`python -m bench.validate`: the validation step alone, on a warm local session: no Kafka, no Delta.

The simulator's messages with `make run`'s fault mix, held in memory as Kafka rows, go through the job's own
`batch.validate`, `batch.batch_stats` (persisted first, as the job does) and `batch.readings` with
`latest_per_device`, each timed three times; and a small batch (200 messages, a new batch clock each time),
where planning and compiling the expression, not the rows, is the cost. Writes bench/results/<date>-validate.{json,md}.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.storagelevel import StorageLevel

from bench import report
from producers.options import SimOptions
from producers.stream import EventStream
from streaming.core.config import load_settings
from streaming.core.session import build_session
from streaming.pipeline import batch
from streaming.pipeline.rules import Rules

RESULTS = Path(__file__).resolve().parent / "results"
KAFKA_ROW = T.StructType(
    [
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
    ]
)


def timed(step: Callable[[], object], repeats: int) -> list[float]:
    seconds = []
    for _ in range(repeats):
        began = time.monotonic()
        step()
        seconds.append(round(time.monotonic() - began, 3))
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.validate", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=100_000, help="messages (default 100000)")
    p.add_argument("--small", type=int, default=200, help="messages of the small batch (default 200)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    load = report.machine()["loadavg_at_start"]
    settings = load_settings()
    settings = settings.on_local_files("/tmp/iotlake-bench-validate")
    spark = build_session(settings, app_name="iotlake-bench-validate")
    now_ms = time.time_ns() // 1_000_000
    options = SimOptions(
        seed=1,
        start_time_ms=now_ms - 3_600_000,
        count=args.messages,
        duplicate_rate=0.05,
        out_of_order_rate=0.05,
        late_rate=0.02,
        malformed_rate=0.02,
    )
    at = datetime.now(UTC)
    rows = [(m[0], m[1], "bench", i % 6, i, at) for i, m in enumerate(EventStream(options))]
    raw = spark.createDataFrame(rows, KAFKA_ROW).repartition(6).persist()
    raw.count()
    rules = Rules.from_settings(settings)
    validator = batch.Validator.of(rules)  # built once, as the job's BatchWriter does
    info = batch.BatchInfo(0, at)

    def validate_and_stats() -> DataFrame:
        validated = validator(raw, info).persist(StorageLevel.MEMORY_AND_DISK)
        batch.batch_stats(validated).collect()
        return validated

    def whole_step() -> None:
        validated = validate_and_stats()
        kept = batch.readings(validated, rules).persist(StorageLevel.MEMORY_AND_DISK)
        batch.latest_per_device(kept).collect()
        kept.unpersist()
        validated.unpersist()

    small = spark.createDataFrame(rows[: args.small], KAFKA_ROW).persist()
    small.count()
    seconds_later = itertools.count(1)

    def small_batch() -> None:
        # A new batch clock each time, as each micro-batch has: only the Validator's expressions are reused.
        later = batch.BatchInfo(0, datetime.fromtimestamp(at.timestamp() + next(seconds_later), UTC))
        validated = validator(small, later).persist(StorageLevel.MEMORY_AND_DISK)
        batch.batch_stats(validated).collect()
        validated.unpersist()

    steps = {
        "from_json_only_s": lambda: (
            raw.select(F.from_json(F.col("value").cast("string"), "event_id string").alias("j"))
            .where("j.event_id is not null")
            .count()
        ),
        "validate_and_stats_s": lambda: validate_and_stats().unpersist(),
        "validate_stats_readings_latest_s": whole_step,
        "small_batch_validate_and_stats_s": small_batch,
    }
    try:
        figures = {name: timed(step, args.repeats) for name, step in steps.items()}
    finally:
        spark.stop()
    result = {
        **report.run_header("bench.validate", argv, load),
        "messages": args.messages,
        "seconds": figures,
        "median_s": {k: statistics.median(v) for k, v in figures.items()},
        "rows_per_s": {
            k: round((args.small if k.startswith("small") else args.messages) / statistics.median(v))
            for k, v in figures.items()
        },
    }
    lines = [
        f"# Validation alone, {result['date']}",
        "",
        f"Commit `{result['commit']['commit'][:12]}`; load average at start {load}; {args.messages:,} messages, "
        "warm local[2] session, no Kafka, no Delta.",
        "",
        "| step | seconds (each run) | median | rows/s |",
        "|---|---|---|---|",
        *(
            f"| {k} | {' '.join(f'{s:.2f}' for s in v)} | {result['median_s'][k]:.2f} | {result['rows_per_s'][k]:,} |"
            for k, v in figures.items()
        ),
    ]
    report.write_text_report(result, lines, args.out, f"{result['date']}-validate")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
