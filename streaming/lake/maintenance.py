"""The maintenance sidecar: measure every table, compact the partitions that crossed a bar, vacuum when due.

A separate driver process from the stream, writing the same tables: it stays out of the partitions the
stream writes (closed partitions first, the open one only over a much higher bar), backs off when it
loses a write conflict, and never makes the stream fail. `iotlake maintain` runs `Maintainer.cycle`
in a loop; `iotlake optimize` / `iotlake vacuum` run one operation with the same checks.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streaming.core.catalog import chosen_tables
from streaming.core.config import Settings, TableConfig, parse_duration
from streaming.core.errors import (
    ConfigError,
    IotLakeError,
    ServiceUnreachableError,
    VacuumRefusedError,
    first_line,
    is_conflict,
)
from streaming.lake.health import (
    UNPARTITIONED,
    Commit,
    CompactionTask,
    StoredObject,
    TableHealth,
    check_vacuum_retention,
    churn,
    human_duration,
    partition_date,
    plan_compaction,
    retain,
    table_health,
    vacuum_could_delete,
    vacuum_due,
)
from streaming.lake.lakelog import list_objects, read_table
from streaming.lake.metrics import MaintenanceMetrics
from streaming.lake.status import stream_progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
# One OPTIMIZE done: table, partition, files before -> after, small files rewritten, MiB, seconds, reason.
# `python -m bench --only compaction` reads these lines (bench.compaction.optimize_windows).
OPTIMIZE_LOG = "optimize %s %s: %d -> %d files (%d small rewritten, %.1f MiB) in %.1fs [%s]"

# Commits the first measurement of a table reads (later ones read only new commits). On a busy table this
# may not reach back to the last OPTIMIZE/VACUUM: their ages stay NaN until the sidecar runs one, and a
# table whose last VACUUM isn't seen counts as due.
HISTORY_COMMITS = 500
OPTIMIZE_MAX_FILE_SIZE = "spark.databricks.delta.optimize.maxFileSize"
OPTIMIZE_MIN_FILE_SIZE = "spark.databricks.delta.optimize.minFileSize"
# VACUUM START / VACUUM END commits in the table's history: the "last VACUUM" the next cycle reads.
VACUUM_LOGGING = "spark.databricks.delta.vacuum.logging.enabled"
# Delta 4 ignores VACUUM's retention argument (other than 0) unless this is off: `iotlake vacuum --retention
# 30 days` would delete with the table's shorter retention instead of keeping the 30 days asked for.
VACUUM_IGNORES_RETENTION = "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled"


@dataclass(frozen=True)
class OptimizeResult:
    """One OPTIMIZE: where, why, and the files before and after."""

    table: str
    partition: str
    reason: str
    outcome: str  # ok | conflict | failed
    files_before: int
    files_after: int
    files_removed: int = 0
    files_added: int = 0
    bytes_rewritten: int = 0
    duration_s: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class VacuumResult:
    table: str
    retention_s: float
    outcome: str  # ok | conflict | failed
    files_deleted: int = 0
    bytes_deleted: int = 0
    duration_s: float = 0.0
    error: str | None = None


@dataclass
class CycleReport:
    started: str
    healths: list[dict[str, Any]] = field(default_factory=list)
    optimized: list[OptimizeResult] = field(default_factory=list)
    vacuumed: list[VacuumResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # table -> why (backing off, not created)

    def to_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "tables": self.healths,
            "optimized": [asdict(r) for r in self.optimized],
            "vacuumed": [asdict(r) for r in self.vacuumed],
            "skipped": self.skipped,
        }


def partition_predicate(partition: str) -> str:
    """OPTIMIZE's partition filter for one date partition, built from a parsed date (never raw text)."""
    day = partition_date(partition)
    if day is None:
        raise ConfigError(f"Can't build a partition filter for {partition!r}: only date partitions are supported.")
    column = partition.split("=", 1)[0]
    if not column.isidentifier():
        raise ConfigError(f"Partition column {column!r} is not a plain identifier.")
    return f"`{column}` = DATE'{day.isoformat()}'"


def table_specs(settings: Settings, only: str | None = None) -> list[TableConfig]:
    """The three tables' configs, or the one named `only` (UnknownTableError names the tables)."""
    return [table.spec for table in chosen_tables(settings, only)]


def table_retention_s(settings: Settings) -> float:
    return parse_duration(settings.tables.deleted_file_retention, "tables.deleted_file_retention")


def check_vacuum(settings: Settings, table: str, retention_s: float | None) -> float:
    """The retention a VACUUM of `table` will use (default: the table's), after the safety checks.

    The stream's progress comes from its checkpoint (ingest.checkpoint_location, which this process must
    see: compose mounts the ingest's checkpoint volume read-only into maintain) and Kafka's end offsets.
    """
    retention = table_retention_s(settings) if retention_s is None else retention_s
    check_vacuum_retention(table, retention, table_retention_s(settings), None)  # before any I/O
    try:
        progress = stream_progress(settings)
    except ServiceUnreachableError as e:
        raise VacuumRefusedError(
            f"VACUUM {table}: can't tell whether the stream is behind: {first_line(e)} Not vacuuming until "
            "Kafka answers."
        ) from e
    if progress is None:
        log.warning(
            "VACUUM %s: no committed batch in the stream's checkpoint %s (ingest.checkpoint_location), so the "
            "guard can't tell whether the stream is behind. If the stream runs, point this setting at its "
            "checkpoint.",
            table,
            settings.ingest.checkpoint_uri,
        )
    check_vacuum_retention(table, retention, table_retention_s(settings), progress)
    return retention


class Backoff:
    """Per-table wait after a conflict: retry_backoff, doubling up to max_backoff; reset on success."""

    def __init__(self, base_s: float, max_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.base_s, self.max_s, self.clock = base_s, max_s, clock
        self._until: dict[str, float] = {}
        self._current: dict[str, float] = {}

    def waiting(self, table: str) -> float:
        """Seconds left before the table may be touched again (0: go)."""
        return max(self._until.get(table, 0.0) - self.clock(), 0.0)

    def conflict(self, table: str) -> float:
        delay = min(self._current.get(table, self.base_s / 2) * 2, self.max_s)
        self._current[table] = delay
        self._until[table] = self.clock() + delay
        return delay

    def success(self, table: str) -> None:
        self._current.pop(table, None)
        self._until.pop(table, None)


class Maintainer:
    """Measures, compacts and vacuums the three tables with one Spark session."""

    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        metrics: MaintenanceMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.metrics = metrics or MaintenanceMetrics()
        self.clock = clock
        m = settings.maintenance
        self.backoff = Backoff(m.retry_backoff_s, m.max_backoff_s)
        self._seen_version: dict[str, int] = {}
        self._commits: dict[str, tuple[Commit, ...]] = {}
        spark.conf.set(OPTIMIZE_MAX_FILE_SIZE, str(m.target_file_bytes))
        spark.conf.set(OPTIMIZE_MIN_FILE_SIZE, str(m.small_file_bytes))
        spark.conf.set(VACUUM_LOGGING, "true")
        spark.conf.set(VACUUM_IGNORES_RETENTION, "false")
        self._vacuumed_ms: dict[str, int] = {}  # also known without the history (e.g. logging turned off)
        for spec in table_specs(settings):  # every table's VACUUM series from the start, at 0 until it deletes
            for counter in (self.metrics.vacuum_files, self.metrics.vacuum_bytes, self.metrics.vacuum_skipped):
                counter.labels(spec.name)

    # --- tables ---

    def uri(self, spec: TableConfig) -> str:
        return self.settings.storage.table_uri(spec.name)

    @property
    def retention_s(self) -> float:
        return table_retention_s(self.settings)

    def measure(self, spec: TableConfig) -> TableHealth | None:
        """The table's health now (None: not created yet); records it and the churn since the last measurement.

        The first measurement reads the newest HISTORY_COMMITS commits, later ones only the commits since.
        """
        seen = self._seen_version.get(spec.name)
        table_log = read_table(self.settings, self.uri(spec), HISTORY_COMMITS, self.retention_s, since_version=seen)
        if table_log is None:
            return None
        now_ms = int(self.clock() * 1000)
        interval_s = self.settings.maintenance.interval_s
        commits = retain([*self._commits.get(spec.name, ()), *table_log.commits], interval_s, now_ms)
        self._commits[spec.name] = commits
        objects = list(list_objects(self.settings, self.uri(spec)))
        health = table_health(
            spec.name,
            table_log.version,
            table_log.files,
            commits,
            objects,
            vacuumable=table_log.vacuumable,
            small_file_bytes=self.settings.maintenance.small_file_bytes,
            interval_s=interval_s,
            now_ms=now_ms,
        )
        self._seen_version[spec.name] = table_log.version
        health = self._with_own_vacuum(health)
        self.metrics.record_health(health, churn(table_log.commits if seen is not None else ()))
        return health

    def _with_own_vacuum(self, health: TableHealth) -> TableHealth:
        """The health with this sidecar's last VACUUM, or its last finding of nothing to delete, if newer than the
        log's (which has none when VACUUM logging is off or the VACUUM was not run)."""
        own = self._vacuumed_ms.get(health.table, 0)
        return replace(health, last_vacuum_ms=own) if own > (health.last_vacuum_ms or 0) else health

    # --- operations ---

    def optimize(self, spec: TableConfig, task: CompactionTask, files_before: int) -> OptimizeResult:
        """OPTIMIZE one partition (or the whole table when unpartitioned / clustered), Z-ORDER if configured."""
        from delta.tables import DeltaTable

        started = time.monotonic()
        base: dict[str, Any] = {
            "table": spec.name,
            "partition": task.partition,
            "reason": task.reason,
            "files_before": files_before,
        }
        try:
            with self.metrics.operation(spec.name, "optimize"):
                builder = DeltaTable.forPath(self.spark, self.uri(spec)).optimize()
                if task.partition != UNPARTITIONED:
                    builder = builder.where(partition_predicate(task.partition))
                if spec.zorder_by and not spec.cluster_by:
                    out = builder.executeZOrderBy(*spec.zorder_by)
                else:
                    out = builder.executeCompaction()
                row = out.select("metrics.*").first()
        except Exception as e:  # every failure is counted and reported; the loop goes on
            return self._failed_optimize(spec, task, base, e, time.monotonic() - started)
        values = row.asDict(recursive=True) if row is not None else {}
        removed = int(values.get("numFilesRemoved") or 0)
        added = int(values.get("numFilesAdded") or 0)
        rewritten = int((values.get("filesRemoved") or {}).get("totalSize") or 0)
        self.metrics.files_compacted.labels(spec.name, "optimize").inc(removed)
        self.metrics.bytes_rewritten.labels(spec.name, "optimize").inc(rewritten)
        self.metrics.last_success.labels(spec.name, "optimize").set(self.clock())
        self.backoff.success(spec.name)
        result = OptimizeResult(
            **base,
            outcome="ok",
            files_after=max(files_before - removed, 0) + added,  # compact() replaces it with the measured count
            files_removed=removed,
            files_added=added,
            bytes_rewritten=rewritten,
            duration_s=round(time.monotonic() - started, 3),
        )
        log.info(
            OPTIMIZE_LOG,
            spec.name,
            task.partition or "(table)",
            result.files_before,
            result.files_after,
            removed,
            rewritten / 2**20,
            result.duration_s,
            task.reason,
        )
        return result

    def _failed_optimize(
        self, spec: TableConfig, task: CompactionTask, base: dict[str, Any], error: Exception, took: float
    ) -> OptimizeResult:
        conflict = is_conflict(error)
        counter = self.metrics.conflicts if conflict else self.metrics.failures
        counter.labels(spec.name, "optimize").inc()
        text = first_line(error)
        if conflict:
            wait = self.backoff.conflict(spec.name)
            log.warning("optimize %s %s: write conflict, retry in %.0fs: %s", spec.name, task.partition, wait, text)
        else:
            log.error("optimize %s %s failed: %s", spec.name, task.partition, text)
        return OptimizeResult(
            **base,
            outcome="conflict" if conflict else "failed",
            files_after=base["files_before"],
            duration_s=round(took, 3),
            error=text,
        )

    def vacuum(self, spec: TableConfig, retention_s: float | None = None) -> VacuumResult:
        """VACUUM with the table's retention (or a longer one), after the safety checks; what it deleted is
        measured by listing the table before and after."""
        from delta.tables import DeltaTable

        retention = check_vacuum(self.settings, spec.name, retention_s)
        uri = self.uri(spec)
        before = {o.path: o for o in list_objects(self.settings, uri)}
        started = time.monotonic()
        try:
            with self.metrics.operation(spec.name, "vacuum"):
                DeltaTable.forPath(self.spark, uri).vacuum(retention / 3600.0)
        except Exception as e:  # counted and reported; the loop goes on
            conflict = is_conflict(e)
            (self.metrics.conflicts if conflict else self.metrics.failures).labels(spec.name, "vacuum").inc()
            text = first_line(e)
            if conflict:
                wait = self.backoff.conflict(spec.name)
                log.warning("vacuum %s: write conflict, retry in %.0fs: %s", spec.name, wait, text)
            else:
                log.error("vacuum %s failed: %s", spec.name, text)
            return VacuumResult(spec.name, retention, "conflict" if conflict else "failed", error=text)
        after = {o.path for o in list_objects(self.settings, uri)}
        deleted: list[StoredObject] = [o for path, o in before.items() if path not in after]
        files, size = len(deleted), sum(o.size for o in deleted)
        self.metrics.vacuum_files.labels(spec.name).inc(files)
        self.metrics.vacuum_bytes.labels(spec.name).inc(size)
        self.metrics.last_success.labels(spec.name, "vacuum").set(self.clock())
        self._vacuumed_ms[spec.name] = int(self.clock() * 1000)
        took = round(time.monotonic() - started, 3)
        log.info("vacuum %s: deleted %d files (%.1f MiB) in %.1fs", spec.name, files, size / 2**20, took)
        return VacuumResult(spec.name, retention, "ok", files, size, took)

    def _nothing_to_vacuum(self, spec: TableConfig, health: TableHealth, now_ms: int) -> str:
        """A due VACUUM that could delete nothing is not run: counted, and recorded as this table's last."""
        self._vacuumed_ms[spec.name] = now_ms
        self.metrics.vacuum_skipped.labels(spec.name).inc()
        self.metrics.record_health(self._with_own_vacuum(health), churn(()))
        why = (
            f"not run: every object under the table is younger than its retention "
            f"({human_duration(self.retention_s)}), so VACUUM could delete none"
        )
        log.info("vacuum %s: %s", spec.name, why)
        return why

    def compact(self, spec: TableConfig, health: TableHealth, tasks: list[CompactionTask]) -> list[OptimizeResult]:
        """OPTIMIZE each task's partition in order, stopping at a conflict; then measure the table again, so
        its metrics show the work now and each result's files_after is the partition's real count (the stream
        may have added files meanwhile)."""
        by_partition = {p.partition: p.files for p in health.partitions}
        results = []
        for task in tasks:
            results.append(self.optimize(spec, task, by_partition[task.partition]))
            if results[-1].outcome == "conflict":
                break  # this table waits out its backoff; the other tables go on
        if any(r.outcome == "ok" for r in results):
            after = self.measure(spec)
            files = {p.partition: p.files for p in after.partitions} if after is not None else {}
            results = [replace(r, files_after=files.get(r.partition, 0)) if r.outcome == "ok" else r for r in results]
        return results

    # --- one cycle ---

    def cycle(self, vacuum: bool = True) -> CycleReport:
        """Measure every table; compact what crossed a bar; vacuum the tables that are due."""
        now = self.clock()
        now_ms = int(now * 1000)
        report = CycleReport(started=datetime.fromtimestamp(now, UTC).isoformat())
        for spec in table_specs(self.settings):
            waiting = self.backoff.waiting(spec.name)
            if waiting > 0:
                report.skipped[spec.name] = f"backing off after a write conflict ({waiting:.0f}s left)"
                continue
            health = self.measure(spec)
            if health is None:
                report.skipped[spec.name] = "not created yet"
                continue
            report.healths.append(health_summary(health))
            tasks = plan_compaction(health.partitions, datetime.fromtimestamp(now, UTC), self.settings.maintenance)
            report.optimized.extend(self.compact(spec, health, tasks))
            due = vacuum_due(health.last_vacuum_ms, now_ms, self.settings.maintenance.vacuum_interval_s)
            if vacuum and due:
                if not vacuum_could_delete(health.oldest_object_ms, now_ms, self.retention_s):
                    report.skipped[f"{spec.name} vacuum"] = self._nothing_to_vacuum(spec, health, now_ms)
                elif self.backoff.waiting(spec.name) == 0:
                    try:
                        report.vacuumed.append(self.vacuum(spec))
                    except VacuumRefusedError as e:  # refused by the safety checks: say why, try again next cycle
                        log.warning("%s", e)
                        report.skipped[f"{spec.name} vacuum"] = str(e)
            if any(v.table == spec.name and v.outcome == "ok" for v in report.vacuumed):
                self.measure(spec)  # the health metrics show this cycle's work now, not one interval later
        self.metrics.cycles.inc()
        return report


def health_summary(health: TableHealth) -> dict[str, Any]:
    """The numbers a person reads in a cycle report."""
    return {
        "table": health.table,
        "version": health.version,
        "files": health.files,
        "small_files": health.small_files,
        "small_file_ratio": round(health.small_file_ratio, 3),
        "bytes": health.bytes,
        "rows": health.rows,
        "partitions": len(health.partitions),
        "reclaimable_bytes": health.reclaimable_bytes,
    }


def manual_tasks(health: TableHealth, partition: date | None) -> list[CompactionTask]:
    """`iotlake optimize`: every partition with two or more small files (or the one asked for, if it has
    two or more files), whatever the sidecar's bars say."""
    tasks = []
    for p in health.partitions:
        if partition is not None and partition_date(p.partition) != partition:
            continue
        if p.small_files >= 2 or (partition is not None and p.files >= 2):
            tasks.append(CompactionTask(p.partition, True, p.files, p.small_files, "requested (iotlake optimize)"))
    return tasks


# Linux's scheduling group of this process's session: "/autogroup-<n> nice <k>". Absent without autogroups, and
# empty in the kernel's default group, where a process stays until it or an ancestor calls setsid (as a CI
# runner's processes may never do); nice alone orders a process there.
AUTOGROUP = Path("/proc/self/autogroup")


def group_niceness(text: str) -> int | None:
    """The nice of an autogroup from its `/proc/<pid>/autogroup` text; None when the process is in none."""
    try:
        return int(text.rsplit(" nice ", 1)[1])
    except (IndexError, ValueError):
        return None


def lower_priority(niceness: int) -> None:
    """Run this process, and the JVM it starts next, at least `niceness` below normal priority (never raised).

    The sidecar shares the machine with the stream: when both want the CPU, the kernel's scheduler then gives
    the stream most of it (weight 1024 against 110 at 10), and a compaction takes the time the stream leaves.
    Nice orders processes only inside one scheduling group, though. With Linux's autogroups (on in most
    distributions) each session is a group, and groups share the CPU equally: a sidecar in a session of its own
    at nice 10 took half the CPU from the stream. So a sidecar that leads its session (`make run`, the
    supervisor and the benchmark start it so) lowers the group too. One that doesn't shares its group with
    whatever started it, and leaves it alone.
    """
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if niceness > current:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    if os.getsid(0) != os.getpid():
        return
    try:
        group = group_niceness(AUTOGROUP.read_text())
    except OSError:
        group = None
    if group is None:
        return  # no autogroups here: nice alone decides
    if niceness > group:
        try:
            AUTOGROUP.write_text(f"{niceness}\n")
        except OSError as e:  # e.g. a read-only /proc: the sidecar runs, at its own nice only
            log.warning("could not lower this session's scheduling group to nice %d (%s)", niceness, e)


def session(settings: Settings) -> SparkSession:
    """The sidecar's (and the one-off commands') checked session, its JVM at the sidecar's lower priority."""
    from streaming.core.logstore import check_writers_safe
    from streaming.core.preflight import check_storage
    from streaming.core.session import build_session

    check_writers_safe(settings, "maintain")
    check_storage(settings)
    lower_priority(settings.maintenance.niceness)  # before the JVM starts: it inherits the priority
    return build_session(settings, app_name="iotlake-maintain")


def run(settings: Settings, once: bool = False, on_cycle: Callable[[CycleReport], None] | None = None) -> None:
    """The sidecar loop: a cycle every maintenance.interval until SIGINT/SIGTERM (or one with once)."""
    metrics = MaintenanceMetrics()
    spark = session(settings)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        metrics.serve(settings.maintenance.metrics_host, settings.maintenance.metrics_port)
        maintainer = Maintainer(spark, settings, metrics)
        metrics.up.set(1)
        while not stop.is_set():
            started = time.monotonic()
            try:
                report = maintainer.cycle()
            except IotLakeError:
                raise  # a configuration or credentials problem: the same next time, so stop and say it
            except Exception as e:  # a failed cycle is logged and retried next interval
                log.error("maintenance cycle failed: %s", first_line(e))
                metrics.failures.labels("*", "cycle").inc()
            else:
                if on_cycle is not None:
                    on_cycle(report)
            if once:
                break
            stop.wait(max(settings.maintenance.interval_s - (time.monotonic() - started), 0.0))
    finally:
        metrics.up.set(0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        spark.stop()
