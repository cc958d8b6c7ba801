"""A batch's size, read from its plan before any Spark job: an empty batch runs none, a small one is one partition."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from streaming.core.config import Settings
from streaming.pipeline.ingest import BatchWriter, kafka_stream, start_query
from streaming.pipeline.kafka_batch import planned_messages, planned_ranges
from streaming.pipeline.metrics import IngestMetrics
from streaming.pipeline.tables import LakeTables
from tests.integration.lake import read_table

pytestmark = pytest.mark.integration


def produce(settings: Settings, per_partition: dict[int, int]) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    for partition, count in per_partition.items():
        for i in range(count):
            producer.produce(settings.kafka.topic, f'{{"n": {i}}}'.encode(), partition=partition)
    assert producer.flush(30) == 0


def test_the_planned_messages_are_what_each_batch_reads_including_an_empty_first_batch(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    seen: list[tuple[int, int | None, int, int]] = []

    def body(raw: DataFrame, batch_id: int) -> None:
        ranges = planned_ranges(raw)
        partitions = -1 if ranges is None else len(ranges)
        seen.append((batch_id, planned_messages(raw), raw.count(), partitions))

    def run_available() -> None:  # one available-now run per step: the batches don't depend on the producer's timing
        query = (
            kafka_stream(spark, settings)
            .writeStream.foreachBatch(body)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert not query.isActive, "the available-now query did not finish within 300 s"

    run_available()  # batch 0: the topic is empty
    produce(settings, {0: 3, 2: 1, 5: 4})
    run_available()
    produce(settings, {1: 250, 3: 7})
    run_available()
    assert seen[0] == (0, 0, 0, 0), seen
    assert [(planned, read) for _, planned, read, _ in seen[1:]] == [(8, 8), (257, 257)], seen
    assert [partitions for *_, partitions in seen[1:]] == [3, 2], seen


def test_an_empty_batch_runs_no_spark_job_and_writes_nothing(
    spark: SparkSession, settings: Settings, stack_secrets: dict[str, str]
) -> None:
    tables = LakeTables(spark, settings)
    tables.ensure()
    writer = BatchWriter(spark, settings, tables, IngestMetrics())
    query = start_query(spark, settings, writer, available_now=True)  # the topic is empty: one batch, 0 messages
    query.awaitTermination(300)
    assert not query.isActive, "the available-now query did not finish within 300 s"
    assert query.exception() is None
    assert [(r.batch_id, r.input_rows) for r in writer.reports] == [(0, 0)]
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(str(query.runId))
    assert jobs == [], f"the empty batch ran Spark jobs {jobs}"
    for name in ("readings", "quarantine", "device_state"):
        assert read_table(settings, name, stack_secrets) == []

    # The control: the same query's next batch, 3 messages (one malformed), runs jobs in the query's group.
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    for partition, value in ((0, b'{"n": 0}'), (4, b'{"n": 1}'), (2, b"{broken")):
        producer.produce(settings.kafka.topic, value, partition=partition)
    assert producer.flush(30) == 0
    next_run = start_query(spark, settings, writer, available_now=True)
    next_run.awaitTermination(300)
    assert next_run.exception() is None
    assert [(r.batch_id, r.input_rows) for r in writer.reports] == [(0, 0), (1, 3)]
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(str(next_run.runId))
    assert len(read_table(settings, "quarantine", stack_secrets)) == 3
