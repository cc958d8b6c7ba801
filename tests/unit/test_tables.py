"""Delta writes on a local folder: dedup MERGE, SEQUENCE BY upsert, and transaction ids making replays no-ops."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.storagelevel import StorageLevel

from streaming.core.config import Settings
from streaming.core.errors import CheckpointError
from streaming.core.hadoop_fs import HadoopFiles
from streaming.pipeline import batch
from streaming.pipeline.batch import MAX_TIME_RANGES, time_ranges
from streaming.pipeline.batch_clock import CLOCK_DIR, PRUNE_EVERY, RETAINED, BatchClocks
from streaming.pipeline.ingest import BatchWriter
from streaming.pipeline.metrics import IngestMetrics
from streaming.pipeline.rules import Rules
from streaming.pipeline.tables import LakeTables, Txn, readings_merge_condition
from tests.unit.test_batch import NOW, NOW_MS, encode, event, kafka_rows

pytestmark = pytest.mark.unit


@pytest.fixture
def tables(spark: SparkSession, local_settings: Settings, tmp_path: Path) -> LakeTables:
    settings = local_settings.on_local_files(tmp_path)
    lake = LakeTables(spark, settings)
    lake.ensure()
    return lake


def write(
    lake: LakeTables, spark: SparkSession, batch_id: int, events: list[dict], txn: bool = True, ids: bool = True
) -> None:
    """One batch the way the job writes it: the validated batch and its readings cached, the stats giving the
    MERGE's literal dates, event-time ranges and event-id range (`ids=False`: without the id range). Uncached, each
    MERGE plans and runs the validation again."""
    rules = Rules.from_settings(lake.settings)
    info = batch.BatchInfo(batch_id, NOW)
    raw = kafka_rows(spark, [encode(e) for e in events])
    validated = batch.validate(raw, rules, info).persist(StorageLevel.MEMORY_AND_DISK)
    rows = batch.readings(validated, rules).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        stats = batch.summarize(batch.batch_stats(validated).collect(), rules)
        ranges = time_ranges(stats.buckets)
        lake.merge_readings(
            rows,
            stats.dates,
            ranges,
            Txn("q-readings", batch_id) if txn else None,
            False,
            stats.id_range if ids else None,
        )
        lake.upsert_device_state(
            batch.latest_per_device(rows), Txn("q-device_state", batch_id) if txn else None, evolve=False
        )
    finally:
        rows.unpersist()
        validated.unpersist()


def test_tables_are_created_with_properties_partitions_and_comments(spark: SparkSession, tables: LakeTables) -> None:
    detail = DeltaTable.forPath(spark, tables.readings_uri).detail().first()
    assert detail.partitionColumns == ["event_date"]
    assert detail.properties["delta.enableChangeDataFeed"] == "true"
    assert detail.properties["delta.deletedFileRetentionDuration"] == "interval 7 days"
    schema = DeltaTable.forPath(spark, tables.quarantine_uri).toDF().schema
    assert schema["reasons"].metadata["comment"] == "Every rule the record failed"
    tables.ensure()  # idempotent
    assert DeltaTable.forPath(spark, tables.readings_uri).history().count() == 1


def test_readings_merge_ignores_events_already_in_the_table(spark: SparkSession, tables: LakeTables) -> None:
    write(tables, spark, 0, [event(event_id="a"), event(event_id="b", seq=2)])
    write(tables, spark, 1, [event(event_id="b", seq=2), event(event_id="c", seq=3)])
    ids = sorted(r.event_id for r in spark.read.format("delta").load(tables.readings_uri).collect())
    assert ids == ["a", "b", "c"]


def test_the_dedup_key_is_event_id_and_event_time_across_batches_and_dates(
    spark: SparkSession, tables: LakeTables
) -> None:
    """A re-send (same event_id and event_time) is stored once; the same event_id at another time is another reading."""
    t1 = NOW_MS - 1000
    same_bucket, other_day = t1 - 60_000, t1 - 86_400_000
    write(tables, spark, 0, [event(event_id="x", event_time=t1)])
    write(
        tables,
        spark,
        1,
        [event(event_id="x", event_time=same_bucket, seq=2), event(event_id="x", event_time=other_day)],
    )
    write(tables, spark, 2, [event(event_id="x", event_time=t1), event(event_id="x", event_time=other_day, seq=3)])
    write(tables, spark, 3, [event(event_id="x", event_time=same_bucket, seq=4)] * 2)
    rows = spark.read.format("delta").load(tables.readings_uri).collect()
    stored = sorted((r.event_id, int(r.event_time.timestamp() * 1000), r.seq) for r in rows)
    assert stored == [("x", other_day, 1), ("x", same_bucket, 2), ("x", t1, 1)]


def test_replayed_batch_changes_nothing(spark: SparkSession, tables: LakeTables) -> None:
    write(tables, spark, 0, [event(event_id="a", seq=1)])
    versions = (tables.version(tables.readings_uri), tables.version(tables.device_state_uri))
    # Same batch id, different content: with the transaction id Delta must skip both writes.
    write(tables, spark, 0, [event(event_id="z", seq=9, event_time=NOW_MS)])
    assert (tables.version(tables.readings_uri), tables.version(tables.device_state_uri)) == versions
    assert [r.event_id for r in spark.read.format("delta").load(tables.readings_uri).collect()] == ["a"]
    # Without it, the replay is written: the negative control for the check above.
    write(tables, spark, 0, [event(event_id="z", seq=9, event_time=NOW_MS)], txn=False)
    assert spark.read.format("delta").load(tables.readings_uri).count() == 2


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata"])
def test_a_resent_event_is_found_under_any_local_timezone(
    spark: SparkSession, tables: LakeTables, zone: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MERGE's event-time ranges must not move with the Python process's timezone (the session is UTC)."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        write(tables, spark, 0, [event(event_id="a"), event(event_id="b", seq=2)])
        write(tables, spark, 1, [event(event_id="a"), event(event_id="c", seq=3)])
        ids = sorted(r.event_id for r in spark.read.format("delta").load(tables.readings_uri).collect())
    finally:
        monkeypatch.undo()
        time.tzset()
    assert ids == ["a", "b", "c"]


def test_device_state_never_goes_back_in_time(spark: SparkSession, tables: LakeTables) -> None:
    write(tables, spark, 0, [event(event_id="new", device_id="d1", seq=5, event_time=NOW_MS - 1000)])
    write(tables, spark, 1, [event(event_id="late", device_id="d1", seq=6, event_time=NOW_MS - 3_600_000)])
    write(tables, spark, 2, [event(event_id="d2-first", device_id="d2", seq=1)])
    state = {r.device_id: r.event_id for r in spark.read.format("delta").load(tables.device_state_uri).collect()}
    assert state == {"d1": "new", "d2": "d2-first"}
    write(tables, spark, 3, [event(event_id="newer", device_id="d1", seq=7, event_time=NOW_MS - 10)])
    state = {r.device_id: r.event_id for r in spark.read.format("delta").load(tables.device_state_uri).collect()}
    assert state["d1"] == "newer"


@pytest.mark.parametrize("batches", [[["a", "b"]], [["a"], ["b"]], [["b"], ["a"]]], ids=["one", "a-b", "b-a"])
def test_equal_event_time_and_seq_are_broken_by_one_rule_within_and_across_batches(
    spark: SparkSession, tables: LakeTables, batches: list[list[str]]
) -> None:
    """Two readings of one device with the same (event_time, seq): the larger event_id wins, however batched."""
    for batch_id, ids in enumerate(batches):
        write(tables, spark, batch_id, [event(event_id=i, device_id="d1", seq=4, event_time=NOW_MS - 10) for i in ids])
    state = spark.read.format("delta").load(tables.device_state_uri).collect()
    assert [(r.device_id, r.event_id) for r in state] == [("d1", "b")]


def test_merge_condition_carries_literal_partitions_time_ranges_and_the_id_range(spark: SparkSession) -> None:
    low = int(datetime(2026, 11, 30, 1, tzinfo=UTC).timestamp() * 1000)
    hour = 3_600_000
    ranges = [(low, low + hour), (low + 5 * hour, low + 6 * hour)]
    cond = readings_merge_condition([date(2026, 11, 30), date(2026, 11, 29), date(2026, 11, 30)], ranges, ("a", "b"))
    text = str(cond)
    assert "and(>=(t.event_id, 'a'), <=(t.event_id, 'b'))" in text
    assert "in(t.event_date, 2026-11-29, 2026-11-30)" in text  # literal, sorted, deduplicated
    assert f">=(t.event_time, timestamp_millis({low}L))" in text
    assert f"<=(t.event_time, timestamp_millis({low + hour}L))" in text
    assert f">=(t.event_time, timestamp_millis({low + 5 * hour}L))" in text and "or(" in text
    assert "=(t.event_id, s.event_id)" in text


def test_a_late_reading_with_a_newer_id_never_opens_files_of_older_ids(spark: SparkSession, tables: LakeTables) -> None:
    """Ids in send order: a late reading's time overlaps every file, its id range only the newer ones."""
    hour = 3_600_000
    write(tables, spark, 0, [event(event_id="a-1", event_time=NOW_MS - 2 * hour), event(event_id="a-2", seq=2)])
    older_files = spark.read.format("delta").load(tables.readings_uri).inputFiles()
    write(tables, spark, 1, [event(event_id="b-1", seq=3, event_time=NOW_MS - 3 * hour), event(event_id="b-2", seq=4)])
    for uri in older_files:  # batch 0's files: reading one now fails the MERGE
        Path(uri.removeprefix("file:")).unlink()
    late = [
        event(event_id="c-1", seq=5, event_time=NOW_MS - 2 * hour + 1000),
        event(event_id="b-1", seq=3, event_time=NOW_MS - 3 * hour),
    ]
    # The negative control: by dates and time ranges alone, the MERGE opens batch 0's files.
    with pytest.raises(Exception, match=r"(?i)not.*exist|FileNotFound"):
        write(tables, spark, 2, late, txn=False, ids=False)
    write(tables, spark, 2, late)
    newer = spark.read.format("delta").load(tables.readings_uri).where("event_id >= 'b'")
    assert sorted(r.event_id for r in newer.collect()) == ["b-1", "b-2", "c-1"]  # b-1's re-send found


@pytest.mark.parametrize(
    "prefix",
    [
        "0190a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b-",
        "é-",
        "z" * 40,
        "p" * 31 + "\U0001f600",
        "p" * 32 + "\U0001f600",
        "q" * 70,
    ],
    ids=[
        "longer than the statistics' 32 characters",
        "non-ASCII",
        "one character repeated",
        "a character beyond U+FFFF across the 32nd",
        "a character beyond U+FFFF after the 32nd",
        "longer than Parquet's 64-byte page statistics",
    ],
)
def test_a_resent_event_at_either_end_of_the_batchs_id_range_is_found(
    spark: SparkSession, tables: LakeTables, prefix: str
) -> None:
    """Delta keeps the first 32 characters of a string in its file statistics, Parquet the first 64 bytes in its
    page statistics; the range must still find both ends."""
    write(tables, spark, 0, [event(event_id=f"{prefix}5"), event(event_id=f"{prefix}7", seq=2)])
    write(tables, spark, 1, [event(event_id=f"{prefix}5"), event(event_id=f"{prefix}6", seq=3)])  # the smallest
    write(tables, spark, 2, [event(event_id=f"{prefix}7", seq=2), event(event_id=f"{prefix}1", seq=4)])  # the largest
    ids = sorted(r.event_id for r in spark.read.format("delta").load(tables.readings_uri).collect())
    assert ids == [f"{prefix}{n}" for n in (1, 5, 6, 7)]


def test_time_ranges_join_contiguous_buckets_and_cap_their_number() -> None:
    width = 600_000
    base = 2_900_000  # bucket numbers: epoch ms // width
    ranges = time_ranges([base, base + 1, base + 2, base + 30, base + 2], width)
    assert ranges == [(base * width, (base + 3) * width - 1), ((base + 30) * width, (base + 31) * width - 1)]
    many = time_ranges(range(base, base + 200, 2), width)  # 100 isolated buckets
    assert len(many) == MAX_TIME_RANGES
    assert many[0][0] == base * width
    assert many[-1][1] == (base + 199) * width - 1
    assert time_ranges([]) == []


def test_merge_condition_never_splices_message_text(spark: SparkSession, tables: LakeTables) -> None:
    evil = "x') OR 1=1 --"
    write(tables, spark, 0, [event(event_id="keep")])
    write(tables, spark, 1, [event(event_id=evil, device_id=evil, seq=2)])
    ids = sorted(r.event_id for r in spark.read.format("delta").load(tables.readings_uri).collect())
    assert ids == ["keep", evil]


def test_quarantine_append_is_idempotent_per_transaction(spark: SparkSession, tables: LakeTables) -> None:
    rules = Rules.from_settings(tables.settings)
    info = batch.BatchInfo(0, NOW)
    bad = batch.quarantine(batch.validate(kafka_rows(spark, [b"nope", b""]), rules, info))
    tables.append_quarantine(bad, Txn("q-quarantine", 0))
    tables.append_quarantine(bad, Txn("q-quarantine", 0))
    assert spark.read.format("delta").load(tables.quarantine_uri).count() == 2


def test_a_batch_clock_is_recorded_once_and_read_back_on_replay(spark: SparkSession, tmp_path: Path) -> None:
    clock = [datetime(2026, 11, 30, 12, 0, 0, 123456, tzinfo=UTC)]
    files = HadoopFiles(spark, str(tmp_path / "checkpoint"))
    first = BatchClocks(files, lambda: clock[0]).for_batch(5)
    assert first == datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC)
    clock[0] = clock[0] + timedelta(days=8)  # the replay, by a restarted job, runs much later
    restarted = BatchClocks(files, lambda: clock[0])
    assert restarted.for_batch(5) == first
    assert restarted.for_batch(6) == datetime(2026, 12, 8, 12, 0, 0, 123000, tzinfo=UTC)
    # A record cut short by a kill is written again, not trusted.
    (tmp_path / "checkpoint" / "iotlake" / "clock" / "7").write_text('{"now_')
    assert restarted.recorded(7) is None
    assert BatchClocks(files, lambda: clock[0]).for_batch(7) == restarted.for_batch(6)


def test_batch_clocks_older_than_the_retained_window_are_pruned(spark: SparkSession, tmp_path: Path) -> None:
    files = HadoopFiles(spark, str(tmp_path / "checkpoint"))
    clocks = BatchClocks(files, lambda: datetime(2026, 11, 30, tzinfo=UTC))
    for batch_id in range(0, RETAINED + PRUNE_EVERY + 1):
        clocks.for_batch(batch_id)
    kept = sorted(int(n) for n in files.names(CLOCK_DIR) if n.isdigit())
    assert kept == list(range(PRUNE_EVERY + 1, RETAINED + PRUNE_EVERY + 1))


def test_a_batch_outside_a_streaming_query_is_refused_not_given_a_constant_id(
    spark: SparkSession, tables: LakeTables, tmp_path: Path
) -> None:
    """A constant app id after a checkpoint reset would make batches 0, 1, ... look committed: no silent default."""
    settings = replace(tables.settings, ingest=replace(tables.settings.ingest, checkpoint_location=str(tmp_path)))
    writer = BatchWriter(spark, settings, tables, IngestMetrics())
    with pytest.raises(CheckpointError, match="query id is missing"):
        writer(kafka_rows(spark, [encode(event())]), 0)
    assert spark.read.format("delta").load(tables.readings_uri).count() == 0


def test_a_batch_of_the_same_shape_as_the_last_reuses_its_generated_code(
    spark: SparkSession, tables: LakeTables
) -> None:
    """Spark's cache of compiled classes holds a whole batch's: the next batch of the same shape compiles little.

    One batch (validation, stats, readings MERGE, device_state MERGE and Delta's snapshot queries) compiles about 130
    distinct classes. Spark's default cache of 100 evicted each batch's classes before the next batch asked for them,
    so every batch compiled them all again: 120-150 Janino compilations, 1.4-3.2 s of a 10-message batch.
    """
    compilations = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()

    def events(b: int) -> list[dict]:
        return [event(event_id=f"e-{b}-{i}", device_id=f"d-{i % 3}", seq=b * 10 + i) for i in range(10)]

    for b in range(3):
        write(tables, spark, b, events(b))
    before = compilations.getCount()
    write(tables, spark, 3, events(3))
    compiled = compilations.getCount() - before
    # 2 here; 143 with Spark's default cache. What may still compile: code that holds this batch's own literals.
    assert compiled <= 20, f"{compiled} classes compiled for a batch like the last"
