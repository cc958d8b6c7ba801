"""sensor-sim against the real broker, with both client libraries: what arrives is exactly what was generated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from producers.cli import main
from producers.options import SimOptions
from producers.stream import EventStream, simulate
from streaming.config import Settings
from tests.unit.test_simulator_cli import FAULT_FLAGS, comparable, recent_start

pytestmark = pytest.mark.integration

COUNT = 3000


@pytest.mark.parametrize("backend", ["confluent", "kafka-python"])
def test_backend_sends_exactly_the_generated_bytes(backend: str, settings: Settings, tmp_path: Path) -> None:
    start = recent_start()
    path = tmp_path / "s.json"
    argv = ["--bootstrap-servers", settings.kafka.bootstrap_servers, "--topic", settings.kafka.topic]
    argv += ["--backend", backend, "--rate", "0", "--count", str(COUNT), "--seed", "8", "--start-time", str(start)]
    argv += ["--summary-json", str(path), "--quiet", *FAULT_FLAGS]
    assert main(argv) == 0
    summary = json.loads(path.read_text())
    opts = SimOptions(
        seed=8,
        start_time_ms=start,
        count=COUNT,
        duplicate_rate=0.05,
        out_of_order_rate=0.05,
        late_rate=0.05,
        malformed_rate=0.05,
    )
    assert comparable(summary) == comparable(simulate(opts))
    assert summary["delivery_failed"] == 0 and summary["backend"] == backend

    consumer = Consumer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": "t", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([settings.kafka.topic])
    received: list[tuple[bytes, bytes]] = []
    partitions_of_key: dict[bytes, set[int]] = {}
    try:
        while len(received) < COUNT:
            batch = consumer.consume(1000, timeout=15)
            assert batch, f"only {len(received)} of {COUNT} messages came back"
            for m in batch:
                assert m.error() is None, m.error()
                received.append((m.key(), m.value()))
                partitions_of_key.setdefault(m.key(), set()).add(m.partition())
    finally:
        consumer.close()
    expected = [(m.key, m.value) for m in EventStream(opts)]
    assert sorted(received) == sorted(expected)
    # Keyed by device: all messages of one device share a partition, and the devices spread over several.
    assert all(len(p) == 1 for p in partitions_of_key.values())
    assert len(set().union(*partitions_of_key.values())) > 1
