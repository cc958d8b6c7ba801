"""device_state folded across batches: the same table as one upsert per batch, and caught up from readings."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.storagelevel import StorageLevel

from streaming.core.config import Settings
from streaming.lake.ops import TableOps
from streaming.pipeline import batch
from streaming.pipeline.batch import time_ranges
from streaming.pipeline.device_state import DeviceStateFolder, PurgeRepair, catch_up
from streaming.pipeline.rules import Rules
from streaming.pipeline.tables import LakeTables, Txn
from tests.unit.test_batch import NOW, NOW_MS, encode, event, kafka_rows

pytestmark = pytest.mark.unit

APP = "q-device_state"
HOUR_MS = 3_600_000


def lake(spark: SparkSession, settings: Settings, root: Path) -> LakeTables:
    tables = LakeTables(spark, settings.on_local_files(root))
    tables.ensure()
    return tables


def validated_batch(spark: SparkSession, rules: Rules, batch_id: int, events: list[dict]) -> tuple[Any, Any]:
    """One batch validated, and its readings rows cached as the job caches them; each batch has its own clock."""
    info = batch.BatchInfo(batch_id, NOW + timedelta(seconds=batch_id))
    validated = batch.validate(kafka_rows(spark, [encode(e) for e in events]), rules, info)
    return validated, batch.readings(validated, rules).persist(StorageLevel.MEMORY_AND_DISK)


def batch_rows(spark: SparkSession, rules: Rules, batch_id: int, events: list[dict]) -> Any:
    """One batch's readings rows, cached (its ingest_time is NOW + batch_id seconds)."""
    return validated_batch(spark, rules, batch_id, events)[1]


def merge_readings(tables: LakeTables, spark: SparkSession, batch_id: int, events: list[dict]) -> None:
    """One batch's readings MERGE, under its transaction id."""
    rules = Rules.from_settings(tables.settings)
    validated, rows = validated_batch(spark, rules, batch_id, events)
    try:
        stats = batch.summarize(batch.batch_stats(validated).collect(), rules)
        tables.merge_readings(
            rows, stats.dates, time_ranges(stats.buckets), Txn("q-readings", batch_id), False, stats.id_range
        )
    finally:
        rows.unpersist()


def device_state(spark: SparkSession, tables: LakeTables) -> list[dict]:
    rows = spark.read.format("delta").load(tables.device_state_uri).collect()
    return sorted((r.asDict() for r in rows), key=lambda r: r["device_id"])


def txn_versions(spark: SparkSession, tables: LakeTables) -> list[int]:
    """The transaction versions device_state's commits recorded, oldest first."""
    log = spark.read.json(f"{tables.device_state_uri}/_delta_log/*.json").where("txn is not null")
    return sorted(r.txn.version for r in log.select("txn").collect())


def upserter(tables: LakeTables) -> Any:
    return lambda rows, txn: tables.upsert_device_state(rows, txn, evolve=False)


BATCHES = [
    # dev-0 moves on each batch; dev-1's newest event is re-sent in batch 2 (an exact tie, with a later ingest
    # time: the earlier batch's row must stay); a late event never wins; dev-2 has two events with the same time
    # and seq, one per batch, decided by event_id.
    [event(event_id="a0", device_id="dev-0", seq=1), event(event_id="b1", device_id="dev-1", seq=1)],
    [
        event(event_id="a1", device_id="dev-0", seq=2, event_time=NOW_MS - 1000),
        event(event_id="b2", device_id="dev-1", seq=2, event_time=NOW_MS - 500),
        event(event_id="b0", device_id="dev-1", seq=0, event_time=NOW_MS - HOUR_MS),
        event(event_id="c1", device_id="dev-2", seq=5, event_time=NOW_MS - 900),
    ],
    [
        event(event_id="b2", device_id="dev-1", seq=2, event_time=NOW_MS - 500),
        event(event_id="a2", device_id="dev-0", seq=3, event_time=NOW_MS - 800),
        event(event_id="c2", device_id="dev-2", seq=5, event_time=NOW_MS - 900),
    ],
    [event(event_id="a-late", device_id="dev-0", seq=1, event_time=NOW_MS - HOUR_MS)],
]


def test_folded_batches_give_the_table_one_upsert_per_batch_gives(
    spark: SparkSession, local_settings: Settings, tmp_path: Path
) -> None:
    each, folded = lake(spark, local_settings, tmp_path / "each"), lake(spark, local_settings, tmp_path / "folded")
    rules = Rules.from_settings(each.settings)
    now = [100.0]
    every_batch = DeviceStateFolder(upserter(each), 0)
    per_interval = DeviceStateFolder(upserter(folded), 2.5, clock=lambda: now[0])
    assert not per_interval.due() and per_interval.flush() is None, "nothing folded, nothing to upsert"
    upserted: list[bool] = []
    first_rows: dict[str, Any] = {}
    for batch_id, events in enumerate(BATCHES):  # one a second: at 100, 101, 102 and 103 s
        rows = batch_rows(spark, rules, batch_id, events)
        try:
            every_batch.add(rows, Txn(APP, batch_id))
            upserted.append(per_interval.add(rows, Txn(APP, batch_id)) is not None)
            for row in rows.collect():
                first_rows.setdefault(row.event_id, row)
        finally:
            rows.unpersist()
        now[0] += 1.0
    assert upserted == [True, False, False, True], "the first batch at once, then batches 1-3 once 2.5 s passed"
    assert per_interval.pending == 0 and per_interval.flush() is None

    got, want = device_state(spark, folded), device_state(spark, each)
    assert got == want
    assert [(r["device_id"], r["event_id"]) for r in want] == [("dev-0", "a2"), ("dev-1", "b2"), ("dev-2", "c2")]
    assert want[1]["ingest_time"] == first_rows["b2"].ingest_time, "the re-sent event keeps its first batch's row"
    assert txn_versions(spark, each) == [0, 1, 2, 3]
    assert txn_versions(spark, folded) == [0, 3], "one upsert for batches 1-3, as the newest batch's transaction"


def test_catch_up_upserts_the_readings_of_the_batches_device_state_lacks(
    spark: SparkSession, local_settings: Settings, tmp_path: Path
) -> None:
    tables = lake(spark, local_settings, tmp_path)
    for batch_id in range(3):  # dev-0 only in batch 0, dev-1 only in 1, dev-2 only in 2
        merge_readings(tables, spark, batch_id, [event(event_id=f"e{batch_id}", device_id=f"dev-{batch_id}")])
    upsert = upserter(tables)

    assert catch_up(spark, tables, upsert, APP, readings_version=2, device_state_version=0) == 2
    assert [r["device_id"] for r in device_state(spark, tables)] == ["dev-1", "dev-2"], "batches 1 and 2 only"
    assert txn_versions(spark, tables) == [2]

    commits = DeltaTable.forPath(spark, tables.device_state_uri).history().count()
    assert catch_up(spark, tables, upsert, APP, readings_version=2, device_state_version=2) is None
    assert catch_up(spark, tables, upsert, APP, readings_version=None, device_state_version=None) is None
    assert DeltaTable.forPath(spark, tables.device_state_uri).history().count() == commits, "nothing to catch up"

    assert catch_up(spark, tables, upsert, "another-query", readings_version=2, device_state_version=None) == 2
    assert [r["device_id"] for r in device_state(spark, tables)] == ["dev-0", "dev-1", "dev-2"]


def test_a_device_purged_beside_the_stream_does_not_come_back_from_folded_rows(
    spark: SparkSession, local_settings: Settings, tmp_path: Path
) -> None:
    """dev-0's batch-1 reading is folded when `iotlake delete-device dev-0` purges readings and device_state; the
    next upsert carries it, and the repair after it takes the device out again. Once dev-0 sends again, it is back."""
    tables = lake(spark, local_settings, tmp_path)
    repaired: list[set[str]] = []
    repair = PurgeRepair(spark, tables, lambda: False, lambda write: write())
    folder = DeviceStateFolder(upserter(tables), 3600, after_upsert=lambda: repaired.append(repair()))

    def run_batch(batch_id: int, events: list[dict]) -> None:
        merge_readings(tables, spark, batch_id, events)
        rules = Rules.from_settings(tables.settings)
        rows = batch_rows(spark, rules, batch_id, events)
        folder.add(rows, Txn(APP, batch_id))
        rows.unpersist()

    run_batch(0, [event(event_id="a0", device_id="dev-0", seq=1), event(event_id="b0", device_id="dev-1", seq=1)])
    run_batch(1, [event(event_id="a1", device_id="dev-0", seq=2), event(event_id="b1", device_id="dev-1", seq=2)])
    assert folder.pending == 1
    report = TableOps(spark, tables.settings).delete_device("dev-0")
    assert {t.table: t.rows_deleted for t in report.tables} == {"readings": 2, "device_state": 1, "quarantine": 0}
    run_batch(2, [event(event_id="b2", device_id="dev-1", seq=3)])
    folder.flush()
    assert [(r["device_id"], r["event_id"]) for r in device_state(spark, tables)] == [("dev-1", "b2")]
    assert repaired == [set(), {"dev-0"}]

    run_batch(3, [event(event_id="a3", device_id="dev-0", seq=3)])  # the device sends again after its purge
    folder.flush()
    assert repaired[-1] == set(), "the purge was repaired once"
    assert [(r["device_id"], r["event_id"]) for r in device_state(spark, tables)] == [("dev-0", "a3"), ("dev-1", "b2")]
