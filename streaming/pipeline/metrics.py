"""The streaming job's metrics (iot_ingest_*), on their own registry so a test reads a fresh one."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from streaming.core.prometheus import serve


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
            "Last batch's wall time by step (validate, quarantine_append, readings_merge, device_state_merge or _fold)",
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
