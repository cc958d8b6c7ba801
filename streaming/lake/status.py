"""What `iotlake status` reads: the tables (through delta-rs, no JVM), the checkpoint and Kafka's offsets."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from streaming.core.catalog import lake_tables
from streaming.core.config import Settings
from streaming.core.errors import ServiceUnreachableError
from streaming.core.preflight import (
    CHECK_TIMEOUT_S,
    SKIPPED,
    UnmappableKafkaOptions,
    kafka_client,
    kafka_failure,
    kafka_metadata,
    minio_client,
)
from streaming.core.storage import delta_rs_uri, delta_storage_options
from streaming.lake.health import StreamProgress


@dataclass(frozen=True)
class TableStatus:
    name: str
    uri: str
    exists: bool
    version: int | None = None
    rows: int | None = None
    files: int | None = None
    bytes: int | None = None
    last_commit: str | None = None
    last_operation: str | None = None


@dataclass(frozen=True)
class StreamStatus:
    checkpoint: str
    last_batch_id: int | None
    committed_offsets: dict[int, int] = field(default_factory=dict)
    latest_offsets: dict[int, int] = field(default_factory=dict)
    lag: dict[int, int] = field(default_factory=dict)
    kafka_note: str | None = None  # why Kafka's offsets are unknown (then lag is empty, not zero)

    @property
    def total_lag(self) -> int:
        return sum(self.lag.values())


def table_status(settings: Settings, name: str) -> TableStatus:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    uri = settings.storage.table_uri(name)
    try:
        table = DeltaTable(delta_rs_uri(uri), storage_options=delta_storage_options(settings))
    except TableNotFoundError:
        return TableStatus(name, uri, exists=False)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    last = table.history(1)[0]
    stamp = last.get("timestamp")
    return TableStatus(
        name=name,
        uri=uri,
        exists=True,
        version=table.version(),
        rows=sum(int(n or 0) for n in actions.get("num_records", [])),
        files=len(actions.get("path", [])),
        bytes=sum(int(n or 0) for n in actions.get("size_bytes", [])),
        last_commit=datetime.fromtimestamp(stamp / 1000, UTC).isoformat() if stamp else None,
        last_operation=last.get("operation"),
    )


def _checkpoint_files(settings: Settings, location: str) -> tuple[list[int], dict[int, str]]:
    """Committed batch ids and the offsets file text of each batch, from a local or s3a:// checkpoint."""
    texts: dict[int, str] = {}
    if location.startswith("s3a://"):
        bucket, _, prefix = location.removeprefix("s3a://").partition("/")
        client = minio_client(settings)
        commits = [
            int(o.object_name.rsplit("/", 1)[-1])
            for o in client.list_objects(bucket, prefix=f"{prefix.rstrip('/')}/commits/")
            if o.object_name.rsplit("/", 1)[-1].isdigit()
        ]
        if commits:
            last = max(commits)
            response = client.get_object(bucket, f"{prefix.rstrip('/')}/offsets/{last}")
            texts[last] = response.read().decode()
        return commits, texts
    root = Path(location.removeprefix("file://"))
    commits = [int(p.name) for p in (root / "commits").glob("*") if p.name.isdigit()]
    if commits:
        texts[max(commits)] = (root / "offsets" / str(max(commits))).read_text()
    return commits, texts


def stream_lag_s(settings: Settings, now: float | None = None) -> float | None:
    """Seconds since the stream committed its last batch (None: no checkpoint yet)."""
    location = settings.ingest.checkpoint_uri
    stamps: list[float] = []
    if location.startswith("s3a://"):
        bucket, _, prefix = location.removeprefix("s3a://").partition("/")
        commits = minio_client(settings).list_objects(bucket, prefix=f"{prefix.rstrip('/')}/commits/")
        stamps = [
            o.last_modified.timestamp()
            for o in commits
            if o.last_modified is not None and o.object_name.rsplit("/", 1)[-1].isdigit()
        ]
    else:
        folder = Path(location.removeprefix("file://").removeprefix("file:")) / "commits"
        stamps = [p.stat().st_mtime for p in folder.glob("*") if p.name.isdigit()] if folder.is_dir() else []
    if not stamps:
        return None
    return max((time.time() if now is None else now) - max(stamps), 0.0)


def stream_progress(settings: Settings, now: float | None = None) -> StreamProgress | None:
    """How far the stream is behind the topic's end, and since when it has not committed (None: it never
    committed). Reads its checkpoint and Kafka's end offsets (ServiceUnreachableError if Kafka is down)."""
    since = stream_lag_s(settings, now)
    if since is None:
        return None
    stream = stream_status(settings)
    if stream.kafka_note:  # the topic's end can't be read from here: don't guess the stream is caught up
        raise ServiceUnreachableError(stream.kafka_note)
    return StreamProgress(behind=stream.total_lag, since_commit_s=since)


def committed_offsets(offsets_text: str, topic: str) -> dict[int, int]:
    """Kafka offsets of one checkpoint offsets file (line 1 version, line 2 metadata, then one per source)."""
    out: dict[int, int] = {}
    for line in offsets_text.splitlines()[2:]:
        try:
            source = json.loads(line)
        except ValueError:
            continue
        if isinstance(source, dict):
            for partition, offset in (source.get(topic) or {}).items():
                out[int(partition)] = int(offset)
    return out


def latest_offsets(settings: Settings) -> dict[int, int]:
    """The high watermark of every partition of the topic (UnmappableKafkaOptions: librdkafka can't connect)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    extra = {"group.id": "iotlake-status", "enable.auto.commit": False}
    consumer, errors = kafka_client(settings, Consumer, extra)
    try:
        metadata = kafka_metadata(settings, consumer, errors, settings.kafka.topic)
        topic = metadata.topics.get(settings.kafka.topic)
        partitions = sorted(topic.partitions) if topic is not None and topic.error is None else []
        return {
            p: consumer.get_watermark_offsets(TopicPartition(settings.kafka.topic, p), timeout=CHECK_TIMEOUT_S)[1]
            for p in partitions
        }
    except KafkaException as e:
        raise kafka_failure(settings, [*errors, e.args[0]], e.args[0].str()) from e
    finally:
        consumer.close()


def stream_status(settings: Settings) -> StreamStatus:
    location = settings.ingest.checkpoint_uri
    commits, texts = _checkpoint_files(settings, location)
    last = max(commits) if commits else None
    committed = committed_offsets(texts[last], settings.kafka.topic) if last is not None else {}
    try:
        latest = latest_offsets(settings)
    except UnmappableKafkaOptions as e:
        return StreamStatus(location, last, committed, kafka_note=SKIPPED.format(reasons=e))
    lag = {p: max(high - committed.get(p, 0), 0) for p, high in latest.items()}
    return StreamStatus(location, last, committed, latest, lag)


def status(settings: Settings) -> dict[str, Any]:
    tables = [table_status(settings, table.name) for table in lake_tables(settings)]
    stream = stream_status(settings)
    return {
        "tables": [asdict(x) for x in tables],
        "stream": {**asdict(stream), "total_lag": None if stream.kafka_note else stream.total_lag},
    }
