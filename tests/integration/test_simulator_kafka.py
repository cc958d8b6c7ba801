"""sensor-sim against the real broker, with both client libraries: what arrives is exactly what was generated."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from producers.cli import parse_config, run
from producers.faults import DUPLICATE, LATE, MALFORMED_KINDS, OUT_OF_ORDER, VALID
from producers.metrics import SimulatorMetrics
from producers.options import SimOptions
from producers.stream import EventStream, simulate, wall_clock_ms
from stack.kafka import admin_client, ensure_topic
from streaming.core.config import Settings
from tests.unit.test_simulator_cli import FAULT_FLAGS, comparable, recent_start

pytestmark = pytest.mark.integration

COUNT = 3000


def faulty(start: int, count: int) -> SimOptions:
    """The options that FAULT_FLAGS with `--seed 8 --start-time <start> --count <count>` give."""
    return SimOptions(
        seed=8,
        start_time_ms=start,
        count=count,
        duplicate_rate=0.05,
        out_of_order_rate=0.05,
        late_rate=0.05,
        malformed_rate=0.05,
    )


@pytest.mark.parametrize("backend", ["confluent", "kafka-python"])
def test_backend_sends_exactly_the_generated_bytes(backend: str, settings: Settings, tmp_path: Path) -> None:
    start = recent_start()
    path = tmp_path / "s.json"
    argv = ["--bootstrap-servers", settings.kafka.bootstrap_servers, "--topic", settings.kafka.topic]
    argv += ["--backend", backend, "--rate", "0", "--count", str(COUNT), "--seed", "8", "--start-time", str(start)]
    argv += ["--summary-json", str(path), "--quiet", *FAULT_FLAGS]
    metrics = SimulatorMetrics()
    assert run(parse_config(argv, {}, wall_clock_ms()), metrics=metrics) == 0
    summary = json.loads(path.read_text())
    opts = faulty(start, COUNT)
    assert comparable(summary) == comparable(simulate(opts))
    assert summary["delivery_failed"] == 0 and summary["backend"] == backend

    # The metrics count what Kafka acknowledged, by kind, and time every delivered message.
    value = metrics.registry.get_sample_value

    def sent_of(kind: str) -> float:
        count = value("iot_sim_messages_sent_total", {"kind": kind})
        assert count is not None, f"no sent count for kind {kind}"
        return count

    sent = {kind: sent_of(kind) for kind in (VALID, *MALFORMED_KINDS, DUPLICATE, LATE, OUT_OF_ORDER)}
    assert sent[DUPLICATE] == summary["duplicates"]
    assert sent[LATE] == summary["late"] and sent[OUT_OF_ORDER] == summary["out_of_order"]
    assert sent[VALID] == summary["valid_distinct"] - summary["late"] - summary["out_of_order"]
    assert all(sent[kind] == summary["malformed_by_kind"][kind] for kind in MALFORMED_KINDS)
    assert sum(sent.values()) == summary["sent_total"] == COUNT
    assert all(value("iot_sim_messages_failed_total", {"kind": kind}) == 0 for kind in sent)
    assert value("iot_sim_delivery_latency_seconds_count") == summary["sent_total"]
    latency_sum = value("iot_sim_delivery_latency_seconds_sum")
    assert latency_sum is not None and 0 < latency_sum < 120 * COUNT

    received = consume_all(settings)
    expected = [(m.key, m.value) for m in EventStream(opts)]
    assert sorted((key, value) for key, value, _ in received) == sorted(expected)
    # Keyed by device: all messages of one device share a partition, and the devices spread over several.
    partitions_of_key: dict[bytes, set[int]] = {}
    for key, _, partition in received:
        partitions_of_key.setdefault(key, set()).add(partition)
    assert all(len(p) == 1 for p in partitions_of_key.values())
    assert len(set().union(*partitions_of_key.values())) > 1


def consume_all(settings: Settings) -> list[tuple[bytes, bytes, int]]:
    """The topic's COUNT messages as (key, value, partition), from the start; fails if fewer come back."""
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": "t", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([settings.kafka.topic])
    received: list[tuple[bytes, bytes, int]] = []
    try:
        while len(received) < COUNT:
            batch = consumer.consume(1000, timeout=15)
            assert batch, f"only {len(received)} of {COUNT} messages came back"
            for m in batch:
                assert m.error() is None, m.error()
                key, payload, partition = m.key(), m.value(), m.partition()
                assert key is not None and payload is not None and partition is not None, m
                received.append((key, payload, partition))
    finally:
        consumer.close()
    return received


def test_workers_send_exactly_their_shares_through_the_broker(settings: Settings, tmp_path: Path) -> None:
    """--workers 2: two producers; the topic holds exactly the messages of both workers' streams, once each."""
    from producers.accounting import merge_summaries
    from producers.cli import run_workers, worker_config

    start = recent_start()
    path = tmp_path / "s.json"
    argv = ["--bootstrap-servers", settings.kafka.bootstrap_servers, "--topic", settings.kafka.topic]
    argv += ["--workers", "2", "--rate", "0", "--count", str(COUNT), "--seed", "8", "--start-time", str(start)]
    argv += ["--summary-json", str(path), "--quiet", *FAULT_FLAGS]
    config = parse_config(argv, {}, wall_clock_ms())
    assert run_workers(config) == 0
    summary = json.loads(path.read_text())
    shares = [worker_config(config, w, tmp_path / f"{w}.json").options for w in range(2)]
    assert comparable(summary) == comparable(merge_summaries([simulate(o) for o in shares]))
    assert summary["sent_total"] == COUNT and summary["delivery_failed"] == 0 and summary["workers"] == 2

    expected = [(m.key, m.value) for o in shares for m in EventStream(o)]
    assert sorted((key, value) for key, value, _ in consume_all(settings)) == sorted(expected)


@pytest.mark.parametrize("backend", ["confluent", "kafka-python"])
def test_a_topic_refusing_every_batch_counts_every_message_failed_by_kind(
    backend: str, settings: Settings, tmp_path: Path
) -> None:
    """A topic that refuses every batch (max.message.bytes below a batch's header), so each report is a failure:
    each message is counted failed once, by its kind, and none is left unconfirmed. (Which of confluent's reports
    belongs to which message is `InFlight`'s, tested in tests/unit/test_simulator.py.) kafka-python splits a
    refused batch and sends the halves again, down to single messages, which are refused too.
    """
    topic = f"{settings.kafka.topic}-refusing"
    # Created, then awaited until the broker's metadata has it: create_topics returns once the controller has
    # committed the topic, which can be before the broker the simulator asks has applied it.
    ensure_topic(settings, topic=topic, partitions=3, timeout=30, config={"max.message.bytes": "64"})
    admin = admin_client(settings.kafka.bootstrap_servers)
    count, start = 300, recent_start()
    path = tmp_path / "s.json"
    argv = ["--bootstrap-servers", settings.kafka.bootstrap_servers, "--topic", topic, "--backend", backend]
    argv += ["--rate", "0", "--count", str(count), "--seed", "8", "--start-time", str(start), "--quiet"]
    argv += ["--delivery-timeout", "20", "--summary-json", str(path), *FAULT_FLAGS]
    metrics = SimulatorMetrics()
    try:
        assert run(parse_config(argv, {}, wall_clock_ms()), metrics=metrics) == 1
    finally:
        admin.delete_topics([topic], operation_timeout=5)
    summary = json.loads(path.read_text())
    assert (summary["sent_total"], summary["delivery_failed"], summary["latest_by_device"]) == (0, count, {})
    assert sum(summary["delivery_errors"].values()) == count and "unconfirmed_at_exit" not in summary["delivery_errors"]
    opts = faulty(start, count)
    generated = Counter(m.kind for m in EventStream(opts))
    failed = {k: metrics.registry.get_sample_value("iot_sim_messages_failed_total", {"kind": k}) for k in generated}
    assert failed == generated and len(generated) > 4
