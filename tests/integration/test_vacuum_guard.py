"""The VACUUM guard against the real sources it reads: the stream's checkpoint and Kafka's end offsets.

The checkpoint is written by hand in Spark's format (offsets/<batch>, commits/<batch>) so its age can be set:
an idle stream that committed everything 30 days ago must not block VACUUM; a stream that has been behind
for that long must.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from streaming.core.config import Settings
from streaming.core.errors import VacuumRefusedError
from streaming.lake.maintenance import check_vacuum, table_retention_s
from streaming.lake.status import latest_offsets

pytestmark = pytest.mark.integration

DAY_S = 86400.0


def _produce(settings: Settings, per_partition: int) -> dict[int, int]:
    """per_partition messages into every partition; the topic's end offsets after."""
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "enable.idempotence": True})
    for partition in range(settings.kafka.partitions):
        for i in range(per_partition):
            producer.produce(settings.kafka.topic, value=f'{{"n": {i}}}'.encode(), partition=partition)
    assert producer.flush(30) == 0
    return latest_offsets(settings)


def _checkpoint(settings: Settings, offsets: dict[int, int], age_s: float) -> None:
    """Batch 0 committed `age_s` seconds ago with these end offsets (Spark's offsets/commits file layout)."""
    root = Path(settings.ingest.checkpoint_location)
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "commits").mkdir(parents=True, exist_ok=True)
    source = {settings.kafka.topic: {str(p): o for p, o in offsets.items()}}
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": {}}
    (root / "offsets" / "0").write_text(f"v1\n{json.dumps(metadata)}\n{json.dumps(source)}\n")
    commit = root / "commits" / "0"
    commit.write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    stamp = time.time() - age_s
    os.utime(commit, (stamp, stamp))


def test_an_idle_stream_does_not_block_vacuum(settings: Settings) -> None:
    ends = _produce(settings, 5)
    _checkpoint(settings, ends, age_s=30 * DAY_S)  # everything committed, nothing new for 30 days
    assert check_vacuum(settings, "readings", None) == table_retention_s(settings)


def test_a_stream_behind_for_longer_than_the_retention_blocks_vacuum(settings: Settings) -> None:
    ends = _produce(settings, 5)
    _checkpoint(settings, {p: max(o - 2, 0) for p, o in ends.items()}, age_s=30 * DAY_S)
    with pytest.raises(VacuumRefusedError, match=r"12 messages behind the topic's end .* for 30 days"):
        check_vacuum(settings, "readings", None)
    # The same backlog, but the stream committed a minute ago: it is working through it.
    _checkpoint(settings, {p: max(o - 2, 0) for p, o in ends.items()}, age_s=60)
    assert check_vacuum(settings, "readings", None) == table_retention_s(settings)
