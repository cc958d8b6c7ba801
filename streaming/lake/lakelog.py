"""Read what table health needs from a Delta table without a JVM: snapshot files and commits (delta-rs),
and the objects stored under the table (MinIO listing or the local file system)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from streaming.core.config import Settings
from streaming.core.preflight import minio_client
from streaming.core.storage import delta_rs_uri, delta_storage_options
from streaming.lake.health import UNPARTITIONED, Commit, DataFile, StoredObject


@dataclass(frozen=True)
class TableLog:
    """One read of a table: its version, live files, recent commits, and what VACUUM would delete now."""

    version: int
    files: tuple[DataFile, ...]
    commits: tuple[Commit, ...]
    vacuumable: tuple[str, ...]


def open_table(settings: Settings, uri: str) -> Any | None:
    """The delta-rs table at uri, or None when no table exists there yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(delta_rs_uri(uri), storage_options=delta_storage_options(settings))
    except TableNotFoundError:
        return None


def read_table(
    settings: Settings, uri: str, history: int, retention_s: float, since_version: int | None = None
) -> TableLog | None:
    """Snapshot files and the newest commits of the table at uri: at most `history` of them, and only those
    after `since_version` when given (one JSON file read per commit); and the paths a VACUUM with this
    retention would delete (delta-rs dry run, untracked files included). None: the table isn't created yet."""
    table = open_table(settings, uri)
    if table is None:
        return None
    version = table.version()
    if since_version is not None:
        history = min(history, max(version - since_version, 0))
    columns = tuple(table.metadata().partition_columns)
    vacuumable = table.vacuum(
        retention_hours=int(retention_s // 3600), dry_run=True, enforce_retention_duration=False, full=True
    )
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    files = tuple(
        DataFile(
            path=path,
            partition="/".join(f"{c}={actions[f'partition.{c}'][i]}" for c in columns) if columns else UNPARTITIONED,
            size=int(actions["size_bytes"][i] or 0),
            rows=None if actions.get("num_records") is None else int(actions["num_records"][i] or 0),
            modified_ms=int(actions["modification_time"][i] or 0),
        )
        for i, path in enumerate(actions.get("path", []))
    )
    commits = _commits(table, history) if history else ()
    return TableLog(version=version, files=files, commits=commits, vacuumable=tuple(vacuumable))


def commits_since(settings: Settings, uri: str, version: int | None) -> tuple[Commit, ...]:
    """The commits of the table at uri after `version` (every one when None), newest first, one JSON file read
    each; none before the table exists."""
    table = open_table(settings, uri)
    if table is None:
        return ()
    newer = table.version() - (-1 if version is None else version)
    return _commits(table, newer) if newer > 0 else ()


def _commits(table: Any, limit: int) -> tuple[Commit, ...]:
    return tuple(_commit(entry) for entry in table.history(limit) if "version" in entry)


def _commit(entry: dict[str, Any]) -> Commit:
    metrics = {}
    for key, value in (entry.get("operationMetrics") or {}).items():
        try:
            metrics[key] = int(value)
        except (TypeError, ValueError):
            continue
    return Commit(int(entry["version"]), int(entry.get("timestamp") or 0), str(entry.get("operation") or ""), metrics)


def list_objects(settings: Settings, uri: str) -> Iterator[StoredObject]:
    """Every object under the table root, path relative to it (S3 listing or a local walk)."""
    if uri.startswith(("s3a://", "s3://")):
        bucket, _, prefix = uri.split("://", 1)[1].partition("/")
        prefix = prefix.rstrip("/") + "/"
        for o in minio_client(settings).list_objects(bucket, prefix=prefix, recursive=True):
            stamp = o.last_modified.timestamp() if o.last_modified else 0.0
            yield StoredObject(o.object_name[len(prefix) :], int(o.size or 0), int(stamp * 1000))
        return
    root = Path(uri.removeprefix("file://").removeprefix("file:"))
    for folder, _, names in os.walk(root):
        for name in names:
            full = Path(folder) / name
            stat = full.stat()
            yield StoredObject(full.relative_to(root).as_posix(), stat.st_size, int(stat.st_mtime * 1000))
