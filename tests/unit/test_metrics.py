"""The streaming job's metrics: Kafka lag and phases from a progress report, on a fresh registry."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from streaming.core.prometheus import samples
from streaming.lake.metrics import MaintenanceMetrics
from streaming.pipeline.metrics import IngestMetrics, kafka_lag

pytestmark = pytest.mark.unit

PROGRESS = {
    "inputRowsPerSecond": 1500.0,
    "processedRowsPerSecond": 1200.5,
    "durationMs": {"addBatch": 3200, "triggerExecution": 3500},
    "sources": [
        {
            "endOffset": json.dumps({"t": {"0": 100, "1": 50}}),
            "latestOffset": json.dumps({"t": {"0": 130, "1": 50, "2": 7}}),
        }
    ],
}


def test_kafka_lag_per_partition() -> None:
    assert kafka_lag(PROGRESS) == {0: 30, 1: 0, 2: 0}
    assert kafka_lag({"sources": [{"endOffset": None, "latestOffset": "not json"}]}) == {}


def test_progress_updates_rates_phases_and_lag() -> None:
    metrics = IngestMetrics()
    metrics.record_progress(json.dumps(PROGRESS))
    value = metrics.registry.get_sample_value
    assert value("iot_ingest_input_rows_per_second") == 1500.0
    assert value("iot_ingest_processed_rows_per_second") == 1200.5
    assert value("iot_ingest_batch_phase_seconds", {"phase": "addBatch"}) == 3.2
    assert value("iot_ingest_kafka_lag_messages", {"partition": "0"}) == 30
    assert value("iot_ingest_kafka_lag_messages", {"partition": "1"}) == 0


def test_each_instance_has_its_own_registry() -> None:
    first, second = IngestMetrics(), IngestMetrics()
    first.batches.inc(3)
    assert first.registry.get_sample_value("iot_ingest_batches_total") == 3
    assert second.registry.get_sample_value("iot_ingest_batches_total") == 0


def test_freshness_is_now_minus_the_newest_committed_event_at_scrape_time() -> None:
    import math
    import time

    metrics = IngestMetrics()
    value = metrics.registry.get_sample_value
    assert math.isnan(value("iot_ingest_freshness_seconds") or 0.0)  # nothing committed yet
    metrics.set_newest_event(time.time() - 42)
    assert value("iot_ingest_freshness_seconds") == pytest.approx(42, abs=2)
    assert value("iot_ingest_newest_event_timestamp_seconds") == pytest.approx(time.time() - 42, abs=2)


def test_every_metric_follows_the_naming_convention_and_has_help() -> None:
    import re

    from streaming.lake.metrics import MaintenanceMetrics

    for registry in (IngestMetrics().registry, MaintenanceMetrics().registry):
        for family in registry.collect():
            assert re.fullmatch(r"iot_(ingest|table|maintenance)_[a-z_]+", family.name), family.name
            assert family.documentation, family.name
            if family.type == "counter":
                assert all(s.name.endswith(("_total", "_created")) for s in family.samples), family.name


def test_a_metrics_port_in_use_is_a_config_error_naming_the_key() -> None:
    import socket

    from streaming.core.errors import ConfigError

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match=r"ingest\.metrics_port: can't serve /metrics on 127\.0\.0\.1:\d+"):
            IngestMetrics().serve("127.0.0.1", port)
    finally:
        holder.close()


def test_samples_of_a_metrics_page_by_labels_and_summed_by_name() -> None:
    metrics = MaintenanceMetrics(registry=CollectorRegistry())
    metrics.runs.labels("readings", "optimize").inc(3)
    metrics.runs.labels("quarantine", "vacuum").inc()
    got = samples(generate_latest(metrics.registry).decode())
    assert got["iot_maintenance_runs_total{operation=optimize,table=readings}"] == 3
    assert got["iot_maintenance_runs_total{operation=vacuum,table=quarantine}"] == 1
    assert got["iot_maintenance_runs_total"] == 4
    assert "iot_maintenance_runs_created" in got  # its own name, not summed into _total


def test_an_operation_is_counted_timed_and_shown_in_progress_while_it_runs() -> None:
    metrics = MaintenanceMetrics(registry=CollectorRegistry())

    def shown() -> dict[str, float]:
        return samples(generate_latest(metrics.registry).decode())

    with metrics.operation("readings", "optimize"):
        during = shown()
    with pytest.raises(RuntimeError), metrics.operation("readings", "optimize"):
        raise RuntimeError("OPTIMIZE failed")
    after = shown()
    key = "{operation=optimize,table=readings}"
    assert during[f"iot_maintenance_in_progress{key}"] == 1
    assert during[f"iot_maintenance_runs_total{key}"] == 1
    assert after[f"iot_maintenance_in_progress{key}"] == 0  # a failed one too
    assert after[f"iot_maintenance_runs_total{key}"] == 2
    assert after[f"iot_maintenance_duration_seconds_count{key}"] == 2
