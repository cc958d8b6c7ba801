"""`python -m bench.floor`: the Spark floor on this machine, a plain Kafka -> Delta append of the same topic.

No validation, no quarantine, no dedup, no device_state: `from_json` of the event fields plus the Kafka
coordinates, appended by Delta's own streaming sink (idempotent per batch) to `<base_uri>/floor`, with the
session, Kafka options and maxOffsetsPerTrigger the job uses, `--available-now`. The benchmark runs it on the
topic the job just read, in its own JVM like the job, and quotes the job's steady rate over this one: the ratio
is the figure that holds across machines. Prints one JSON line: batches (rows, seconds, end time) and rates.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pyspark.sql import functions as F

from bench.stats import BatchLine, steady_rate
from streaming.core.config import load_settings
from streaming.core.session import build_session
from streaming.pipeline.ingest import kafka_stream
from streaming.pipeline.schema import EVENT_FIELDS, typed_event_schema

TABLE = "floor"


def steady(batches: Sequence[dict[str, Any]]) -> float | None:
    """Rows per second after batch 0, rated by bench.stats.steady_rate as the job's batches are."""
    lines = [
        BatchLine(b["batch_id"], b["rows"], b["rows"], b["seconds"], datetime.fromtimestamp(b["end_s"]))
        for b in batches
    ]
    return steady_rate(lines, skip=1)


def batches_of(progress: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per micro-batch that read rows, from the query's progress reports."""
    out = []
    for p in progress:
        rows = int(p.get("numInputRows") or 0)
        if not rows:
            continue
        began = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        seconds = p["durationMs"]["triggerExecution"] / 1000
        out.append({"batch_id": p["batchId"], "rows": rows, "seconds": seconds, "end_s": began + seconds})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a new checkpoint folder for the floor's query")
    args = p.parse_args(argv)
    settings = load_settings()
    spark = build_session(settings, app_name="iotlake-bench-floor")
    try:
        started = time.monotonic()
        kafka = ("topic", "partition", "offset", "timestamp")
        parsed = kafka_stream(spark, settings).select(
            F.from_json(F.col("value").cast("string"), typed_event_schema()).alias("e"), *kafka
        )
        query = (
            parsed.select(*[F.col(f"e.{c.name}").alias(c.name) for c in EVENT_FIELDS], *kafka)
            .writeStream.format("delta")
            .option("checkpointLocation", args.checkpoint)
            .trigger(availableNow=True)
            .start(settings.storage.table_uri(TABLE))
        )
        query.awaitTermination()
        wall = time.monotonic() - started
        batches = batches_of([json.loads(p.json) for p in query.recentProgress])
        total = sum(b["rows"] for b in batches)
        rate = steady(batches)
        result = {
            "rows": total,
            "wall_s": round(wall, 2),
            "batches": batches,
            "steady_events_per_s": round(rate, 1) if rate else None,
            "total_events_per_s": round(total / wall, 1) if wall else None,
        }
    finally:
        spark.stop()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
