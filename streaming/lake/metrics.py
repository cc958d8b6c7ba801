"""The maintenance sidecar's metrics: table health (iot_table_*) and what maintenance did (iot_maintenance_*)."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from streaming.core.prometheus import serve
from streaming.lake.health import Churn, TableHealth

# name -> (help, value of a TableHealth at scrape time `now`)
_HEALTH_GAUGES: dict[str, tuple[str, Callable[[TableHealth, float], float]]] = {
    "iot_table_files": ("Live data files in the current version", lambda h, now: h.files),
    "iot_table_small_files": ("Live data files below maintenance.small_file_mb", lambda h, now: h.small_files),
    "iot_table_small_file_ratio": ("Small files / files (0..1)", lambda h, now: h.small_file_ratio),
    "iot_table_bytes": ("Bytes of live data files", lambda h, now: h.bytes),
    "iot_table_avg_file_bytes": ("Average live data file size in bytes", lambda h, now: h.avg_file_bytes),
    "iot_table_rows": ("Rows in the current version (from file statistics)", lambda h, now: h.rows),
    "iot_table_partitions": ("Partitions with live files", lambda h, now: len(h.partitions)),
    "iot_table_partition_skew_ratio": (
        "Largest partition's bytes / the median partition's bytes",
        lambda h, now: h.partition_skew,
    ),
    "iot_table_version": ("Current Delta table version", lambda h, now: h.version),
    "iot_table_commits_last_interval": (
        "Commits within the last maintenance.interval",
        lambda h, now: h.commits_last_interval,
    ),
    "iot_table_last_commit_age_seconds": ("Seconds since the last commit", lambda h, now: _age(h.last_commit_ms, now)),
    "iot_table_last_optimize_age_seconds": (
        "Seconds since the last OPTIMIZE seen in the history read (NaN: none seen)",
        lambda h, now: _age(h.last_optimize_ms, now),
    ),
    "iot_table_last_vacuum_age_seconds": (
        "Seconds since the last VACUUM seen in the history read or run by this sidecar, or since it found nothing "
        "VACUUM could delete (NaN: none)",
        lambda h, now: _age(h.last_vacuum_ms, now),
    ),
    "iot_table_checkpoint_age_seconds": (
        "Seconds since the newest Delta log checkpoint was written (NaN: none yet)",
        lambda h, now: _age(h.checkpoint_ms, now),
    ),
    "iot_table_vacuum_reclaimable_files": (
        "Unreferenced data files older than the retention: what VACUUM would delete now",
        lambda h, now: h.reclaimable_files,
    ),
    "iot_table_vacuum_reclaimable_bytes": (
        "Bytes of the files VACUUM would delete now",
        lambda h, now: h.reclaimable_bytes,
    ),
}

_CHURN_COUNTERS: dict[str, tuple[str, str]] = {
    "files_added": ("iot_table_files_added_total", "Data files added by commits seen by the sidecar"),
    "files_removed": ("iot_table_files_removed_total", "Data files removed by commits seen by the sidecar"),
    "bytes_added": ("iot_table_bytes_added_total", "Bytes added by commits seen by the sidecar"),
    "bytes_removed": ("iot_table_bytes_removed_total", "Bytes removed by commits seen by the sidecar"),
    "rows_inserted": ("iot_table_rows_inserted_total", "Rows inserted (MERGE/append), from operationMetrics"),
    "rows_updated": ("iot_table_rows_updated_total", "Rows updated (MERGE/UPDATE), from operationMetrics"),
    "rows_deleted": ("iot_table_rows_deleted_total", "Rows deleted (MERGE/DELETE), from operationMetrics"),
}


def _age(stamp_ms: int | None, now: float) -> float:
    return max(now - stamp_ms / 1000.0, 0.0) if stamp_ms else math.nan


class TableHealthCollector(Collector):
    """Exports the newest TableHealth of every table; ages are computed at scrape time."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.healths: dict[str, TableHealth] = {}
        self.clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock()
        for name, (help_text, value) in _HEALTH_GAUGES.items():
            family = GaugeMetricFamily(name, help_text, labels=["table"])
            for table, health in sorted(self.healths.items()):
                family.add_metric([table], float(value(health, now)))
            yield family

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for name, (help_text, _) in _HEALTH_GAUGES.items():
            yield GaugeMetricFamily(name, help_text, labels=["table"])


@dataclass
class MaintenanceMetrics:
    """The sidecar's metrics: table health (per cycle) and what maintenance did."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        r = self.registry
        self.health = TableHealthCollector(self.clock)
        r.register(self.health)
        self.churn = {
            key: Counter(name, help_text, ["table"], registry=r) for key, (name, help_text) in _CHURN_COUNTERS.items()
        }
        labels = ["table", "operation"]
        self.runs = Counter("iot_maintenance_runs_total", "Maintenance operations started", labels, registry=r)
        self.duration = Histogram(
            "iot_maintenance_duration_seconds",
            "Wall time of one maintenance operation",
            labels,
            buckets=(1, 5, 15, 30, 60, 120, 300, 900, 1800),
            registry=r,
        )
        self.files_compacted = Counter(
            "iot_maintenance_files_compacted_total", "Files OPTIMIZE removed (compacted away)", labels, registry=r
        )
        self.bytes_rewritten = Counter(
            "iot_maintenance_bytes_rewritten_total", "Bytes OPTIMIZE rewrote", labels, registry=r
        )
        self.conflicts = Counter(
            "iot_maintenance_conflicts_total",
            "Operations that lost a write conflict with another writer (retried later)",
            labels,
            registry=r,
        )
        self.failures = Counter(
            "iot_maintenance_failures_total", "Operations that failed for another reason", labels, registry=r
        )
        self.vacuum_files = Counter(
            "iot_maintenance_vacuum_files_deleted_total", "Files VACUUM deleted", ["table"], registry=r
        )
        self.vacuum_bytes = Counter(
            "iot_maintenance_vacuum_bytes_deleted_total", "Bytes VACUUM deleted", ["table"], registry=r
        )
        self.vacuum_skipped = Counter(
            "iot_maintenance_vacuum_skipped_total",
            "Due VACUUMs not run: every object under the table was younger than its retention, none deletable",
            ["table"],
            registry=r,
        )
        self.last_success = Gauge(
            "iot_maintenance_last_success_timestamp_seconds",
            "When an operation last succeeded (Unix time)",
            labels,
            registry=r,
        )
        self.in_progress = Gauge(
            "iot_maintenance_in_progress", "1 while the operation runs on the table", labels, registry=r
        )
        self.cycles = Counter("iot_maintenance_cycles_total", "Maintenance cycles completed", registry=r)
        self.up = Gauge("iot_maintenance_up", "1 while the sidecar loop runs", registry=r)

    def serve(self, host: str, port: int) -> Callable[[], None]:
        return serve(self.registry, host, port, "maintenance.metrics_port")

    @contextlib.contextmanager
    def operation(self, table: str, operation: str) -> Iterator[None]:
        """One maintenance operation: counted when it starts, timed, and in progress until it ends (or fails)."""
        self.runs.labels(table, operation).inc()
        running = self.in_progress.labels(table, operation)
        running.set(1)
        try:
            with self.duration.labels(table, operation).time():
                yield
        finally:
            running.set(0)

    def record_health(self, health: TableHealth, new_commits: Churn) -> None:
        """The table's newest health, and the churn of the commits since the previous cycle."""
        self.health.healths[health.table] = health
        for key, counter in self.churn.items():
            counter.labels(health.table).inc(getattr(new_commits, key))
