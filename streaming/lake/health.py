"""Table health from a Delta log, and the sidecar's decisions (pure: plain values in, plain values out).

The inputs are what any Delta reader can list: the snapshot's data files (add actions), the commits
(commitInfo with operationMetrics) and the objects stored under the table. `lakelog.py` reads them;
this module only computes, so the arithmetic is tested on a synthetic log.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from streaming.core.config import MaintenanceConfig
from streaming.core.errors import VacuumRefusedError

UNPARTITIONED = ""
DAY_S = 86_400.0
# Operations that rewrite layout rather than data; MERGE/WRITE/DELETE... are "data" commits.
OPTIMIZE_OPS = frozenset({"OPTIMIZE"})
VACUUM_OPS = frozenset({"VACUUM END"})
# operationMetrics keys, by meaning, in the order Delta's operations use them.
_FILES_ADDED = ("numTargetFilesAdded", "numAddedFiles", "numFiles", "numRestoredFiles")
_FILES_REMOVED = ("numTargetFilesRemoved", "numRemovedFiles")
_BYTES_ADDED = ("numTargetBytesAdded", "numAddedBytes", "numOutputBytes", "restoredFilesSize")
_BYTES_REMOVED = ("numTargetBytesRemoved", "numRemovedBytes", "removedFilesSize")
_ROWS_UPDATED = ("numTargetRowsUpdated", "numUpdatedRows")
_ROWS_DELETED = ("numTargetRowsDeleted", "numDeletedRows")
_APPEND_OPS = frozenset({"WRITE", "STREAMING UPDATE", "CREATE TABLE AS SELECT", "REPLACE TABLE AS SELECT"})


@dataclass(frozen=True)
class DataFile:
    """One live data file of the snapshot (an add action)."""

    path: str
    partition: str  # "event_date=2026-11-30" (UNPARTITIONED for a table without partitions)
    size: int
    rows: int | None
    modified_ms: int


@dataclass(frozen=True)
class Commit:
    """One commit's commitInfo."""

    version: int
    timestamp_ms: int
    operation: str
    metrics: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredObject:
    """An object under the table's root (path relative to it), as a listing returns it."""

    path: str
    size: int
    modified_ms: int


@dataclass(frozen=True)
class PartitionHealth:
    partition: str
    files: int
    small_files: int
    bytes: int
    rows: int

    @property
    def small_file_ratio(self) -> float:
        return self.small_files / self.files if self.files else 0.0


@dataclass(frozen=True)
class Churn:
    """What a run of commits added and removed."""

    commits: int = 0
    files_added: int = 0
    files_removed: int = 0
    bytes_added: int = 0
    bytes_removed: int = 0
    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0


@dataclass(frozen=True)
class TableHealth:
    """One table's health at one version."""

    table: str
    version: int
    partitions: tuple[PartitionHealth, ...]
    last_commit_ms: int | None
    last_optimize_ms: int | None
    last_vacuum_ms: int | None
    checkpoint_ms: int | None
    reclaimable_files: int
    reclaimable_bytes: int
    commits_last_interval: int
    oldest_object_ms: int | None = None  # the oldest object under the table, the log's included

    @property
    def files(self) -> int:
        return sum(p.files for p in self.partitions)

    @property
    def small_files(self) -> int:
        return sum(p.small_files for p in self.partitions)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.partitions)

    @property
    def small_file_ratio(self) -> float:
        return self.small_files / self.files if self.files else 0.0

    @property
    def avg_file_bytes(self) -> float:
        return self.bytes / self.files if self.files else 0.0

    @property
    def partition_skew(self) -> float:
        """Largest partition's bytes over the median's (1.0 = even; 0 without partitions)."""
        sizes = [p.bytes for p in self.partitions]
        if not sizes:
            return 0.0
        median = statistics.median(sizes)
        return max(sizes) / median if median else 0.0


def partition_health(files: Iterable[DataFile], small_file_bytes: int) -> tuple[PartitionHealth, ...]:
    """Files, small files, bytes and rows per partition, sorted by partition."""
    acc: dict[str, list[int]] = {}
    for f in files:
        files_, small, size, rows = acc.setdefault(f.partition, [0, 0, 0, 0])
        acc[f.partition] = [files_ + 1, small + (f.size < small_file_bytes), size + f.size, rows + (f.rows or 0)]
    return tuple(PartitionHealth(p, *acc[p]) for p in sorted(acc))


def _first(metrics: Mapping[str, int], keys: Sequence[str]) -> int:
    return next((int(metrics[k]) for k in keys if k in metrics), 0)


def churn(commits: Iterable[Commit]) -> Churn:
    """Sum of files, bytes and rows added/removed/changed, from each commit's operationMetrics."""
    total = Churn()
    for c in commits:
        m = c.metrics
        inserted = m.get("numTargetRowsInserted", m.get("numOutputRows", 0) if c.operation in _APPEND_OPS else 0)
        total = Churn(
            commits=total.commits + 1,
            files_added=total.files_added + _first(m, _FILES_ADDED),
            files_removed=total.files_removed + _first(m, _FILES_REMOVED),
            bytes_added=total.bytes_added + _first(m, _BYTES_ADDED),
            bytes_removed=total.bytes_removed + _first(m, _BYTES_REMOVED),
            rows_inserted=total.rows_inserted + int(inserted),
            rows_updated=total.rows_updated + _first(m, _ROWS_UPDATED),
            rows_deleted=total.rows_deleted + _first(m, _ROWS_DELETED),
        )
    return total


def last_of(commits: Iterable[Commit], operations: frozenset[str]) -> int | None:
    """Timestamp of the newest commit whose operation is one of `operations`."""
    stamps = [c.timestamp_ms for c in commits if c.operation in operations]
    return max(stamps) if stamps else None


def retain(commits: Iterable[Commit], interval_s: float, now_ms: int) -> tuple[Commit, ...]:
    """The commits table_health needs again next time: the newest, those within the interval, and the
    newest OPTIMIZE and VACUUM. Lets the sidecar read only new commits each cycle."""
    ordered = sorted({c.version: c for c in commits}.values(), key=lambda c: c.version)
    if not ordered:
        return ()
    since = now_ms - int(interval_s * 1000)
    keep = {ordered[-1].version} | {c.version for c in ordered if c.timestamp_ms >= since}
    for operations in (OPTIMIZE_OPS, VACUUM_OPS):
        newest = [c for c in ordered if c.operation in operations]
        if newest:
            keep.add(newest[-1].version)
    return tuple(c for c in ordered if c.version in keep)


def reclaimable(objects: Iterable[StoredObject], vacuumable: Iterable[str]) -> tuple[int, int]:
    """(files, bytes) of the paths a VACUUM would delete now (its dry run), sized from the listing."""
    sizes = {o.path: o.size for o in objects}
    paths = set(vacuumable)
    return len(paths), sum(sizes.get(p, 0) for p in paths)


def latest_checkpoint_ms(objects: Iterable[StoredObject]) -> int | None:
    """When the newest Delta checkpoint (`_delta_log/*.checkpoint*.parquet`) was written."""
    stamps = [o.modified_ms for o in objects if o.path.startswith("_delta_log/") and ".checkpoint" in o.path]
    return max(stamps) if stamps else None


def table_health(
    table: str,
    version: int,
    files: Sequence[DataFile],
    commits: Sequence[Commit],
    objects: Sequence[StoredObject],
    *,
    vacuumable: Iterable[str],
    small_file_bytes: int,
    interval_s: float,
    now_ms: int,
) -> TableHealth:
    """Everything the table-health metrics export, from one read of the log, one listing and VACUUM's dry run."""
    files_reclaimable, bytes_reclaimable = reclaimable(objects, vacuumable)
    since = now_ms - int(interval_s * 1000)
    return TableHealth(
        table=table,
        version=version,
        partitions=partition_health(files, small_file_bytes),
        last_commit_ms=max((c.timestamp_ms for c in commits), default=None),
        last_optimize_ms=last_of(commits, OPTIMIZE_OPS),
        last_vacuum_ms=last_of(commits, VACUUM_OPS),
        checkpoint_ms=latest_checkpoint_ms(objects),
        reclaimable_files=files_reclaimable,
        reclaimable_bytes=bytes_reclaimable,
        commits_last_interval=sum(1 for c in commits if c.timestamp_ms >= since),
        oldest_object_ms=min((o.modified_ms for o in objects), default=None),
    )


# --- decisions ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompactionTask:
    """Compact one partition (UNPARTITIONED: the whole table), and why."""

    partition: str
    closed: bool
    files: int
    small_files: int
    reason: str


def partition_date(partition: str) -> date | None:
    """The date of a single-column date partition ('event_date=2026-11-30'); None otherwise."""
    if not partition or "/" in partition or "=" not in partition:
        return None
    try:
        return date.fromisoformat(partition.split("=", 1)[1])
    except ValueError:
        return None


def is_closed(partition: str, now: datetime, close_after_s: float) -> bool:
    """A date partition is closed once its day (UTC) ended more than close_after ago.

    Partitions without a date (and unpartitioned tables) are always open: the stream may write them.
    """
    day = partition_date(partition)
    if day is None:
        return False
    day_end = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
    return (now - day_end).total_seconds() > close_after_s


def plan_compaction(
    partitions: Iterable[PartitionHealth], now: datetime, cfg: MaintenanceConfig
) -> list[CompactionTask]:
    """The partitions to compact this cycle: closed ones over the small-file bar first (worst first), then
    open ones only over the much higher open-partition bar, so the sidecar stays out of the stream's way."""
    tasks = []
    for p in partitions:
        closed = is_closed(p.partition, now, cfg.close_after_s)
        if closed and p.small_files >= cfg.min_small_files and p.small_file_ratio >= cfg.min_small_file_ratio:
            reason = (
                f"closed partition: {p.small_files} small files >= {cfg.min_small_files} "
                f"and ratio {p.small_file_ratio:.2f} >= {cfg.min_small_file_ratio}"
            )
        elif not closed and p.small_files >= cfg.open_partition_min_small_files:
            reason = f"open partition: {p.small_files} small files >= {cfg.open_partition_min_small_files}"
        else:
            continue
        tasks.append(CompactionTask(p.partition, closed, p.files, p.small_files, reason))
    return sorted(tasks, key=lambda t: (not t.closed, -t.small_files, t.partition))


def vacuum_due(last_vacuum_ms: int | None, now_ms: int, vacuum_interval_s: float) -> bool:
    return last_vacuum_ms is None or now_ms - last_vacuum_ms >= vacuum_interval_s * 1000


def vacuum_could_delete(oldest_object_ms: int | None, now_ms: int, retention_s: float) -> bool:
    """Whether a VACUUM with this retention could delete any file of the table.

    VACUUM deletes only files last modified before now - retention (Delta's VacuumCommand filters the listing on
    modificationTime), so under a table whose every object is younger, a table younger than its retention, it
    deletes nothing and its Spark jobs are wasted. Unknown (no listing) counts as could.
    """
    return oldest_object_ms is None or oldest_object_ms < now_ms - retention_s * 1000


@dataclass(frozen=True)
class StreamProgress:
    """What the VACUUM guard knows of the stream: messages between its committed offsets and the topic's end,
    and the seconds since it committed its last batch."""

    behind: int
    since_commit_s: float

    @property
    def stalled_s(self) -> float:
        """How long it has been behind without committing (0 when caught up: an idle stream lags nothing)."""
        return self.since_commit_s if self.behind > 0 else 0.0


def check_vacuum_retention(
    table: str, retention_s: float, table_retention_s: float, stream: StreamProgress | None
) -> None:
    """Refuse a VACUUM that could delete files a reader or the stream still needs.

    - below the table's delta.deletedFileRetentionDuration (Delta's own safety check);
    - while the stream is behind the topic's end and has not committed for the retention or longer: when it
      resumes, the batch it replays re-reads the snapshot of that time, whose files must still exist. A
      caught-up stream (no lag; an idle topic) has nothing to replay, however long ago it last committed.
    """
    if retention_s <= 0:
        raise VacuumRefusedError(f"VACUUM {table}: retention must be > 0, got {retention_s:g} s.")
    if retention_s < table_retention_s:
        raise VacuumRefusedError(
            f"VACUUM {table}: retention {human_duration(retention_s)} is below the table's deleted-file retention "
            f"({human_duration(table_retention_s)}), Delta's safety check. Readers and time travel within that window "
            "would break. Use a longer retention, or lower tables.deleted_file_retention deliberately."
        )
    if stream is not None and stream.behind > 0 and stream.stalled_s >= retention_s:
        raise VacuumRefusedError(
            f"VACUUM {table}: the stream is {stream.behind:,} messages behind the topic's end and has not "
            f"committed a batch for {human_duration(stream.stalled_s)}, not less than the retention "
            f"({human_duration(retention_s)}); the batch it replays when it resumes would miss files. Get the stream "
            "going and let it catch up first (`iotlake status` shows its lag), or use a longer retention."
        )


def human_duration(seconds: float) -> str:
    for unit, size in (("days", DAY_S), ("hours", 3600.0), ("minutes", 60.0)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} seconds"
