"""The three Delta tables: creation with their properties, and idempotent writes keyed by transaction ids."""

from __future__ import annotations

import logging
import operator
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from functools import reduce
from typing import TypeVar

from delta.tables import DeltaMergeBuilder, DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming.core.catalog import lake_tables
from streaming.core.config import Settings, TableConfig
from streaming.core.errors import is_conflict
from streaming.core.hadoop_fs import HadoopFiles
from streaming.pipeline.batch import DEVICE_ORDER, READING_KEY
from streaming.pipeline.schema import DEVICE_STATE_COLUMNS, QUARANTINE_COLUMNS, READINGS_COLUMNS
from streaming.pipeline.schema import Column as SchemaColumn

WRITE_ATTEMPTS = 8
MAX_RETRY_WAIT_S = 8.0
T = TypeVar("T")
log = logging.getLogger(__name__)
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
# A commit (00000000000000000000.json) or a checkpoint (…checkpoint.parquet, …checkpoint.<n>.<m>.parquet,
# the v2 …checkpoint.<uuid>.json) in _delta_log.
COMMIT_FILE = re.compile(r"^\d{20}\.(json|checkpoint\b.*)$")


def txn_app_id(query_id: str, table: str) -> str:
    """The Delta transaction app id of one table's writes by one streaming query (`table`: its key in the catalog)."""
    return f"{query_id}-{table}"


@dataclass(frozen=True)
class Txn:
    """Delta transaction identifier: (app_id, version) commits at most once per table."""

    app_id: str
    version: int


@dataclass(frozen=True)
class MergeResult:
    inserted: int = 0
    updated: int = 0
    skipped: bool = False  # nothing to write, or this transaction was already committed


def retry_on_conflict(
    write: Callable[[], T],
    table: str,
    on_conflict: Callable[[str], None],
    attempts: int = WRITE_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run a write; when it loses a conflict, wait (0.5 s, doubling to 8 s) and run it again, up to `attempts` times.

    Safe because every write carries its transaction id: a write that did commit is a no-op when repeated.
    """
    for attempt in range(1, attempts + 1):
        try:
            return write()
        except Exception as e:
            if attempt == attempts or not is_conflict(e):
                raise
            on_conflict(table)
            log.warning("%s: write conflict with another writer (attempt %d of %d), retrying", table, attempt, attempts)
            sleep(min(0.5 * 2 ** (attempt - 1), MAX_RETRY_WAIT_S))
    raise AssertionError("unreachable")


def readings_merge_condition(
    dates: Sequence[date], ranges: Sequence[tuple[int, int]], ids: tuple[str, str] | None = None
) -> Column:
    """The reading's key (event_id, event_time), narrowed by literal partition dates, event-time ranges and the
    batch's event-id range.

    The literals let Delta prune partitions and skip files by their min/max statistics, so a batch never scans the
    whole table. Late rows make the time ranges cover hours of files; the id range still skips those files when ids
    grow in send order (a counter, a ULID or UUIDv7 made when sent, the simulator's), as a late row's id is then
    newer than theirs. Built from typed values, never spliced into SQL text.
    """
    condition = reduce(operator.and_, [F.col(f"t.{k}") == F.col(f"s.{k}") for k in (*READING_KEY, "event_date")])
    if dates:
        condition = condition & F.col("t.event_date").isin([F.lit(d) for d in sorted(set(dates))])
    if ranges:
        within = [F.col("t.event_time").between(_timestamp(low), _timestamp(high)) for low, high in ranges]
        condition = condition & reduce(operator.or_, within)
    if ids is not None:
        condition = condition & F.col("t.event_id").between(F.lit(ids[0]), F.lit(ids[1]))
    return condition


def _timestamp(epoch_ms: int) -> Column:
    """A timestamp literal from epoch milliseconds: the same instant whatever the process's timezone."""
    return F.timestamp_millis(F.lit(epoch_ms))


def newer_than_target() -> Column:
    """SEQUENCE BY (event_time, seq, event_id): the source row replaces the target only when it is newer.

    The same order as batch.latest_per_device, so a tie is broken one way however the readings were batched.
    """
    newer = F.lit(False)
    for name in reversed(DEVICE_ORDER):
        s_col, t_col = F.col(f"s.{name}"), F.col(f"t.{name}")
        newer = (s_col > t_col) | ((s_col == t_col) & newer)
    return newer


def has_commit(log_names: Sequence[str]) -> bool:
    """True when a `_delta_log` listing holds a commit or a checkpoint: the table exists."""
    return any(COMMIT_FILE.match(name) or name == "_last_checkpoint" for name in log_names)


def clear_uncommitted_log(table: HadoopFiles) -> bool:
    """Remove a `_delta_log` that holds no commit (left by a kill during the table's creation); True if removed."""
    names = table.names("_delta_log")
    if not names or has_commit(names):
        return False
    log.warning("%s/_delta_log has no commit (%s): a creation cut short; removing it", table.directory, names)
    table.delete("_delta_log", recursive=True)
    return True


class LakeTables:
    """readings, device_state and quarantine under storage.base_uri."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        self.spark = spark
        self.settings = settings
        uris = {table.key: table.uri for table in lake_tables(settings)}
        self.readings_uri = uris["readings"]
        self.device_state_uri = uris["device_state"]
        self.quarantine_uri = uris["quarantine"]

    def ensure(self, on_created: Callable[[str], None] = lambda name: None) -> None:
        """Create missing tables with their columns, comments, partitioning and properties.

        Each table is created by one commit, so a kill between two tables leaves the earlier ones whole and the
        next start creates the rest. A kill during a table's first commit can leave a log with no commit in it
        (`_delta_log/_staged_commits/...`), which Delta reads as a table that is there and can't be opened:
        such a log is removed first, the table never existed.
        """
        t = self.settings.tables
        for uri in (self.readings_uri, self.device_state_uri, self.quarantine_uri):
            clear_uncommitted_log(HadoopFiles(self.spark, uri))
        self._create(self.readings_uri, READINGS_COLUMNS, t.readings, "One row per distinct reading")
        on_created(t.readings.name)
        self._create(self.device_state_uri, DEVICE_STATE_COLUMNS, t.device_state, "Newest reading per device")
        on_created(t.device_state.name)
        self._create(self.quarantine_uri, QUARANTINE_COLUMNS, t.quarantine, "Rejected records and why")
        on_created(t.quarantine.name)

    def _create(self, uri: str, columns: Sequence[SchemaColumn], spec: TableConfig, comment: str) -> None:
        builder = DeltaTable.createIfNotExists(self.spark).location(uri).comment(comment)
        for c in columns:
            builder = builder.addColumn(c.name, c.type, nullable=c.nullable, comment=c.comment)
        if spec.partition_by:
            builder = builder.partitionedBy(*spec.partition_by)
        if spec.cluster_by:
            builder = builder.clusterBy(*spec.cluster_by)
        t = self.settings.tables
        builder = (
            builder.property("delta.enableChangeDataFeed", "true")
            .property("delta.logRetentionDuration", t.log_retention)
            .property("delta.deletedFileRetentionDuration", t.deleted_file_retention)
        )
        builder.execute()

    def evolved_columns(self) -> tuple[SchemaColumn, ...]:
        """Columns schema evolution has added to readings (beyond the built-in ones)."""
        builtin = {c.name for c in READINGS_COLUMNS}
        schema = DeltaTable.forPath(self.spark, self.readings_uri).toDF().schema
        return tuple(
            SchemaColumn(f.name, f.dataType, f.metadata.get("comment", "")) for f in schema if f.name not in builtin
        )

    @contextmanager
    def _transaction(self, txn: Txn | None) -> Iterator[None]:
        """Set Delta's session-level transaction id for one MERGE, and always clear it afterwards."""
        if txn is None:
            yield
            return
        self.spark.conf.set(TXN_APP_ID, txn.app_id)
        self.spark.conf.set(TXN_VERSION, str(txn.version))
        try:
            yield
        finally:
            self.spark.conf.unset(TXN_APP_ID)
            self.spark.conf.unset(TXN_VERSION)

    def merge_readings(
        self,
        source: DataFrame,
        dates: Sequence[date],
        ranges: Sequence[tuple[int, int]],
        txn: Txn | None,
        evolve: bool,
        ids: tuple[str, str] | None = None,
    ) -> MergeResult:
        """Insert-only dedup MERGE: events already in the table (same key) are left alone. `dates`, `ranges` and
        `ids` must cover every source row (readings_merge_condition)."""
        target = DeltaTable.forPath(self.spark, self.readings_uri).alias("t")
        builder = target.merge(source.alias("s"), readings_merge_condition(dates, ranges, ids))
        if evolve:
            builder = builder.withSchemaEvolution()
        with self._transaction(txn):
            return _merge_result(builder.whenNotMatchedInsertAll().execute())

    def _device_state_merge(self, source: DataFrame, evolve: bool) -> DeltaMergeBuilder:
        """A MERGE of `source` into device_state on device_id, evolving the schema if asked."""
        target = DeltaTable.forPath(self.spark, self.device_state_uri).alias("t")
        builder = target.merge(source.alias("s"), F.col("t.device_id") == F.col("s.device_id"))
        return builder.withSchemaEvolution() if evolve else builder

    def upsert_device_state(self, source: DataFrame, txn: Txn | None, evolve: bool) -> MergeResult:
        """Upsert the newest reading per device; an older (late, out-of-order) one never wins."""
        builder = self._device_state_merge(source, evolve)
        builder = builder.whenMatchedUpdateAll(condition=newer_than_target()).whenNotMatchedInsertAll()
        with self._transaction(txn):
            return _merge_result(builder.execute())

    def replace_device_states(self, source: DataFrame, devices: Sequence[str], evolve: bool) -> MergeResult:
        """Make these devices' rows exactly `source` (their newest readings): update or insert them whatever their
        order, and delete those of the devices with no row in `source`."""
        builder = self._device_state_merge(source, evolve).whenMatchedUpdateAll().whenNotMatchedInsertAll()
        builder = builder.whenNotMatchedBySourceDelete(condition=F.col("t.device_id").isin(list(devices)))
        return _merge_result(builder.execute())

    def commits_after(self, uri: str, version: int) -> list[tuple[int, str | None]]:
        """(version, userMetadata) of the table's commits after `version`, oldest first.

        Delta reads one commit file per entry of history(n), so it asks for a few, then more while they fall short.
        """
        table = DeltaTable.forPath(self.spark, uri)
        look = 4
        while True:
            rows = table.history(look).select("version", "userMetadata").collect()
            if len(rows) < look or min(r["version"] for r in rows) <= version + 1:
                break
            look *= 4
        return sorted((int(r["version"]), r["userMetadata"]) for r in rows if r["version"] > version)

    def append_quarantine(self, rows: DataFrame, txn: Txn | None) -> None:
        """Append rejected records; the writer options make a replayed batch a no-op."""
        writer = rows.write.format("delta").mode("append")
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", str(txn.version))
        writer.save(self.quarantine_uri)

    def version(self, uri: str) -> int:
        history = DeltaTable.forPath(self.spark, uri).history(1).select("version").first()
        return int(history["version"]) if history is not None else -1


def _merge_result(metrics: DataFrame) -> MergeResult:
    row = metrics.first()
    if row is None:
        return MergeResult(skipped=True)
    values = row.asDict()
    return MergeResult(
        inserted=int(values.get("num_inserted_rows") or 0),
        updated=int(values.get("num_updated_rows") or 0),
    )
