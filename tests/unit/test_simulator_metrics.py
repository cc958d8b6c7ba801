"""sensor-sim's Prometheus metrics: counts by kind, failures, delivery latency, the /metrics server."""

from __future__ import annotations

import io
import json
import socket
import sys
import urllib.request
from pathlib import Path

import pytest

from producers.accounting import Accounting
from producers.backends import KafkaPythonBackend, KafkaTarget
from producers.cli import counted, main, parse_config, run
from producers.faults import DUPLICATE, LATE, MALFORMED_KINDS, OUT_OF_ORDER, VALID
from producers.metrics import SimulatorMetrics
from producers.options import SimOptions
from producers.stream import EventStream
from tests.helpers import free_port
from tests.unit.test_simulator_cli import FAULT_FLAGS, fake_kafka_module, recent_start

pytestmark = pytest.mark.unit

KINDS = (VALID, DUPLICATE, OUT_OF_ORDER, LATE, *MALFORMED_KINDS)


def sent(metrics: SimulatorMetrics, kind: str) -> float:
    return metrics.registry.get_sample_value("iot_sim_messages_sent_total", {"kind": kind}) or 0.0


def test_sent_counters_match_the_summary_by_kind(tmp_path: Path) -> None:
    metrics = SimulatorMetrics()
    summary_path = tmp_path / "s.json"
    argv = ["--dry-run", "--rate", "0", "--count", "5000", "--seed", "3", "--quiet", *FAULT_FLAGS]
    cfg = parse_config(
        [*argv, "--start-time", str(recent_start()), "--summary-json", str(summary_path)], {}, recent_start() + 600_000
    )
    assert run(cfg, stdout=io.StringIO(), stderr=io.StringIO(), metrics=metrics) == 0
    summary = json.loads(summary_path.read_text())
    assert sent(metrics, DUPLICATE) == summary["duplicates"] > 0
    assert sent(metrics, LATE) == summary["late"] > 0
    assert sent(metrics, OUT_OF_ORDER) == summary["out_of_order"] > 0
    assert sent(metrics, VALID) == summary["valid_distinct"] - summary["late"] - summary["out_of_order"]
    for kind in MALFORMED_KINDS:
        assert sent(metrics, kind) == summary["malformed_by_kind"][kind]
    assert sum(sent(metrics, k) for k in KINDS) == summary["sent_total"] == 5000
    value = metrics.registry.get_sample_value
    assert all(value("iot_sim_messages_failed_total", {"kind": k}) == 0 for k in KINDS)  # exported from 0
    assert value("iot_sim_delivery_latency_seconds_count") == 0  # a dry run delivers nothing


def test_failures_by_kind_and_one_latency_per_delivered_message(monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = fake_kafka_module()
    monkeypatch.setitem(sys.modules, "kafka", kafka)
    monkeypatch.setitem(sys.modules, "kafka.errors", kafka.errors)
    options = SimOptions(seed=1, start_time_ms=recent_start(), devices=4, parcels=2, count=40)
    metrics = SimulatorMetrics()
    on_ack, on_fail = counted(Accounting(options), metrics)
    backend = KafkaPythonBackend(KafkaTarget("h:9092", "t"), on_ack, on_fail, metrics.delivery_latency.observe)
    backend.connect(1.0)
    for m in EventStream(options):
        backend.send(m)
    assert backend.flush(5.0) == 0  # the fake client fails every message with seq 3 (one per device)
    value = metrics.registry.get_sample_value
    assert value("iot_sim_messages_failed_total", {"kind": VALID}) == 4
    assert sum(sent(metrics, k) for k in KINDS) == 36
    assert value("iot_sim_delivery_latency_seconds_count") == 36
    assert value("iot_sim_delivery_latency_seconds_sum") >= 0


def test_metrics_are_served_over_http_and_stop_cleanly() -> None:
    metrics = SimulatorMetrics()
    metrics.sent.labels(VALID).inc(7)
    port = free_port()
    stop = metrics.serve("127.0.0.1", port)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        stop()
    assert 'iot_sim_messages_sent_total{kind="valid"} 7.0' in body
    assert "iot_sim_delivery_latency_seconds_bucket" in body
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_metrics_port_flag_env_fallback_and_range() -> None:
    assert parse_config(["--dry-run"], {}, recent_start()).metrics_port == 0
    env = {"SENSOR_SIM_METRICS_PORT": "9110", "SENSOR_SIM_METRICS_HOST": "0.0.0.0"}
    cfg = parse_config(["--dry-run"], env, recent_start())
    assert (cfg.metrics_port, cfg.metrics_host) == (9110, "0.0.0.0")
    assert parse_config(["--dry-run", "--metrics-port", "9111"], env, recent_start()).metrics_port == 9111


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_metrics_port_out_of_range_exits_2(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dry-run", "--count", "10", "--metrics-port", port]) == 2
    assert "--metrics-port must be 0..65535" in capsys.readouterr().err


def test_a_busy_metrics_port_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["--dry-run", "--count", "10", "--quiet", "--metrics-port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in err and "choose a free port" in err
