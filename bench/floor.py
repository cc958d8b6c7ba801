"""`python -m bench.floor`: the Spark floor on this machine, a plain Kafka -> Delta append of the same topic.

No validation, no quarantine, no dedup, no device_state: `from_json` of the event fields plus the Kafka
coordinates, appended by Delta's own streaming sink (idempotent per batch) to `<base_uri>/floor`, with the
session, Kafka options and maxOffsetsPerTrigger the job uses, `--available-now`. The benchmark runs it on the
topic the job just read, in its own JVM like the job, and quotes the job's steady rate over this one: the ratio
is the figure that holds across machines. Prints one JSON line: batches (rows, seconds, end time) and rates.

With `--trigger <interval>` it runs live instead, on that processing-time trigger, until SIGTERM: the latency
benchmark's floor (produce -> committed by a plain append). It prints READY once its first trigger has run.
The table has the change data feed on, as the job's tables do, so each row's commit time can be read back.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
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
READY = "floor: running"  # printed once the live query's first trigger has run


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
    p.add_argument("--trigger", help="run live on this processing-time trigger (e.g. '1 second') until SIGTERM")
    args = p.parse_args(argv)
    settings = load_settings()
    spark = build_session(settings, app_name="iotlake-bench-floor")
    spark.conf.set("spark.databricks.delta.properties.defaults.enableChangeDataFeed", "true")
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")  # every batch of a live run, not 100
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        started = time.monotonic()
        kafka = ("topic", "partition", "offset")
        parsed = kafka_stream(spark, settings).select(
            F.from_json(F.col("value").cast("string"), typed_event_schema()).alias("e"),
            *kafka,
            F.col("timestamp").alias("kafka_timestamp"),
        )
        writer = (
            parsed.select(*[F.col(f"e.{c.name}").alias(c.name) for c in EVENT_FIELDS], *kafka, "kafka_timestamp")
            .writeStream.format("delta")
            .option("checkpointLocation", args.checkpoint)
        )
        if args.trigger:
            query = writer.trigger(processingTime=args.trigger).start(settings.storage.table_uri(TABLE))
            while query.lastProgress is None and query.isActive and not stopping.is_set():
                time.sleep(0.2)
            print(READY, flush=True)
            while query.isActive and not stopping.is_set():
                query.awaitTermination(1)
            if not stopping.is_set():
                query.awaitTermination()  # stopped by itself: raises the query's failure
            query.stop()
        else:
            query = writer.trigger(availableNow=True).start(settings.storage.table_uri(TABLE))
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
