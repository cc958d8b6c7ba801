"""The small-batch rule: a batch known to hold few messages is read as one partition, any other as it comes."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from streaming.pipeline.kafka_batch import SMALL_BATCH_MESSAGES, OffsetRange, one_partition_if_small, planned_ranges

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("messages", "partitions"),
    [(1, 1), (SMALL_BATCH_MESSAGES, 1), (SMALL_BATCH_MESSAGES + 1, 6), (None, 6)],
)
def test_only_a_batch_known_to_be_small_becomes_one_partition(
    spark: SparkSession, messages: int | None, partitions: int
) -> None:
    six = spark.range(60).repartition(6)
    assert one_partition_if_small(six, messages).rdd.getNumPartitions() == partitions


def test_a_dataframe_not_handed_over_by_a_kafka_stream_has_no_planned_ranges(spark: SparkSession) -> None:
    assert planned_ranges(spark.range(10)) is None


def test_an_offset_range_counts_its_end_exclusive() -> None:
    assert OffsetRange("t", 0, 10, 13).size == 3
