"""Reading what the job wrote: Delta commit files from MinIO, the Change Data Feed, checkpoint file times."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bench.stats import Commit, parse_commit
from streaming.core.config import Settings
from streaming.core.preflight import minio_client
from streaming.core.storage import delta_rs_uri, delta_storage_options


def table_prefix(settings: Settings, table: str) -> str:
    s = settings.storage
    return f"{s.base_uri.removeprefix(f's3a://{s.bucket}/').rstrip('/')}/{table}"


def delta_commits(settings: Settings, table: str) -> list[Commit]:
    """Every JSON commit of a table on MinIO, by version (commitInfo timestamp, operation, metrics, txn)."""
    client = minio_client(settings)
    bucket = settings.storage.bucket
    commits = []
    for obj in client.list_objects(bucket, prefix=f"{table_prefix(settings, table)}/_delta_log/"):
        name = obj.object_name.rsplit("/", 1)[-1]
        stem = name.removesuffix(".json")
        if name.endswith(".json") and stem.isdigit():
            response = client.get_object(bucket, obj.object_name)
            try:
                commit = parse_commit(int(stem), response.read().decode())
                written = obj.last_modified
                if written is not None:
                    commit = replace(commit, written_ms=int(written.timestamp() * 1000))
                commits.append(commit)
            finally:
                response.close()
                response.release_conn()
    return sorted(commits, key=lambda c: c.version)


def by_batch(commits: list[Commit]) -> dict[int, Commit]:
    """Commits keyed by the batch id their Delta transaction id carries (txn version = batch_id)."""
    return {v: c for c in commits for v in c.txn_versions}


def readings_cdf(settings: Settings, starting_version: int = 1) -> pa.Table:
    """Inserted rows of readings from the Change Data Feed: kafka_timestamp, _commit_version, _commit_timestamp."""
    return table_cdf(settings, settings.tables.readings.name, starting_version)


def table_cdf(settings: Settings, table: str, starting_version: int) -> pa.Table:
    """Inserted rows of a table under storage.base_uri from its Change Data Feed: kafka_timestamp,
    _commit_version, _commit_timestamp."""
    from deltalake import DeltaTable

    uri = delta_rs_uri(settings.storage.table_uri(table))
    delta = DeltaTable(uri, storage_options=delta_storage_options(settings))
    reader: Any = delta.load_cdf(starting_version=starting_version)
    utc = pa.timestamp("us", tz="UTC")
    schema = pa.schema(
        [
            pa.field("_change_type", pa.string()),
            pa.field("kafka_timestamp", utc),
            pa.field("_commit_version", pa.int64()),
            pa.field("_commit_timestamp", utc),
        ]
    )
    data = pa.table(reader.read_all()).select(schema.names).cast(schema)  # plain types (no string_view)
    return data.filter(pc.equal(data["_change_type"], "insert")).drop_columns(["_change_type"])


@dataclass(frozen=True)
class TriggerTimes:
    """When Structured Streaming planned a batch (offsets/N written) and committed it (commits/N written)."""

    batch_id: int
    planned: float  # epoch seconds
    committed: float | None


def trigger_times(checkpoint: Path) -> list[TriggerTimes]:
    """Per batch, from the modification times of a local checkpoint's offsets/ and commits/ files."""
    out = []
    offsets = checkpoint / "offsets"
    for path in sorted(offsets.glob("[0-9]*"), key=lambda p: int(p.name)):
        done = checkpoint / "commits" / path.name
        out.append(TriggerTimes(int(path.name), path.stat().st_mtime, done.stat().st_mtime if done.exists() else None))
    return out
