"""Every metric of the service, in one place (names: iot_<area>_<name>_<unit>, counters end in _total).

Each process has its own registry, so a test reads a fresh one: IngestMetrics (the streaming job),
MaintenanceMetrics (the sidecar: table health and maintenance actions), SimulatorMetrics (sensor-sim).
"""

from __future__ import annotations

import json
import math
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from streaming.errors import ConfigError
from streaming.health import Churn, TableHealth


def fetch(url: str, timeout: float = 2.0) -> str | None:
    """The text of a /metrics page, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            text: str = response.read().decode()
            return text
    except OSError:
        return None


def samples(text: str) -> dict[str, float]:
    """Every sample of a /metrics page by `name{k=v,...}` (labels sorted), and by `name` (its samples summed)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
            if sample.labels:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def scrape(url: str, timeout: float = 2.0) -> dict[str, float]:
    """samples() of a /metrics page; {} while nothing answers."""
    text = fetch(url, timeout)
    return samples(text) if text is not None else {}


def serve(registry: CollectorRegistry, host: str, port: int, setting: str | None = None) -> Callable[[], None]:
    """Expose a registry's /metrics over HTTP (port 0 = don't); returns a function that stops the server.

    With `setting` (the config key of the port), a port that can't be bound is a ConfigError naming it.
    """
    if not port:
        return lambda: None
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        if setting is None:
            raise
        raise ConfigError(
            f"{setting}: can't serve /metrics on {host}:{port} ({e.strerror or e}). Another process holds the "
            f"port: stop it, choose a free port (env IOTLAKE_{setting.upper().replace('.', '__')}), or 0 for none."
        ) from e

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop


# Produce-to-acknowledgement times: a local broker answers in milliseconds, a loaded one in seconds.
DELIVERY_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass
class IngestMetrics:
    """The streaming job's metrics on their own registry, so tests can read a fresh one."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.batches = Counter("iot_ingest_batches_total", "Micro-batches committed", registry=r)
        self.input_rows = Counter("iot_ingest_input_rows_total", "Kafka messages read", registry=r)
        self.rows = Counter(
            "iot_ingest_rows_total",
            "Messages by outcome (ok, warn, drop, quarantine)",
            ["outcome"],
            registry=r,
        )
        self.quarantined = Counter(
            "iot_ingest_quarantined_rows_total", "Quarantined messages by rule", ["rule"], registry=r
        )
        self.merged = Counter(
            "iot_ingest_merged_rows_total",
            "Rows written by MERGE, by table and kind",
            ["table", "kind"],
            registry=r,
        )
        self.write_conflicts = Counter(
            "iot_ingest_write_conflicts_total",
            "Table writes that lost a conflict to another writer and were retried",
            ["table"],
            registry=r,
        )
        self.duplicates = Counter(
            "iot_ingest_duplicate_rows_total", "Valid messages not inserted: already seen", registry=r
        )
        self.batch_seconds = Histogram(
            "iot_ingest_batch_duration_seconds",
            "Wall time of one foreachBatch call",
            buckets=(0.5, 1, 2, 4, 8, 15, 30, 60, 120),
            registry=r,
        )
        self.phase_seconds = Gauge(
            "iot_ingest_batch_phase_seconds",
            "Last batch's durationMs by phase, in seconds",
            ["phase"],
            registry=r,
        )
        self.step_seconds = Gauge(
            "iot_ingest_batch_step_seconds",
            "Last batch's wall time by step (validate, quarantine_append, readings_merge, device_state_merge)",
            ["step"],
            registry=r,
        )
        self.input_rate = Gauge("iot_ingest_input_rows_per_second", "Input rate of the last batch", registry=r)
        self.processed_rate = Gauge(
            "iot_ingest_processed_rows_per_second", "Processing rate of the last batch", registry=r
        )
        self.lag = Gauge(
            "iot_ingest_kafka_lag_messages", "Messages behind the latest offset", ["partition"], registry=r
        )
        self.last_batch = Gauge("iot_ingest_last_batch_id", "Id of the last committed batch", registry=r)
        self.newest_event = Gauge(
            "iot_ingest_newest_event_timestamp_seconds", "Newest event time committed to readings", registry=r
        )
        self.up = Gauge("iot_ingest_query_up", "1 while the streaming query runs", registry=r)
        self.starts = Counter(
            "iot_ingest_query_starts_total", "Streaming query starts by this process (restarts show as > 1)", registry=r
        )
        self.freshness = Gauge(
            "iot_ingest_freshness_seconds",
            "Now minus the newest event time committed to readings (NaN before the first event)",
            registry=r,
        )
        self.freshness.set_function(self._freshness)

    def set_newest_event(self, seconds: float) -> None:
        """The newest event time committed (Unix seconds); freshness is measured from it at scrape time."""
        self._newest_event_s = seconds
        self.newest_event.set(seconds)

    def _freshness(self) -> float:
        newest = getattr(self, "_newest_event_s", 0.0)
        return time.time() - newest if newest > 0 else math.nan

    def serve(self, host: str, port: int) -> Callable[[], None]:
        return serve(self.registry, host, port, "ingest.metrics_port")

    def record_progress(self, progress_json: str) -> None:
        """Rates, phase durations and per-partition lag from one StreamingQueryProgress."""
        progress = json.loads(progress_json)
        self.input_rate.set(progress.get("inputRowsPerSecond") or 0.0)
        self.processed_rate.set(progress.get("processedRowsPerSecond") or 0.0)
        for phase, ms in (progress.get("durationMs") or {}).items():
            self.phase_seconds.labels(phase).set(ms / 1000.0)
        for partition, lag in kafka_lag(progress).items():
            self.lag.labels(str(partition)).set(lag)


def kafka_lag(progress: dict) -> dict[int, int]:
    """Per partition: latestOffset - endOffset of the Kafka source(s) in a progress report."""
    lag: dict[int, int] = {}
    for source in progress.get("sources") or []:
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        for topic, partitions in latest.items():
            for partition, offset in partitions.items():
                done = end.get(topic, {}).get(partition, offset)
                lag[int(partition)] = lag.get(int(partition), 0) + max(int(offset) - int(done), 0)
    return lag


def _offsets(value: object) -> dict[str, dict[str, int]]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


# --- the maintenance sidecar -------------------------------------------------------------------------

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
        "Seconds since the last VACUUM seen in the history read (NaN: none seen)",
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
        self.last_success = Gauge(
            "iot_maintenance_last_success_timestamp_seconds",
            "When an operation last succeeded (Unix time)",
            labels,
            registry=r,
        )
        self.cycles = Counter("iot_maintenance_cycles_total", "Maintenance cycles completed", registry=r)
        self.up = Gauge("iot_maintenance_up", "1 while the sidecar loop runs", registry=r)

    def serve(self, host: str, port: int) -> Callable[[], None]:
        return serve(self.registry, host, port, "maintenance.metrics_port")

    def record_health(self, health: TableHealth, new_commits: Churn) -> None:
        """The table's newest health, and the churn of the commits since the previous cycle."""
        self.health.healths[health.table] = health
        for key, counter in self.churn.items():
            counter.labels(health.table).inc(getattr(new_commits, key))


# --- the simulator ----------------------------------------------------------------------------------


@dataclass
class SimulatorMetrics:
    """sensor-sim's metrics on their own registry (names: iot_sim_<name>_<unit>)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.sent = Counter(
            "iot_sim_messages_sent_total",
            "Messages Kafka acknowledged, by kind (valid, duplicate, out_of_order, late, or a malformed kind)",
            ["kind"],
            registry=r,
        )
        self.failed = Counter(
            "iot_sim_messages_failed_total",
            "Messages Kafka refused or never acknowledged, by kind (unconfirmed_at_exit: no report at exit)",
            ["kind"],
            registry=r,
        )
        self.delivery_latency = Histogram(
            "iot_sim_delivery_latency_seconds",
            "Time from handing a message to the client to its successful delivery report",
            buckets=DELIVERY_LATENCY_BUCKETS,
            registry=r,
        )

    def serve(self, host: str, port: int) -> Callable[[], None]:
        return serve(self.registry, host, port)
