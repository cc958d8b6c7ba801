"""The maintenance sidecar against real Spark + Delta on the test MinIO: compaction, VACUUM safety, metrics,
and the stream running beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable
from prometheus_client import CollectorRegistry
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming.core.config import Settings, load_settings
from streaming.core.errors import VacuumRefusedError
from streaming.core.storage import delta_rs_uri
from streaming.lake.maintenance import Maintainer
from streaming.lake.metrics import MaintenanceMetrics
from streaming.pipeline.schema import READINGS_COLUMNS
from streaming.pipeline.tables import LakeTables
from tests.integration.lake import assert_tables_match, explain, ingest, reader_options, simulate, trigger_cap

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APPENDS = 3
FILES_PER_APPEND = 20
ROWS_PER_APPEND = 3_000
DEVICES = 50


def _readings(spark: SparkSession, append: int, day: date) -> DataFrame:
    """ROWS_PER_APPEND readings of one day, in the readings table's columns."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    given = {
        "event_id": F.concat(F.lit(f"{day.isoformat()}-{append}-"), F.col("id").cast("string")),
        "device_id": F.concat(F.lit("dev-"), (F.col("id") % DEVICES).cast("string")),
        "parcel_id": F.concat(F.lit("parcel-"), (F.col("id") % 5).cast("string")),
        "seq": F.col("id") + append * ROWS_PER_APPEND,
        "event_time": F.lit(start) + F.make_interval(secs=F.col("id") % 86_000),
        "schema_version": F.lit(1),
        "air_temperature_c": F.rand(seed=append) * 30,
        "event_date": F.lit(day),
    }
    cols = [given.get(c.name, F.lit(None)).cast(c.type).alias(c.name) for c in READINGS_COLUMNS]
    return spark.range(ROWS_PER_APPEND).select(*cols)


def _files_read(spark: SparkSession, uri: str, device: str, day: date) -> int:
    """Files a one-device-one-day query reads (Delta skips the rest by partition and min/max statistics)."""
    rows = (
        spark.read.format("delta")
        .load(uri)
        .where((F.col("device_id") == device) & (F.col("event_date") == F.lit(day)))
        .select(F.input_file_name().alias("f"))
        .distinct()
        .collect()
    )
    return len(rows)


def _fingerprint(spark: SparkSession, uri: str) -> tuple[int, int, float]:
    row = (
        spark.read.format("delta")
        .load(uri)
        .agg(F.count("*"), F.bit_xor(F.xxhash64("event_id", "device_id", "seq")), F.sum("air_temperature_c"))
        .first()
    )
    assert row is not None
    return int(row[0]), int(row[1]), round(float(row[2]), 6)


def test_one_cycle_compacts_a_fragmented_table_and_keeps_every_row(spark: SparkSession, settings: Settings) -> None:
    tables = LakeTables(spark, settings)
    tables.ensure()
    closed_days = [date.today() - timedelta(days=3), date.today() - timedelta(days=4)]
    for day in closed_days:
        for append in range(APPENDS):
            _readings(spark, append, day).repartition(FILES_PER_APPEND).write.format("delta").mode("append").save(
                tables.readings_uri
            )
    before = _fingerprint(spark, tables.readings_uri)
    files_read_before = _files_read(spark, tables.readings_uri, "dev-7", closed_days[0])

    metrics = MaintenanceMetrics(registry=CollectorRegistry())
    maintainer = Maintainer(spark, settings, metrics)
    measured = maintainer.measure(settings.tables.readings)
    assert measured is not None
    files_before = measured.files
    assert files_before == len(closed_days) * APPENDS * FILES_PER_APPEND

    report = maintainer.cycle(vacuum=False)

    optimized = [r for r in report.optimized if r.table == "readings"]
    assert {r.partition for r in optimized} == {f"event_date={d.isoformat()}" for d in closed_days}
    assert all(r.outcome == "ok" and "closed partition" in r.reason for r in optimized), optimized
    measured = maintainer.measure(settings.tables.readings)
    assert measured is not None
    files_after = measured.files
    assert files_after * 10 <= files_before, (files_before, files_after)
    assert _fingerprint(spark, tables.readings_uri) == before, "compaction changed the rows"
    files_read_after = _files_read(spark, tables.readings_uri, "dev-7", closed_days[0])
    assert files_read_after * 10 <= files_read_before, (files_read_before, files_read_after)

    r = metrics.registry
    compacted = r.get_sample_value(
        "iot_maintenance_files_compacted_total", {"table": "readings", "operation": "optimize"}
    )
    assert compacted == files_before - files_after + sum(x.files_added for x in optimized)
    assert r.get_sample_value("iot_table_files", {"table": "readings"}) == files_after
    assert r.get_sample_value("iot_table_small_files", {"table": "readings"}) == files_after  # all still < 32 MiB
    history = spark.sql(f"DESCRIBE HISTORY delta.`{tables.readings_uri}`").where("operation = 'OPTIMIZE'")
    assert history.count() == len(closed_days)


def test_vacuum_below_retention_is_refused_and_runs_with_the_retention_asked_for(
    spark: SparkSession, settings: Settings
) -> None:
    LakeTables(spark, settings).ensure()
    metrics = MaintenanceMetrics(registry=CollectorRegistry())
    maintainer = Maintainer(spark, settings, metrics)
    with pytest.raises(VacuumRefusedError, match="below the table's deleted-file retention"):
        maintainer.vacuum(settings.tables.readings, retention_s=3600)
    result = maintainer.vacuum(settings.tables.readings)
    assert result.outcome == "ok" and result.retention_s == 7 * 86400
    longer = maintainer.vacuum(settings.tables.readings, retention_s=8 * 86400)
    assert longer.outcome == "ok" and longer.retention_s == 8 * 86400
    uri = LakeTables(spark, settings).readings_uri
    starts = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").where("operation = 'VACUUM START'").orderBy("version")
    retained = [r["operationParameters"].get("specifiedRetentionMillis") for r in starts.collect()]
    assert retained == [str(7 * 86400_000), str(8 * 86400_000)], "Delta used another retention than asked"
    health = maintainer.measure(settings.tables.readings)
    assert health is not None and health.last_vacuum_ms is not None, "VACUUM END is in the table's history"
    assert (
        metrics.registry.get_sample_value("iot_maintenance_runs_total", {"table": "readings", "operation": "vacuum"})
        == 2
    )


def test_iotlake_vacuum_below_retention_exits_2_naming_the_fix(test_env: dict[str, str], settings: Settings) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "streaming.cli", "vacuum", "readings", "--retention", "1 hour"],
        env=test_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, explain(result)
    assert "below the table's deleted-file retention" in result.stderr and "Traceback" not in result.stderr


def test_liquid_clustered_readings_are_ingested_and_clustered_by_the_sidecar(
    spark: SparkSession, test_env: dict[str, str], settings: Settings, stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    """With `cluster_by` instead of partitions + Z-ORDER, the stream MERGEs into a liquid-clustered table and
    one sidecar cycle runs OPTIMIZE on it (Delta clusters incrementally): fewer files, the same rows."""
    env = {
        **test_env,
        "IOTLAKE_TABLES__READINGS__PARTITION_BY": "[]",
        "IOTLAKE_TABLES__READINGS__ZORDER_BY": "[]",
        "IOTLAKE_TABLES__READINGS__CLUSTER_BY": "[device_id]",
        "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": trigger_cap(settings, 4_000, batches=8),  # several small files
        "IOTLAKE_MAINTENANCE__MIN_SMALL_FILES": "2",
        "IOTLAKE_MAINTENANCE__OPEN_PARTITION_MIN_SMALL_FILES": "4",  # a clustered table is always "open"
    }
    clustered = load_settings(env=env)  # the fixture's topic and base URI, readings clustered
    assert clustered.tables.readings.cluster_by == ("device_id",) and clustered.kafka.topic == settings.kafka.topic
    summary = simulate(clustered, tmp_path, "--duplicate-rate", "0.05", count=4_000)
    ingest(spark, env)
    assert_tables_match(clustered, stack_secrets, summary)

    uri = delta_rs_uri(clustered.storage.table_uri("readings"))
    table = DeltaTable(uri, storage_options=reader_options(clustered, stack_secrets))
    assert table.metadata().partition_columns == []
    assert "clustering" in (table.protocol().writer_features or []), table.protocol()
    files_before = len(table.file_uris())
    assert files_before >= 4, files_before

    result = subprocess.run(
        [sys.executable, "-m", "streaming.cli", "maintain", "--once", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, explain(result)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    optimized = [r for r in report["optimized"] if r["table"] == "readings"]
    assert [(r["partition"], r["outcome"]) for r in optimized] == [("", "ok")], optimized

    table.update_incremental()
    files_after = len(table.file_uris())
    assert files_after * 4 <= files_before, (files_before, files_after)
    optimize = [h for h in table.history() if h["operation"] == "OPTIMIZE"]
    assert len(optimize) == 1 and json.loads(optimize[0]["operationParameters"]["clusterBy"]) == ["device_id"]
    assert_tables_match(clustered, stack_secrets, summary)
