"""A two-node Kafka (KRaft on loopback: node 1 broker + controller, node 2 broker only), a topic with
replication factor 2, and the streaming job surviving the SIGKILL of one broker with exact counts; and the Kafka
source's offset lookup finding the new leader right after that kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import ConfigResource, ResourceType
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from stack import StackLayout, kafka, proc
from stack.install import install
from stack.layout import default_cache
from streaming.core.config import Settings, load_settings
from tests.helpers import free_port, free_port_pair, wait_for
from tests.integration.lake import assert_tables_match, batch_ids, committed_offsets_sum, simulate
from tests.integration.test_pipeline import FAULTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def two_brokers(test_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[dict[str, str], StackLayout]]:
    """Two Kafka nodes of their own (own home, free ports) and the test env pointing at both."""
    layout = StackLayout(home=tmp_path / "kafka-home", cache=default_cache())
    first = free_port_pair()
    second = free_port({first, first + 1})
    env = {
        **test_env,
        "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{first},127.0.0.1:{second}",
        "IOTLAKE_KAFKA__SASL_LISTENER_PORT": "0",  # the SASL listener is the one-node test stack's
    }
    settings = load_settings(env=env)
    try:
        pid, _ = kafka.launch(settings, layout, install(layout, echo=None))
        kafka.wait_ready(settings, layout, pid)
        yield env, layout
    finally:
        kafka.stop(layout)


def leaders(settings: Settings) -> dict[int, int]:
    """Partition -> leader node id (-1 while it has none)."""
    admin = kafka.admin_client(settings.kafka.bootstrap_servers)
    topic = admin.list_topics(topic=settings.kafka.topic, timeout=5).topics[settings.kafka.topic]
    return {p.id: p.leader for p in topic.partitions.values()}


def kill_node(layout: StackLayout, node: int) -> None:
    """SIGKILL one Kafka node's process group and wait until it is gone."""
    pid = proc.read_pid(kafka.node_service(layout, node))
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: not proc.pid_alive(pid), timeout=10, message=f"node {node} gone")


def checkpoint(location: Path, topic: str) -> tuple[int, int]:
    """(how many batches are committed, the sum of the Kafka offsets the last one covers)."""
    return len(batch_ids(location)), committed_offsets_sum(location, topic)


def combined(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What the tables must hold after two simulator runs (distinct event ids, same devices)."""
    latest = dict(a["latest_by_device"])
    for device, newest in b["latest_by_device"].items():
        if device not in latest or (newest["event_time"], newest["seq"]) > (
            latest[device]["event_time"],
            latest[device]["seq"],
        ):
            latest[device] = newest
    kinds = Counter(a["malformed_by_kind"]) + Counter(b["malformed_by_kind"])
    return {
        "valid_distinct": a["valid_distinct"] + b["valid_distinct"],
        "malformed_total": a["malformed_total"] + b["malformed_total"],
        "malformed_by_kind": dict(kinds),
        "latest_by_device": latest,
        "sent_total": a["sent_total"] + b["sent_total"],
    }


def test_ingest_survives_losing_one_of_two_brokers(
    two_brokers: tuple[dict[str, str], StackLayout], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    env, layout = two_brokers
    settings = load_settings(env=env)
    kafka.ensure_topic(settings)  # two brokers listed: replication factor 2, min.insync.replicas 1

    admin = kafka.admin_client(settings.kafka.bootstrap_servers)
    topic = admin.list_topics(topic=settings.kafka.topic, timeout=5).topics[settings.kafka.topic]
    assert all(sorted(p.replicas) == [1, 2] for p in topic.partitions.values())
    resource = ConfigResource(ResourceType.TOPIC, settings.kafka.topic)
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["min.insync.replicas"].value == "1"
    assert 2 in leaders(settings).values(), "node 2 leads no partition: killing it would prove nothing"

    first = simulate(settings, tmp_path, *FAULTS, count=4_000, seed=7)
    location = Path(env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])
    job_env = {
        **env,
        "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": "3000",  # several batches, before and after the kill
        "IOTLAKE_INGEST__TRIGGER_INTERVAL": "1 second",
    }
    log_path = tmp_path / "ingest.log"
    with log_path.open("w") as log:
        job = subprocess.Popen(
            [sys.executable, "-m", "streaming.cli", "ingest"],
            env=job_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def job_log() -> str:
        return proc.tail(log_path, 60)

    try:

        def first_batch() -> bool:
            return job.poll() is not None or checkpoint(location, settings.kafka.topic)[0] >= 1

        wait_for(first_batch, timeout=240, interval=0.5, message="the job's first committed batch")
        assert job.poll() is None, f"the job exited {job.returncode}\n{job_log()}"
        batches_at_kill = checkpoint(location, settings.kafka.topic)[0]

        kill_node(layout, 2)  # the broker-only node, mid-stream; node 1 (and the quorum) stays

        # Keep producing while the cluster moves node 2's partitions to node 1.
        second = simulate(settings, tmp_path, *FAULTS, count=4_000, seed=8)
        assert set(leaders(settings).values()) == {1}
        expected = combined(first, second)

        def caught_up() -> bool:
            return job.poll() is not None or checkpoint(location, settings.kafka.topic)[1] == expected["sent_total"]

        wait_for(caught_up, timeout=300, interval=1.0, message="the job to commit every offset")
        assert job.poll() is None, f"the job exited {job.returncode} after the broker loss\n{job_log()}"
        assert checkpoint(location, settings.kafka.topic)[0] > batches_at_kill, "no batch committed after the kill"
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
            try:
                job.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(timeout=10)

    assert_tables_match(settings, stack_secrets, expected)


def test_an_offset_lookup_right_after_a_broker_dies_finds_the_new_leader(
    two_brokers: tuple[dict[str, str], StackLayout], spark: SparkSession
) -> None:
    """The Kafka source's driver asks an admin client for the partitions' offsets before every batch. Asked just
    after a leader died, Kafka's clients up to 4.3.0 kept sending the call to that broker id, and once the broker
    had left the cluster waited for it until `default.api.timeout.ms` (60 s): KAFKA-20673. The admin client here
    runs in the tests' Spark driver, from the same kafka-clients jar the job's Kafka source uses."""
    env, layout = two_brokers
    settings = load_settings(env=env)
    kafka.ensure_topic(settings)
    assert 2 in leaders(settings).values(), "node 2 leads no partition: killing it would prove nothing"

    jvm = spark.sparkContext._jvm
    admin_pkg = jvm.org.apache.kafka.clients.admin
    props = jvm.java.util.Properties()
    props.setProperty("bootstrap.servers", settings.kafka.bootstrap_servers)
    props.setProperty("default.api.timeout.ms", "60000")  # Kafka's default, which Spark's source keeps
    admin = admin_pkg.AdminClient.create(props)
    latest = jvm.java.util.HashMap()
    for partition in range(settings.kafka.partitions):
        latest.put(
            jvm.org.apache.kafka.common.TopicPartition(settings.kafka.topic, partition), admin_pkg.OffsetSpec.latest()
        )
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    try:
        assert admin.listOffsets(latest).all().get(30, seconds).size() == settings.kafka.partitions
        kill_node(layout, 2)
        began = time.monotonic()
        try:
            offsets = admin.listOffsets(latest).all().get(30, seconds)
        except Py4JJavaError as e:
            pytest.fail(f"no offsets {time.monotonic() - began:.0f} s after node 2 died: {e.java_exception}")
        assert offsets.size() == settings.kafka.partitions
        assert set(leaders(settings).values()) == {1}
    finally:
        admin.close(jvm.java.time.Duration.ofSeconds(5))
