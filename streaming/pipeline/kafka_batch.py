"""What a foreachBatch DataFrame of the Kafka source is about to read, from its plan, without running a Spark job.

Spark hands foreachBatch the batch as a LogicalRDD over the source's RDD, whose partitions carry the Kafka offset
ranges the batch planned. A batch's fixed cost is mostly per query and per task, so knowing its size before
reading it lets the job skip an empty batch and read a small one as one partition.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from py4j.protocol import Py4JError
from pyspark.sql import DataFrame

log = logging.getLogger("iotlake.ingest")

# A batch of at most this many messages is read as one partition: one task a stage instead of one per Kafka partition.
SMALL_BATCH_MESSAGES = 2_000
_MAX_DEPTH = 16  # RDDs between the LogicalRDD and the source's DataSourceRDD (three in Spark 4.2)


@dataclass(frozen=True)
class OffsetRange:
    """One Kafka partition's part of a batch: offsets start (inclusive) to end (exclusive)."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def planned_ranges(raw: DataFrame) -> list[OffsetRange] | None:
    """The offset ranges the batch will read (empty for an empty batch), or None where the plan isn't a Kafka batch
    that Spark handed to foreachBatch (a DataFrame built otherwise, another Spark version's internals)."""
    try:
        plan = raw._jdf.queryExecution().logical()
        if not plan.getClass().getName().endswith(".LogicalRDD"):
            return None
        rdd = plan.rdd()
        for _ in range(_MAX_DEPTH):
            if rdd.getClass().getName().endswith(".DataSourceRDD"):
                return _ranges(rdd)
            dependencies = rdd.dependencies()
            if dependencies.size() != 1:
                return None
            rdd = dependencies.head().rdd()
    except Py4JError as e:  # the plan's shape changed: the batch is read as it comes
        log.debug("the batch's Kafka offset ranges could not be read from its plan: %s", e)
    return None


def _ranges(rdd: Any) -> list[OffsetRange] | None:
    ranges = []
    for partition in rdd.partitions():
        source = partition.inputPartition()  # Option[InputPartition]: None for a partition with nothing to read
        if source.isEmpty():
            continue
        source = source.get()
        if not source.getClass().getName().endswith(".KafkaBatchInputPartition"):
            return None
        offsets = source.offsetRange()
        where = offsets.topicPartition()
        ranges.append(OffsetRange(where.topic(), where.partition(), offsets.fromOffset(), offsets.untilOffset()))
    return ranges


def planned_messages(raw: DataFrame) -> int | None:
    """How many offsets the batch covers (an upper bound on its messages: retention may have deleted some), or None."""
    ranges = planned_ranges(raw)
    return None if ranges is None else sum(r.size for r in ranges)


def one_partition_if_small(raw: DataFrame, messages: int | None) -> DataFrame:
    """A batch known to be small, as one partition; any other as it comes (one partition per Kafka partition)."""
    if messages is not None and messages <= SMALL_BATCH_MESSAGES:
        return raw.coalesce(1)
    return raw
