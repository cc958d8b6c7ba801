"""`TableOps.delete_device` on local Delta tables (local Spark, no services): retries lost races and reports them,
gives up naming what it already purged, reads only the device's partitions, matches quarantine on the Kafka key
or the payload's device_id.

A lost race is injected by making `DeltaTable.delete` raise Delta's conflict before it runs (the real race is in
tests/integration/test_delete_device_live.py); everything else is real Delta.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from streaming.core.config import Settings
from streaming.core.errors import ConcurrentWriteError
from streaming.lake.ops import QUARANTINE_MATCH, TableOps
from streaming.pipeline import batch
from streaming.pipeline.rules import Rules
from streaming.pipeline.tables import LakeTables
from tests.unit.test_batch import NOW, NOW_MS, RAW_SCHEMA, encode, event
from tests.unit.test_tables import write

pytestmark = pytest.mark.unit

DAY_MS = 86_400_000


class ConcurrentAppendException(Exception):
    """Named like delta-spark's own class, which is what `is_conflict` recognises."""


@pytest.fixture(scope="module")
def written(spark: SparkSession, local_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the tables every test starts from, written once: d1 on two dates, d2 on those and a third;
    quarantine rows keyed and carrying devices in every mix."""
    root = tmp_path_factory.mktemp("ops-delete")
    tables = LakeTables(spark, local_settings.on_local_files(root))
    tables.ensure()
    d1 = [event(event_id=f"d1-{i}", device_id="d1", seq=i, event_time=NOW_MS - 1000 - (i % 2) * DAY_MS) for i in (1, 2)]
    d2 = [event(event_id=f"d2-{i}", device_id="d2", seq=i, event_time=NOW_MS - 1000 - i * DAY_MS) for i in (0, 1, 2)]
    write(tables, spark, 0, d1 + d2)
    hot = {"air_temperature_c": 500.0}
    messages: list[tuple[bytes | None, bytes]] = [
        (b"d1", encode(event(event_id="q1", device_id="d1", **hot))),  # key and payload
        (b"relay", encode(event(event_id="q2", device_id="d1", **hot))),  # payload only
        (None, encode(event(event_id="q3", device_id="d1", **hot))),  # payload, no key
        (b"d1", encode(event(event_id="q4", device_id="d2", **hot))),  # key only
        (b"d1", b"not json"),  # key only, no payload to read
        (b"relay", encode(event(event_id="q6", device_id="d2", **hot))),  # neither
        (b"relay", b'{"device_id": "d1"'),  # broken JSON naming d1: not matched on text
    ]
    raw = spark.createDataFrame([(k, v, "t", 0, n, NOW) for n, (k, v) in enumerate(messages)], RAW_SCHEMA)
    info = batch.BatchInfo(1, NOW)
    tables.append_quarantine(batch.quarantine(batch.validate(raw, Rules.from_settings(tables.settings), info)), None)
    return root


@pytest.fixture
def lake(spark: SparkSession, local_settings: Settings, written: Path, tmp_path: Path) -> LakeTables:
    """The test's own copy of the written tables (a Delta log names its files relative to the table)."""
    shutil.copytree(written, tmp_path / "lake")
    return LakeTables(spark, local_settings.on_local_files(tmp_path / "lake"))


def ops_for(spark: SparkSession, lake: LakeTables) -> TableOps:
    return TableOps(spark, lake.settings)


def rows(spark: SparkSession, uri: str) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark.read.format("delta").load(uri).collect()]


@pytest.fixture
def lose_races(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Callable[[int], bool]], list[int]]]:
    """Make the n-th DeltaTable.delete call (1-based) raise Delta's conflict when `loses(n)`; returns the calls."""

    def install(loses: Callable[[int], bool]) -> list[int]:
        calls: list[int] = []
        original = DeltaTable.delete

        def delete(self: DeltaTable, condition: Any = None) -> None:
            calls.append(len(calls) + 1)
            if loses(len(calls)):
                raise ConcurrentAppendException("[DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] Files were added")
            original(self, condition)

        monkeypatch.setattr(DeltaTable, "delete", delete)
        return calls

    yield install


def test_a_lost_race_is_retried_with_backoff_and_counted(
    spark: SparkSession, lake: LakeTables, lose_races: Callable[[Callable[[int], bool]], list[int]]
) -> None:
    calls = lose_races(lambda n: n in (1, 2))  # readings loses twice, then wins
    waits: list[float] = []
    report = ops_for(spark, lake).delete_device("d1", sleep=waits.append)
    tables = {t.table: t for t in report.tables}
    assert {name: t.retries for name, t in tables.items()} == {"readings": 2, "device_state": 0, "quarantine": 0}
    assert report.retries == 2 and report.as_dict()["retries"] == 2
    assert waits == [0.5, 1.0] and len(calls) == 5
    assert tables["readings"].rows_deleted == 2 and tables["readings"].commit_version is not None
    assert not any(r["device_id"] == "d1" for r in rows(spark, lake.readings_uri))


def test_after_the_last_attempt_it_gives_up_naming_what_it_purged(
    spark: SparkSession, lake: LakeTables, lose_races: Callable[[Callable[[int], bool]], list[int]]
) -> None:
    lose_races(lambda n: n > 1)  # readings wins, device_state loses every race
    readings_version = lake.version(lake.readings_uri) + 1
    with pytest.raises(ConcurrentWriteError) as error:
        ops_for(spark, lake).delete_device("d1", attempts=3, sleep=lambda s: None)
    message = str(error.value)
    assert message.startswith("device_state: the DELETE of device 'd1' lost to another writer's commit 3 times")
    assert f"Already purged: readings (version {readings_version})" in message
    assert "Not purged yet: device_state, quarantine" in message
    assert "iotlake delete-device d1 --yes" in message and "--attempts" in message
    assert not any(r["device_id"] == "d1" for r in rows(spark, lake.readings_uri))
    assert any(r["device_id"] == "d1" for r in rows(spark, lake.device_state_uri))


def test_the_delete_reads_only_the_partitions_holding_the_device(spark: SparkSession, lake: LakeTables) -> None:
    report = ops_for(spark, lake).delete_device("d1")
    tables = {t.table: t for t in report.tables}
    assert tables["readings"].partitions == 2  # d1's two dates, not d2's third
    assert tables["device_state"].partitions is None  # unpartitioned
    commit = DeltaTable.forPath(spark, lake.readings_uri).history(1).first()
    assert commit is not None and commit["operation"] == "DELETE"
    predicate = json.loads(commit["operationParameters"]["predicate"])[0]
    assert "event_date" in predicate and "d1" in predicate
    assert sorted(r["event_id"] for r in rows(spark, lake.readings_uri)) == ["d2-0", "d2-1", "d2-2"]


def test_quarantine_is_matched_on_the_key_or_the_payloads_device_id(spark: SparkSession, lake: LakeTables) -> None:
    report = ops_for(spark, lake).delete_device("d1")
    quarantine = next(t for t in report.tables if t.table == "quarantine")
    assert quarantine.matched_on == QUARANTINE_MATCH == "raw_key or value_text $.device_id"
    assert quarantine.rows_deleted == 5
    left = {(r["raw_key"], r["value_text"]) for r in rows(spark, lake.quarantine_uri)}
    assert {(k, json.loads(v)["event_id"] if v.endswith("}") else v) for k, v in left} == {
        (b"relay", "q6"),
        (b"relay", '{"device_id": "d1"'),
    }


def test_rows_that_arrive_beside_the_delete_are_reported_as_remaining(
    spark: SparkSession, lake: LakeTables, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reading of the device committed after the DELETE chose its partitions survives it: the report says so."""
    original = DeltaTable.delete
    late = event(event_id="d1-late", device_id="d1", seq=9, event_time=NOW_MS - 1000 - 5 * DAY_MS)

    def delete(self: DeltaTable, condition: Any = None) -> None:
        if self.detail().first()["location"].rstrip("/").endswith("/readings"):
            write(lake, spark, 5, [late])  # another writer, between the DELETE's scan and its transaction
        original(self, condition)

    monkeypatch.setattr(DeltaTable, "delete", delete)
    report = ops_for(spark, lake).delete_device("d1")
    tables = {t.table: t for t in report.tables}
    assert tables["readings"].rows_remaining == 1 and tables["device_state"].rows_remaining == 0
    assert [r["event_id"] for r in rows(spark, lake.readings_uri) if r["device_id"] == "d1"] == ["d1-late"]
