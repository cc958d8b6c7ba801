"""A warm-up batch before the query starts: the JVM's first batch is two to three times slower than the next.

The first micro-batch of a new JVM loads Spark's, Delta's and Parquet's classes, generates and compiles the
batch's code and leaves the JIT cold; on two cores that took 25 s for 20,000 messages, against 12 s warm
(docs/benchmark-log.md, "Fast ingest: a warm-up batch"). Run before the query starts, a batch of synthetic messages
through the same BatchWriter into scratch tables on local disk pays that once, before the first message waits on it.

Nothing of the lake is touched: the scratch tables, their checkpoint folder and the metrics registry are the
warm-up's own and are removed after it; the real query's ids, batches and transaction ids are unchanged.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from streaming.core.config import Settings
from streaming.core.errors import first_line
from streaming.pipeline.tables import LakeTables

log = logging.getLogger("iotlake.warmup")

MESSAGES = 5000  # enough rows for the JIT to compile the batch's hot loops, not only to load its classes
DEVICES = 20
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # Spark sets it in a foreachBatch call: the query's id
BatchBody = Callable[[DataFrame, int], None]  # a foreachBatch body: the job's BatchWriter

RAW_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"


def messages(
    now: datetime, schema_version: int = 1, count: int = MESSAGES
) -> list[tuple[bytes, bytes, str, int, int, datetime]]:
    """Kafka rows of valid readings from DEVICES devices, one re-send and one malformed message (quarantine).

    Their event times are the count milliseconds before now: inside any lateness and future-skew window.
    """
    now_ms = round(now.timestamp() * 1000)
    rows: list[bytes] = []
    for i in range(count - 2):
        device = i % DEVICES
        event = {
            "event_id": f"warmup-{i}",
            "device_id": f"warmup-device-{device}",
            "parcel_id": f"warmup-parcel-{device % 4}",
            "seq": i,
            "event_time": now_ms - (count - i),
            "schema_version": schema_version,
            "air_temperature_c": 20.0 + i % 10,
            "air_humidity_pct": 50.0,
            "soil_nitrogen_mg_kg": 30.0,
            "soil_salinity_ds_m": 1.2,
            "battery_v": 3.7,
        }
        rows.append(json.dumps(event).encode())
    rows += [rows[0], b'{"event_id": "warmup-bad", broken']
    return [(b"warmup", value, "warmup", i % 2, i, now) for i, value in enumerate(rows)]


def wants_warm_up(settings: Settings, available_now: bool) -> bool:
    """A continuous query on a local master. A backfill (available_now) gains nothing from it; on a cluster the
    executors, whose JVMs would need it, can't read scratch tables on the driver's disk."""
    return settings.ingest.warm_up and not available_now and settings.spark.master.startswith("local")


def scratch_settings(settings: Settings, root: Path) -> Settings:
    """The same tables and rules, on local disk under root."""
    local = settings.on_local_files(root / "lake")
    return replace(local, ingest=replace(settings.ingest, checkpoint_location=str(root / "checkpoint")))


def warm_up(
    spark: SparkSession, settings: Settings, writer: Callable[[Settings, LakeTables], BatchBody]
) -> float | None:
    """Run one batch of synthetic messages through writer(scratch settings, scratch tables); its wall seconds.

    It only saves time, so a failure (a rule whose action is `fail` matching the malformed message, a full disk)
    is logged and the job starts without it: None.
    """
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="iotlake-warmup-"))
    context = spark.sparkContext
    try:
        scratch = scratch_settings(settings, root)
        tables = LakeTables(spark, scratch)
        tables.ensure()
        version = settings.validation.schema_versions[0]
        raw: DataFrame = spark.createDataFrame(messages(datetime.now(UTC), version), RAW_SCHEMA)
        context.setLocalProperty(QUERY_ID_PROPERTY, f"warmup-{int(time.time() * 1000)}")
        writer(scratch, tables)(raw, 0)
    except Exception as e:  # an optimisation: the job starts without it
        log.warning("warm-up batch failed, starting without it: %s", first_line(e))
        return None
    finally:
        context.setLocalProperty(QUERY_ID_PROPERTY, None)  # type: ignore[arg-type]
        shutil.rmtree(root, ignore_errors=True)
    seconds = time.monotonic() - started
    log.info("warm-up batch of %d messages into scratch tables: %.1f s", MESSAGES, seconds)
    return seconds
