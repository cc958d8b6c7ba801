"""Table operations behind `iotlake history|show|restore|changes|delete-device`.

Pure helpers (table names, timestamps, metric picking, JSON conversion, text tables, the VACUUM horizon,
confirmation, commit tags and purges) come first and are unit-tested; `TableOps` does the Spark and Delta
work. These commands are a second writer beside the stream: `streaming.core.logstore.check_writers_safe` decides
whether that is safe, and their writes retry the races they lose to it.
"""

from __future__ import annotations

import argparse
import base64
import json
import operator
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import reduce
from typing import TYPE_CHECKING, Any, TextIO

from streaming.core.catalog import LakeTable, lake_tables, resolve_table
from streaming.core.commit_tags import PURGE, commit_tag, parse_tag
from streaming.core.config import Settings, parse_duration
from streaming.core.errors import (
    ConcurrentWriteError,
    ConfigError,
    ConfirmationRequiredError,
    InvalidTimestampError,
    IotLakeError,
    StorageError,
    TableNotCreatedError,
    VersionNotFoundError,
    first_line,
)
from streaming.core.logstore import check_writers_safe

if TYPE_CHECKING:
    from delta.tables import DeltaTable
    from pyspark.sql import Column, DataFrame, SparkSession

# operationMetrics worth showing in `history`, in this order (Delta writes them as strings).
KEY_METRICS = (
    "numOutputRows",
    "numTargetRowsInserted",
    "numTargetRowsUpdated",
    "numTargetRowsDeleted",
    "numDeletedRows",
    "numCopiedRows",
    "numFiles",
    "numAddedFiles",
    "numRemovedFiles",
    "numAddedBytes",
    "numRemovedBytes",
    "numOutputBytes",
    "numAddedChangeFiles",
    "numRestoredFiles",
    "numOfFilesAfterRestore",
    "executionTimeMs",
)
DEFAULT_DELETED_FILE_RETENTION = "interval 1 week"  # Delta's default for delta.deletedFileRetentionDuration
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
# A DELETE that loses the race to the stream's commit is run again, with the stream's backoff
# (streaming.pipeline.tables.retry_on_conflict: 0.5 s doubling to 8 s): 8 attempts wait about 30 s in all.
DELETE_ATTEMPTS = 8
# More distinct partitions than this and the DELETE reads the whole table instead of a list of literals.
MAX_PARTITION_LITERALS = 1000
# Quarantine rows belong to a device by their Kafka key or by the device_id their JSON payload names: either
# is enough (a message keyed by the device but naming another device in its payload is purged too).
QUARANTINE_MATCH = "raw_key or value_text $.device_id"


# --- pure helpers ----------------------------------------------------------------------------------


def parse_timestamp(text: str) -> datetime:
    """A UTC time from ISO-8601 (naive = UTC, 'Z' allowed) or epoch milliseconds."""
    value = text.strip()
    if value.isdigit():
        return datetime.fromtimestamp(int(value) / 1000, UTC)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidTimestampError(
            f"--timestamp {text!r} is not a time. Use ISO-8601, e.g. 2026-11-30T14:05:00Z or "
            "'2026-11-30 14:05:00' (naive = UTC), or epoch milliseconds."
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def iso_ms(epoch_ms: int | None) -> str | None:
    """Epoch milliseconds as ISO-8601 UTC with milliseconds."""
    if epoch_ms is None:
        return None
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")


def key_metrics(operation_metrics: Mapping[str, str] | None) -> dict[str, int]:
    """The operationMetrics worth showing, as integers, in a stable order."""
    metrics = operation_metrics or {}
    out: dict[str, int] = {}
    for key in KEY_METRICS:
        raw = metrics.get(key)
        if raw is not None and str(raw).lstrip("-").isdigit():
            out[key] = int(raw)
    return out


def vacuum_eligible_at(commit_ms: int, deleted_file_retention: str) -> datetime:
    """The earliest time VACUUM with this retention can remove files a commit at `commit_ms` removed."""
    seconds = parse_duration(deleted_file_retention, "delta.deletedFileRetentionDuration")
    return datetime.fromtimestamp(commit_ms / 1000, UTC) + timedelta(seconds=seconds)


def jsonable(value: Any) -> Any:
    """A Spark row value as JSON data: times as ISO-8601, bytes as UTF-8 text or base64."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(bytes(value)).decode()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def text_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], max_width: int = 40) -> str:
    """Rows as an aligned text table; cells longer than `max_width` are cut with an ellipsis."""

    def cell(value: Any) -> str:
        shown = "" if value is None else str(jsonable(value))
        shown = shown.replace("\n", " ")
        return shown if len(shown) <= max_width else shown[: max_width - 1] + "…"

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def confirm(question: str, *, assume_yes: bool, stdin: TextIO, stdout: TextIO, refusal: str) -> bool:
    """True with --yes; else ask on a terminal (y/yes); with no terminal, refuse with `refusal`."""
    if assume_yes:
        return True
    if not stdin.isatty():
        raise ConfirmationRequiredError(refusal)
    stdout.write(f"{question} [y/N] ")
    stdout.flush()
    return stdin.readline().strip().lower() in ("y", "yes")


@dataclass(frozen=True)
class Purge:
    """A delete-device commit: its version, the device (None: the tag predates naming it) and its time."""

    version: int
    device_id: str | None
    timestamp: str | None


def purges_in(commits: Iterable[Mapping[str, Any]]) -> list[Purge]:
    """The delete-device commits among commitInfo entries (delta-rs history), oldest first."""
    found = []
    for commit in commits:
        tag = parse_tag(commit.get("userMetadata"))
        if tag is None or tag[0] != PURGE or commit.get("version") is None:
            continue
        stamp = commit.get("timestamp")
        found.append(Purge(int(commit["version"]), tag[1].get("device_id"), iso_ms(int(stamp)) if stamp else None))
    return sorted(found, key=lambda p: p.version)


def purge_warning(table: str, version: int, purges: Sequence[Purge]) -> str:
    """What a restore to `version` undoes: the purges committed after it, by device."""
    named = [
        f"{repr(p.device_id) if p.device_id else 'a device not recorded in the commit'} "
        f"(purged at version {p.version}, {p.timestamp})"
        for p in purges
    ]
    again = sorted({p.device_id for p in purges if p.device_id})
    commands = " and ".join(f"`iotlake delete-device {shlex.quote(d)} --yes`" for d in again)
    redo = f" To keep them purged, run {commands} after the restore." if commands else ""
    return (
        f"Restoring {table} to version {version} brings back rows that `iotlake delete-device` purged after it: "
        f"{', '.join(named)}.{redo}"
    )


# --- results ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HistoryEntry:
    version: int
    timestamp: str | None
    timestamp_ms: int | None
    operation: str
    metrics: dict[str, int]
    parameters: dict[str, str]
    user_metadata: str | None = None


@dataclass(frozen=True)
class ShowResult:
    table: str
    version: int
    commit_timestamp: str | None
    row_count: int
    columns: list[str]
    rows: list[list[Any]]
    device: str | None = None
    asked_timestamp: str | None = None


@dataclass(frozen=True)
class RestoreResult:
    table: str
    restored_version: int
    previous_version: int
    new_version: int | None
    rows_after: int
    metrics: dict[str, int]
    purges_undone: list[Purge] = field(default_factory=list)  # delete-device commits the restore went back over


@dataclass(frozen=True)
class ChangesResult:
    table: str
    from_version: int
    to_version: int
    counts: dict[str, int]
    columns: list[str]
    rows: list[list[Any]]


@dataclass(frozen=True)
class DeviceDeletion:
    table: str
    matched_on: str  # what the device was matched on (a column, or QUARANTINE_MATCH)
    rows_deleted: int
    commit_version: int | None = None
    commit_timestamp: str | None = None
    files_removed: int = 0
    bytes_removed: int = 0
    files_added: int = 0
    bytes_added: int = 0
    change_files_added: int = 0
    deleted_file_retention: str | None = None
    vacuum_eligible_at: str | None = None
    retries: int = 0  # races lost to another writer's commit, each followed by a new attempt
    partitions: int | None = None  # partitions the DELETE read (the device's); None: the whole table
    rows_remaining: int = 0  # rows of the device in the table after the purge (they arrived during or after it)


@dataclass(frozen=True)
class DeleteReport:
    device_id: str
    tables: list[DeviceDeletion] = field(default_factory=list)

    @property
    def rows_deleted(self) -> int:
        return sum(t.rows_deleted for t in self.tables)

    @property
    def retries(self) -> int:
        return sum(t.retries for t in self.tables)

    @property
    def rows_remaining(self) -> int:
        return sum(t.rows_remaining for t in self.tables)

    @property
    def vacuum_eligible_at(self) -> str | None:
        """When VACUUM can reclaim every table's removed files (the latest of the per-table times)."""
        times = [t.vacuum_eligible_at for t in self.tables if t.vacuum_eligible_at]
        return max(times) if times else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "device_id": self.device_id,
            "rows_deleted": self.rows_deleted,
            "retries": self.retries,
            "rows_remaining": self.rows_remaining,
            "vacuum_eligible_at": self.vacuum_eligible_at,
            "tables": [asdict(t) for t in self.tables],
        }


# --- formatting for people -------------------------------------------------------------------------


def format_history(table: str, entries: Sequence[HistoryEntry]) -> str:
    rows = []
    for e in entries:
        metrics = " ".join(f"{k}={v}" for k, v in e.metrics.items() if k != "executionTimeMs")
        params = " ".join(f"{k}={v}" for k, v in e.parameters.items() if v not in (None, "", "[]"))
        rows.append([e.version, e.timestamp, e.operation, metrics, params])
    return f"history of {table} (newest first)\n" + text_table(
        ["version", "timestamp", "operation", "metrics", "parameters"], rows, max_width=90
    )


def format_show(result: ShowResult) -> str:
    where = f" where device_id = {result.device!r}" if result.device else ""
    asked = f" (as of {result.asked_timestamp})" if result.asked_timestamp else ""
    head = (
        f"{result.table} at version {result.version}{asked}, committed {result.commit_timestamp}: "
        f"{result.row_count} row(s){where}"
    )
    if not result.rows:
        return head
    shown = f"\n(first {len(result.rows)} shown)" if len(result.rows) < result.row_count else ""
    return f"{head}\n{text_table(result.columns, result.rows)}{shown}"


def format_restore(result: RestoreResult) -> str:
    m = result.metrics
    undone = ", ".join(repr(p.device_id) if p.device_id else "an unnamed device" for p in result.purges_undone)
    return (
        f"restored {result.table} to version {result.restored_version} (was at {result.previous_version}); "
        f"new version {result.new_version}, {result.rows_after} row(s); "
        f"files restored {m.get('numRestoredFiles', 0)}, removed {m.get('numRemovedFiles', 0)}"
        + (f"; purged device(s) back in the table: {undone}" if undone else "")
    )


def format_changes(result: ChangesResult) -> str:
    counts = ", ".join(f"{kind}={n}" for kind, n in sorted(result.counts.items())) or "none"
    head = f"changes to {result.table}, versions {result.from_version}..{result.to_version}: {counts}"
    if not result.rows:
        return head
    total = sum(result.counts.values())
    shown = f"\n(first {len(result.rows)} of {total} shown)" if len(result.rows) < total else ""
    return f"{head}\n{text_table(result.columns, result.rows)}{shown}"


def format_delete_report(report: DeleteReport) -> str:
    rows = [
        [
            t.table,
            t.matched_on,
            t.rows_deleted,
            t.commit_version if t.commit_version is not None else "-",
            t.retries,
            t.files_removed,
            t.bytes_removed,
            t.change_files_added,
            t.deleted_file_retention or "-",
            t.vacuum_eligible_at or "-",
        ]
        for t in report.tables
    ]
    table = text_table(
        [
            "table",
            "matched on",
            "rows deleted",
            "version",
            "retries",
            "files removed",
            "bytes removed",
            "change files",
            "retention",
            "VACUUM can reclaim from",
        ],
        rows,
    )
    retried = f", after {report.retries} retried conflict(s) with other writers" if report.retries else ""
    lines = [f"deleted device {report.device_id!r}: {report.rows_deleted} row(s){retried}", table]
    if report.rows_remaining:
        where = ", ".join(f"{t.table}: {t.rows_remaining}" for t in report.tables if t.rows_remaining)
        lines.append(
            f"{report.rows_remaining} row(s) of device {report.device_id!r} arrived while or after it was purged "
            f"({where}): its messages are still coming in. Stop the device (or the replay sending it), then run "
            f"`iotlake delete-device {shlex.quote(report.device_id)} --yes` again."
        )
    if report.rows_deleted:
        lines.append(
            "The rows are gone from the current versions, but older versions (time travel), the files the "
            "DELETE removed and the change-data files (which hold the deleted rows) stay on storage until a "
            f"VACUUM after {report.vacuum_eligible_at} removes them for good (`iotlake vacuum`)."
        )
    return "\n".join(lines)


# --- Spark and Delta ---------------------------------------------------------------------------------


class TableOps:
    """history, time travel, restore, change feed and device purge on the lake's Delta tables."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        self.spark = spark
        self.settings = settings

    def _delta(self, table: LakeTable) -> DeltaTable:
        from delta.tables import DeltaTable

        if not DeltaTable.isDeltaTable(self.spark, table.uri):
            raise _not_created(table)
        return DeltaTable.forPath(self.spark, table.uri)

    def latest_version(self, table: LakeTable) -> tuple[int, int]:
        """(version, commit epoch ms) of the newest commit."""
        from pyspark.sql import functions as F

        row = self._delta(table).history(1).select("version", F.unix_millis("timestamp").alias("ms")).first()
        assert row is not None  # a Delta table has at least its first commit
        return int(row["version"]), int(row["ms"])

    def _check_version(self, table: LakeTable, version: int, latest: int) -> None:
        check_version(table, version, latest)

    def history(self, name: str, limit: int | None = None) -> list[HistoryEntry]:
        from pyspark.sql import functions as F

        table = resolve_table(self.settings, name)
        delta = self._delta(table)
        frame = delta.history(limit) if limit else delta.history()
        rows = frame.select(
            "version",
            F.unix_millis("timestamp").alias("ms"),
            "operation",
            "operationMetrics",
            "operationParameters",
            "userMetadata",
        ).collect()
        return [
            HistoryEntry(
                version=int(r["version"]),
                timestamp=iso_ms(r["ms"]),
                timestamp_ms=r["ms"],
                operation=str(r["operation"]),
                metrics=key_metrics(r["operationMetrics"]),
                parameters={str(k): str(v) for k, v in (r["operationParameters"] or {}).items() if v is not None},
                user_metadata=r["userMetadata"],
            )
            for r in sorted(rows, key=lambda r: -int(r["version"]))
        ]

    def version_at(self, table: LakeTable, when: datetime) -> tuple[int, int]:
        """(version, commit ms) of the newest commit at or before `when`."""
        from pyspark.sql import functions as F

        cutoff = int(when.timestamp() * 1000)
        commits = self._delta(table).history().select("version", F.unix_millis("timestamp").alias("ms"))
        row = commits.filter(F.col("ms") <= F.lit(cutoff)).orderBy(F.col("version").desc()).first()
        if row is None:
            first = commits.orderBy("version").first()
            since = f" Its first retained commit is at {iso_ms(first['ms'])}." if first is not None else ""
            raise VersionNotFoundError(
                f"{table.name} did not exist yet at {when.isoformat()}.{since} Pick a later --timestamp, or "
                f"a --version from `iotlake history {table.name}`."
            )
        return int(row["version"]), int(row["ms"])

    def _read_version(self, table: LakeTable, version: int) -> DataFrame:
        return self.spark.read.format("delta").option("versionAsOf", version).load(table.uri)

    def show(
        self,
        name: str,
        version: int | None = None,
        timestamp: datetime | None = None,
        device: str | None = None,
        limit: int = 20,
    ) -> ShowResult:
        """The rows of one version (by number or by time), optionally of one device only."""
        table = resolve_table(self.settings, name)
        latest, latest_ms = self.latest_version(table)
        commit_ms: int | None
        if timestamp is not None:
            version, commit_ms = self.version_at(table, timestamp)
        else:
            assert version is not None
            self._check_version(table, version, latest)
            commit_ms = latest_ms if version == latest else self._commit_ms(table, version)
        with _delta_errors(table):
            frame = self._read_version(table, version)
            if device is not None:
                frame = frame.filter(device_condition(table, frame.columns, device))
            count = frame.count()
            rows = frame.limit(limit).collect() if limit > 0 else []
        return ShowResult(
            table=table.name,
            version=version,
            commit_timestamp=iso_ms(commit_ms),
            row_count=count,
            columns=list(frame.columns),
            rows=[[jsonable(v) for v in r] for r in rows],
            device=device,
            asked_timestamp=timestamp.isoformat() if timestamp is not None else None,
        )

    def _commit_ms(self, table: LakeTable, version: int) -> int | None:
        from pyspark.sql import functions as F

        commits = self._delta(table).history().filter(F.col("version") == F.lit(version))
        row = commits.select(F.unix_millis("timestamp").alias("ms")).first()
        return int(row["ms"]) if row is not None else None

    def count_at(self, name: str, version: int) -> int:
        table = resolve_table(self.settings, name)
        with _delta_errors(table):
            return self._read_version(table, version).count()

    def restore(self, name: str, version: int) -> RestoreResult:
        """RESTORE the table to `version`; a new commit that history records as RESTORE."""
        table = resolve_table(self.settings, name)
        latest, _ = self.latest_version(table)
        self._check_version(table, version, latest)
        check_writers_safe(self.settings, "ops")
        delta = self._delta(table)
        tag = commit_tag("restore")
        with _user_metadata(self.spark, tag), _delta_errors(table):
            metrics_row = delta.restoreToVersion(version).first()
        entry = self._tagged_entry(table, tag)
        return RestoreResult(
            table=table.name,
            restored_version=version,
            previous_version=latest,
            new_version=entry.version if entry else None,
            rows_after=self._delta(table).toDF().count(),
            metrics=entry.metrics if entry else _restore_metrics(metrics_row),
        )

    def changes(self, name: str, from_version: int, to_version: int | None = None, limit: int = 50) -> ChangesResult:
        """The Change Data Feed between two versions (inclusive): every row with its change type."""
        from pyspark.sql import functions as F

        table = resolve_table(self.settings, name)
        latest, _ = self.latest_version(table)
        end = latest if to_version is None else to_version
        self._check_version(table, from_version, latest)
        self._check_version(table, end, latest)
        if from_version > end:
            raise VersionNotFoundError(
                f"--from-version {from_version} is after --to-version {end}; give the older version first."
            )
        with _delta_errors(table):
            frame = (
                self.spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", from_version)
                .option("endingVersion", end)
                .load(table.uri)
            )
            data = [c for c in frame.columns if c not in CHANGE_COLUMNS]
            frame = frame.select(*CHANGE_COLUMNS, *data)
            counts = {str(r[0]): int(r[1]) for r in frame.groupBy("_change_type").count().collect()}
            ordered = frame.orderBy(F.col("_commit_version"), F.col("_change_type"))
            rows = ordered.limit(limit).collect() if limit > 0 else []
        return ChangesResult(
            table=table.name,
            from_version=from_version,
            to_version=end,
            counts=counts,
            columns=list(frame.columns),
            rows=[[jsonable(v) for v in r] for r in rows],
        )

    def delete_device(
        self, device_id: str, attempts: int = DELETE_ATTEMPTS, sleep: Callable[[float], None] = time.sleep
    ) -> DeleteReport:
        """Row-level DELETE of one device from every table that records it; what VACUUM must then do.

        The stream commits beside it every few seconds and the first commit wins, so a DELETE that loses the
        race runs again the way the stream's writes do (streaming.pipeline.tables.retry_on_conflict), up to `attempts`
        times; the report counts the retries. Each attempt reads only the partitions that hold the device, so
        commits to other partitions don't conflict with it. Rows of the device found in the tables afterwards
        (committed beside or after the DELETE: the device is still sending) are reported as remaining.
        """
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        check_writers_safe(self.settings, "ops")
        tables = lake_tables(self.settings)
        done: list[DeviceDeletion] = []
        for i, table in enumerate(tables):
            pending = [t.name for t in tables[i:]]
            done.append(self._delete_device_from(table, device_id, attempts, sleep, done, pending))
        remaining = [self._count_device(t, device_id) for t in tables]
        return DeleteReport(device_id, [replace(d, rows_remaining=n) for d, n in zip(done, remaining, strict=True)])

    def _delete_device_from(
        self,
        table: LakeTable,
        device_id: str,
        attempts: int,
        sleep: Callable[[float], None],
        done: Sequence[DeviceDeletion],
        pending: Sequence[str],
    ) -> DeviceDeletion:
        """One table's DELETE, retried when it loses a race; no commit when the table has no row of the device."""
        from streaming.core.errors import is_conflict
        from streaming.pipeline.tables import retry_on_conflict

        delta = self._delta(table)
        columns = self._read(table).columns
        condition = device_condition(table, columns, device_id)
        matched_on = "device_id" if "device_id" in columns else QUARANTINE_MATCH
        partition_columns, retention = self._table_detail(delta)
        tag = commit_tag(PURGE, device_id=device_id)
        retries = 0

        def retried(_: str) -> None:
            nonlocal retries
            retries += 1

        def attempt() -> tuple[int, int | None]:
            """(the device's rows found, partitions the DELETE read or None for all); a fresh look each time."""
            groups = self._device_partitions(table, condition, partition_columns)
            found = sum(rows for _, rows in groups)
            if found == 0:  # no empty DELETE commits
                return 0, None
            narrow = partition_filter(partition_columns, [values for values, _ in groups])
            with _user_metadata(self.spark, tag):
                delta.delete(condition if narrow is None else narrow & condition)
            return found, None if narrow is None else len(groups)

        with _delta_errors(table):
            try:
                found, partitions = retry_on_conflict(attempt, table.name, retried, attempts, sleep)
            except Exception as e:
                if not is_conflict(e):
                    raise
                raise ConcurrentWriteError(_gave_up(table.name, device_id, attempts, e, done, pending)) from e
        if found == 0:
            return DeviceDeletion(table.name, matched_on, 0, retries=retries)
        entry = self._tagged_entry(table, tag)
        metrics = entry.metrics if entry else {}
        commit_ms = entry.timestamp_ms if entry else None
        return DeviceDeletion(
            table=table.name,
            matched_on=matched_on,
            rows_deleted=metrics.get("numDeletedRows", found),
            commit_version=entry.version if entry else None,
            commit_timestamp=entry.timestamp if entry else None,
            files_removed=metrics.get("numRemovedFiles", 0),
            bytes_removed=metrics.get("numRemovedBytes", 0),
            files_added=metrics.get("numAddedFiles", 0),
            bytes_added=metrics.get("numAddedBytes", 0),
            change_files_added=metrics.get("numAddedChangeFiles", 0),
            deleted_file_retention=retention,
            vacuum_eligible_at=(
                vacuum_eligible_at(commit_ms, retention).isoformat(timespec="seconds")
                if commit_ms is not None
                else None
            ),
            retries=retries,
            partitions=partitions,
        )

    def _read(self, table: LakeTable) -> DataFrame:
        """The table's newest version (a new read each call: other writers keep committing)."""
        return self.spark.read.format("delta").load(table.uri)

    def _count_device(self, table: LakeTable, device_id: str) -> int:
        frame = self._read(table)
        return frame.filter(device_condition(table, frame.columns, device_id)).count()

    def _device_partitions(
        self, table: LakeTable, condition: Column, partition_columns: Sequence[str]
    ) -> list[tuple[tuple[Any, ...], int]]:
        """(partition values, rows) of every partition holding rows that match `condition`."""
        counts = self._read(table).filter(condition).groupBy(*partition_columns).count().collect()
        return [(tuple(r[c] for c in partition_columns), int(r["count"])) for r in counts]

    def _table_detail(self, delta: DeltaTable) -> tuple[list[str], str]:
        """(partition columns, delta.deletedFileRetentionDuration) of the table."""
        detail = delta.detail().select("partitionColumns", "properties").first()
        partitions = list(detail["partitionColumns"] or []) if detail is not None else []
        properties = (detail["properties"] if detail is not None else None) or {}
        return partitions, str(properties.get("delta.deletedFileRetentionDuration", DEFAULT_DELETED_FILE_RETENTION))

    def _tagged_entry(self, table: LakeTable, tag: str) -> HistoryEntry | None:
        """Our own commit, found by its userMetadata tag among the newest commits (the stream may add more)."""
        for entry in self.history(table.name, limit=50):
            if entry.user_metadata == tag:
                return entry
        return None


def device_condition(table: LakeTable, columns: Sequence[str], device_id: str) -> Column:
    """A typed condition for one device's rows: device_id; in quarantine, the Kafka key or the payload's device_id.

    A quarantined message is the device's when either names it (QUARANTINE_MATCH): keyed by the device, or sent
    under another key (or none) with the device's id in its JSON. A payload that isn't JSON matches on its key only.
    """
    from pyspark.sql import functions as F

    if "device_id" in columns:
        return F.col("device_id") == F.lit(device_id)
    if "raw_key" in columns and "value_text" in columns:
        by_key = F.coalesce(F.col("raw_key") == F.lit(device_id.encode("utf-8")), F.lit(False))
        by_payload = F.coalesce(F.get_json_object("value_text", "$.device_id") == F.lit(device_id), F.lit(False))
        return by_key | by_payload
    raise ConfigError(
        f"Table {table.name} has neither a device_id column nor raw_key and value_text columns to match a device on."
    )


def partition_filter(columns: Sequence[str], values: Sequence[Sequence[Any]]) -> Column | None:
    """Literal partition values that confine a DELETE to these partitions; None to read the whole table.

    Delta checks a write's conflicts against the partitions its condition names, so a DELETE that lists its
    partitions only conflicts with commits to those, not with the stream's appends anywhere else.
    """
    from pyspark.sql import functions as F

    if not columns or not values or len(values) > MAX_PARTITION_LITERALS:
        return None
    if len(columns) == 1:
        column = F.col(columns[0])
        present = sorted({v[0] for v in values if v[0] is not None})
        parts = [column.isin([F.lit(v) for v in present])] if present else []
        if any(v[0] is None for v in values):
            parts.append(column.isNull())
        return reduce(operator.or_, parts)
    each = [
        reduce(operator.and_, [F.col(c).eqNullSafe(F.lit(v)) for c, v in zip(columns, vs, strict=True)])
        for vs in values
    ]
    return reduce(operator.or_, each)


def check_version(table: LakeTable, version: int, latest: int) -> None:
    if version < 0 or version > latest:
        raise VersionNotFoundError(
            f"{table.name} has no version {version}: its newest version is {latest}. "
            f"See `iotlake history {table.name}`."
        )


def purges_after(settings: Settings, table: LakeTable, version: int) -> tuple[int, list[Purge]]:
    """(newest version, the delete-device commits after `version`) from the table's log with delta-rs: no JVM."""
    from deltalake import DeltaTable as RsTable
    from deltalake.exceptions import TableNotFoundError as RsTableNotFound

    from streaming.core.storage import delta_rs_uri, delta_storage_options

    try:
        log = RsTable(delta_rs_uri(table.uri), storage_options=delta_storage_options(settings))
        latest = log.version()
        commits = log.history(latest - version) if latest > version else []
    except RsTableNotFound:
        raise _not_created(table) from None
    except Exception as e:
        raise StorageError(
            f"{table.name}: could not read its commit history at {table.uri} ({first_line(e, 300)}). Check that "
            "storage is reachable with the configured keys (`iotlake status`)."
        ) from e
    return latest, purges_in(commits)


def _not_created(table: LakeTable) -> TableNotCreatedError:
    return TableNotCreatedError(
        f"Table {table.name} does not exist yet at {table.uri}. The stream creates it: run "
        "`iotlake ingest` (or `make run`) first, and check storage.base_uri in `iotlake config`."
    )


def _gave_up(
    table: str,
    device_id: str,
    attempts: int,
    error: BaseException,
    done: Sequence[DeviceDeletion],
    pending: Sequence[str],
) -> str:
    """Why delete-device stopped after losing every race on `table`, what it did purge, and what to do."""
    purged = [f"{d.table} (version {d.commit_version})" for d in done if d.commit_version is not None]
    already = f"Already purged: {', '.join(purged)}." if purged else "Nothing was purged yet."
    return (
        f"{table}: the DELETE of device {device_id!r} lost to another writer's commit {attempts} times in a row "
        f"(the last: {first_line(error, 300)}). {already} Not purged yet: {', '.join(pending)}. Run "
        f"`iotlake delete-device {shlex.quote(device_id)} --yes` again (tables already purged have nothing left to "
        "delete), with more --attempts, or while `iotlake ingest` is stopped."
    )


def _restore_metrics(row: Any) -> dict[str, int]:
    if row is None:
        return {}
    values = row.asDict()
    return {
        "numRestoredFiles": int(values.get("num_restored_files") or 0),
        "numRemovedFiles": int(values.get("num_removed_files") or 0),
        "numOfFilesAfterRestore": int(values.get("num_of_files_after_restore") or 0),
    }


@contextmanager
def _user_metadata(spark: SparkSession, tag: str) -> Iterator[None]:
    """Tag the next commit's userMetadata (a commit_tag) so that history finds exactly our commit; always untag."""
    spark.conf.set(USER_METADATA, tag)
    try:
        yield
    finally:
        spark.conf.unset(USER_METADATA)


@contextmanager
def _delta_errors(table: LakeTable) -> Iterator[None]:
    """Delta's errors for versions and concurrent writers, as IotLakeErrors naming the fix."""
    try:
        yield
    except IotLakeError:
        raise  # already explained
    except Exception as e:
        text = str(e)
        if "DELTA_VERSION_NOT_FOUND" in text or "DELTA_CDC_START_VERSION_AFTER_LATEST" in text:
            raise VersionNotFoundError(
                f"{table.name}: {first_line(text, 300)} Older versions may have been removed by log retention; "
                f"see `iotlake history {table.name}`."
            ) from e
        if "DELTA_CHANGE_DATA_FILE_NOT_FOUND" in text or "DELTA_MISSING_CHANGE_DATA" in text:
            raise VersionNotFoundError(
                f"{table.name}: the change data of those versions is gone ({first_line(text, 300)}). "
                "VACUUM removes it after the deleted-file retention; pick a newer --from-version."
            ) from e
        if "DELTA_CONCURRENT" in text or type(e).__name__.startswith("Concurrent"):
            raise ConcurrentWriteError(
                f"{table.name}: another writer committed a conflicting change first ({first_line(text, 300)}). "
                "Nothing was changed by this command; run it again."
            ) from e
        raise StorageError(
            f"{table.name}: Delta failed: {first_line(text, 300)} Check that the table is reachable with the "
            "configured keys (`iotlake status`) and the version or time exists (`iotlake history`)."
        ) from e


# --- the `iotlake` subcommands ---------------------------------------------------------------------


def _at_least(minimum: int, what: str, lowest: str) -> Callable[[str], int]:
    """An argparse type: a whole number >= `minimum`, the error naming `what` it is."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: {lowest}")
        return value

    return parse


_version = _at_least(0, "a version number (0, 1, 2, ...)", "versions start at 0")
_count = _at_least(0, "a whole number", "must be >= 0")
_attempts = _at_least(1, "a whole number", "at least one attempt")


def _device_id(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the device id is empty")
    return text


def add_ops_parsers(sub: Any) -> None:
    """history, show, restore, changes and delete-device on the `iotlake` subparsers."""
    table_help = "table: readings, device_state or quarantine (or its configured name)"

    history = sub.add_parser("history", help="a table's commits: version, time, operation, metrics, parameters")
    history.add_argument("table", help=table_help)
    history.add_argument("--limit", type=_count, default=20, help="newest N commits (default: 20; 0 = all)")
    history.add_argument("--json", action="store_true", help="machine-readable output")

    show = sub.add_parser("show", help="time travel: a table's rows at a version or a time, and their count")
    show.add_argument("table", help=table_help)
    at = show.add_mutually_exclusive_group(required=True)
    at.add_argument("--version", type=_version, help="the table version to read")
    at.add_argument("--timestamp", help="read the version current at this time (ISO-8601, naive = UTC; or epoch ms)")
    show.add_argument("--device", type=_device_id, metavar="DEVICE_ID", help="only this device's rows")
    show.add_argument("--limit", type=_count, default=20, help="rows to print (default: 20); the count is of all")
    show.add_argument("--json", action="store_true", help="machine-readable output")

    restore = sub.add_parser(
        "restore",
        help="RESTORE a table to an earlier version (asks first, and warns when that undoes a delete-device purge; "
        "recorded in history)",
    )
    restore.add_argument("table", help=table_help)
    restore.add_argument("--version", type=_version, required=True, help="the version to restore")
    restore.add_argument("--yes", action="store_true", help="don't ask (required when stdin is not a terminal)")
    restore.add_argument("--json", action="store_true", help="machine-readable output")

    changes = sub.add_parser("changes", help="the Change Data Feed between two versions")
    changes.add_argument("table", help=table_help)
    changes.add_argument("--from-version", type=_version, required=True, help="first version (inclusive)")
    changes.add_argument("--to-version", type=_version, help="last version (inclusive; default: the newest)")
    changes.add_argument("--limit", type=_count, default=50, help="rows to print (default: 50); counts are of all")
    changes.add_argument("--json", action="store_true", help="machine-readable output")

    purge = sub.add_parser(
        "delete-device", help="purge one device from every table (row-level DELETE) and say what VACUUM must do"
    )
    purge.add_argument(
        "device_id",
        type=_device_id,
        metavar="DEVICE_ID",
        help="the device to delete: rows with this device_id; in quarantine, messages keyed by it or whose JSON "
        "payload names it as device_id",
    )
    purge.add_argument("--yes", action="store_true", help="don't ask (required when stdin is not a terminal)")
    purge.add_argument(
        "--attempts",
        type=_attempts,
        default=DELETE_ATTEMPTS,
        help=f"tries per table when the stream's commits win the race (default: {DELETE_ATTEMPTS}, backing off "
        "0.5 s doubling to 8 s)",
    )
    purge.add_argument("--json", action="store_true", help="machine-readable output")


def _table_ops(settings: Settings) -> TableOps:
    from streaming.core.session import build_session

    return TableOps(build_session(settings, app_name="iotlake-ops"), settings)


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _history_command(settings: Settings, args: argparse.Namespace) -> int:
    resolve_table(settings, args.table)
    entries = _table_ops(settings).history(args.table, args.limit or None)
    if args.json:
        _print_json([asdict(e) for e in entries])
    else:
        print(format_history(resolve_table(settings, args.table).name, entries))
    return 0


def _show_command(settings: Settings, args: argparse.Namespace) -> int:
    resolve_table(settings, args.table)
    when = parse_timestamp(args.timestamp) if args.timestamp is not None else None
    result = _table_ops(settings).show(args.table, args.version, when, args.device, args.limit)
    if args.json:
        _print_json(asdict(result))
    else:
        print(format_show(result))
    return 0


def _refuse_unattended(args: argparse.Namespace, what: str, warning: str = "") -> None:
    if not args.yes and not sys.stdin.isatty():
        raise ConfirmationRequiredError(
            f"{what} changes the lake and stdin is not a terminal, so there is no one to ask. "
            f"{warning + ' ' if warning else ''}Add --yes to confirm."
        )


def _restore_command(settings: Settings, args: argparse.Namespace) -> int:
    table = resolve_table(settings, args.table)
    what = f"`iotlake restore {table.name} --version {args.version}`"
    # Before the Spark session starts: refuse in a second, not after 15. The log is read with delta-rs.
    check_writers_safe(settings, "ops")
    latest, purges = purges_after(settings, table, args.version)
    check_version(table, args.version, latest)
    warning = purge_warning(table.name, args.version, purges) if purges else ""
    _refuse_unattended(args, what, warning)
    ops = _table_ops(settings)
    if not args.yes:
        latest, _ = ops.latest_version(table)
        ops._check_version(table, args.version, latest)
        question = (
            f"{warning + chr(10) if warning else ''}"
            f"Restore {table.name} from version {latest} ({ops.count_at(table.name, latest)} rows) to version "
            f"{args.version} ({ops.count_at(table.name, args.version)} rows)? This commits a new version."
        )
        if not confirm(question, assume_yes=False, stdin=sys.stdin, stdout=sys.stdout, refusal=what):
            print("restore cancelled; nothing changed")
            return 1
    elif warning:
        print(f"iotlake: warning: {warning}", file=sys.stderr)
    result = replace(ops.restore(table.name, args.version), purges_undone=purges)
    if args.json:
        _print_json(asdict(result))
    else:
        print(format_restore(result))
    return 0


def _changes_command(settings: Settings, args: argparse.Namespace) -> int:
    resolve_table(settings, args.table)
    result = _table_ops(settings).changes(args.table, args.from_version, args.to_version, args.limit)
    if args.json:
        _print_json(asdict(result))
    else:
        print(format_changes(result))
    return 0


def _delete_device_command(settings: Settings, args: argparse.Namespace) -> int:
    what = f"`iotlake delete-device {args.device_id}`"
    _refuse_unattended(args, what)
    check_writers_safe(settings, "ops")  # before the Spark session starts: refuse in a second, not after 15
    names = ", ".join(t.name for t in lake_tables(settings))
    question = f"Delete every row of device {args.device_id!r} from {names}? This rewrites files."
    if not confirm(question, assume_yes=args.yes, stdin=sys.stdin, stdout=sys.stdout, refusal=what):
        print("delete-device cancelled; nothing changed")
        return 1
    report = _table_ops(settings).delete_device(args.device_id, attempts=args.attempts)
    if args.json:
        _print_json(report.as_dict())
    else:
        print(format_delete_report(report))
    return 0


OPS_COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "history": _history_command,
    "show": _show_command,
    "restore": _restore_command,
    "changes": _changes_command,
    "delete-device": _delete_device_command,
}
