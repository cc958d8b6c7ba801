"""Start-up guards on the checkpoint: one job per checkpoint, and a checkpoint never older than the tables.

Each table write carries the transaction id (`<query id>-<table>`, batch id), and Delta skips a batch id it has
already committed. That makes a replay exactly-once only if the replay reads the same offsets. An older copy of
the checkpoint (or a second job on the same one) would plan the batches after its last one again, with new offset
ranges: Delta would skip them as committed and their messages would be lost without a word. So the job refuses
to start when a table holds a batch beyond the newest one the checkpoint has planned, and holds a lock on the
checkpoint while it runs: `flock` on a local checkpoint, a lease object written with conditional PUTs on s3a://.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streaming.core.catalog import lake_tables
from streaming.core.config import Settings
from streaming.core.errors import CheckpointError
from streaming.core.hadoop_fs import HadoopFiles
from streaming.core.storage import delta_rs_uri
from streaming.pipeline.tables import txn_app_id

log = logging.getLogger("iotlake.checkpoint")
LOCK_FILE = "iotlake.lock"
LEASE_FILE = "iotlake/lease"


@dataclass(frozen=True)
class CheckpointState:
    """What Spark's checkpoint says: the query id and the newest planned batch (offsets/)."""

    query_id: str | None
    planned: int | None


def newest_batch(names: list[str]) -> int | None:
    """The highest batch id among a checkpoint folder's file names (temporary and checksum files ignored)."""
    ids = [int(n) for n in names if n.isdigit()]
    return max(ids) if ids else None


def read_state(files: HadoopFiles) -> CheckpointState:
    metadata = files.read_text("metadata")
    query_id = None
    if metadata:
        try:
            query_id = str(json.loads(metadata.splitlines()[0])["id"])
        except (ValueError, KeyError, IndexError) as e:
            raise CheckpointError(
                f"The checkpoint's metadata file at {files.directory}/metadata is unreadable ({e}). Restore the "
                "checkpoint from a copy, or point ingest.checkpoint_location at a new folder."
            ) from e
    return CheckpointState(query_id, newest_batch(files.names("offsets")))


def tables_ahead(state: CheckpointState, versions: Mapping[str, int | None]) -> dict[str, int]:
    """The tables holding a batch of this query that the checkpoint has not planned.

    A batch the checkpoint planned (its offsets are written) replays with the same offsets, so a table may hold
    it already: that is the crash-after-commit case Delta's transaction ids are for. Anything beyond it would
    be planned again with new offsets.
    """
    return {
        table: version
        for table, version in versions.items()
        if version is not None and (state.planned is None or version > state.planned)
    }


def check_not_older(state: CheckpointState, versions: Mapping[str, int | None], location: str) -> None:
    """Refuse a checkpoint older than the tables it writes (see tables_ahead)."""
    ahead = tables_ahead(state, versions)
    if not ahead:
        return
    held = ", ".join(f"{table} holds batch {version}" for table, version in sorted(ahead.items()))
    newest = "no batch" if state.planned is None else f"batch {state.planned}"
    raise CheckpointError(
        f"The checkpoint at {location} is older than the tables: its newest batch is {newest}, but {held} of "
        f"the same query ({state.query_id}). Starting would plan the missing batches again with new Kafka "
        "offsets, and Delta would skip them as already committed: their messages would be lost. Ways out: "
        "restore the newest copy of the checkpoint; or make sure no other job runs on it; or start from a new "
        "checkpoint (move this one away): the query then gets a new id and reads from kafka.starting_offsets, "
        "readings deduplicate by (event_id, event_time) and device_state keeps the newest reading, but "
        "quarantine records the re-read bad messages again."
    )


def txn_versions(settings: Settings, storage_options: Mapping[str, str], query_id: str) -> dict[str, int | None]:
    """Each table's committed transaction version for this query, by table key (None: no table, or never
    written by it)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    versions: dict[str, int | None] = {}
    for table in lake_tables(settings):
        try:
            delta = DeltaTable(delta_rs_uri(table.uri), storage_options=dict(storage_options))
        except TableNotFoundError:
            versions[table.key] = None
            continue
        version = delta.transaction_version(txn_app_id(query_id, table.key))
        versions[table.key] = None if version is None else int(version)
    return versions


class CheckpointLock:
    """One job per checkpoint: `flock` on a local one (released by the kernel when the job dies), a lease on s3a.

    The lease is `<checkpoint>/iotlake/lease`: {owner, expires_ms}, created with If-None-Match and renewed every
    third of `ttl_s` with If-Match on its ETag, so two jobs can't both hold it. A job that dies leaves a lease that
    expires after `ttl_s`; a new job waits that long at most. A job whose renewal fails has lost the lease and
    stops before its next batch (`check`).
    """

    def __init__(self, files: HadoopFiles, ttl_s: float, clock: Callable[[], float] = time.time) -> None:
        self.files = files
        self.ttl_s = ttl_s
        self.clock = clock
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._fd: int | None = None
        self._etag: str | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def local_path(self) -> Path | None:
        directory = self.files.directory
        if directory.startswith("file:"):
            return Path(directory.removeprefix("file:")) / LOCK_FILE
        return None if "://" in directory else Path(directory) / LOCK_FILE

    def acquire(self) -> None:
        path = self.local_path
        if path is not None:
            self._flock(path)
            return
        if not self.files.supports_conditional_put():
            raise CheckpointError(
                f"The checkpoint at {self.files.directory} is on a file system without conditional writes, so "
                "the job can't lock it against a second job. Put the checkpoint on a local path or on s3a:// "
                "(S3 or MinIO, with fs.s3a.create.conditional.enabled=true)."
            )
        self._take_lease()
        self._renewer = threading.Thread(target=self._renew_until_stopped, name="checkpoint-lease", daemon=True)
        self._renewer.start()

    def _flock(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise CheckpointError(
                f"Another job is running on the checkpoint {path.parent} ({holder}). Two jobs on one checkpoint "
                "would plan the same batches with different offsets and lose messages. Stop the other job, or "
                "give this one its own ingest.checkpoint_location and storage.base_uri."
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        self._fd = fd

    def _lease_text(self) -> str:
        return json.dumps({"owner": self.owner, "expires_ms": round((self.clock() + self.ttl_s) * 1000)})

    def _take_lease(self) -> None:
        """Create the lease, or take over one that expired; wait up to ttl for a dead job's lease to expire."""
        deadline = self.clock() + self.ttl_s + 5
        while True:
            if self.files.conditional_put(LEASE_FILE, self._lease_text()):
                self._etag = self.files.etag(LEASE_FILE)
                return
            etag = self.files.etag(LEASE_FILE) if self.files.exists(LEASE_FILE) else None
            lease = _parse_lease(self.files.read_text(LEASE_FILE))
            expired = etag is not None and lease["expires_ms"] <= self.clock() * 1000
            if expired and self.files.conditional_put(LEASE_FILE, self._lease_text(), etag=etag):
                log.warning("took over the expired checkpoint lease of %s", lease["owner"])
                self._etag = self.files.etag(LEASE_FILE)
                return
            if self.clock() >= deadline:
                raise CheckpointError(
                    f"Another job holds the checkpoint {self.files.directory} (lease owner {lease['owner']}, "
                    f"renewed every {self.ttl_s / 3:.0f} s). Two jobs on one checkpoint would plan the same "
                    "batches with different offsets and lose messages. Stop the other job, or give this one its "
                    "own ingest.checkpoint_location and storage.base_uri."
                )
            log.info("checkpoint lease held by %s; waiting for it to expire", lease["owner"])
            time.sleep(min(2.0, self.ttl_s / 10))

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                renewed = self.files.conditional_put(LEASE_FILE, self._lease_text(), etag=self._etag)
            except Exception as e:  # a network error: try again at the next tick, the lease is still ours
                log.warning("could not renew the checkpoint lease (%s); retrying", e)
                continue
            if not renewed:
                self._lost = "another job took it over (this job's renewals were late or failed)"
                log.error("lost the checkpoint lease: %s", self._lost)
                return
            self._etag = self.files.etag(LEASE_FILE)

    def check(self) -> None:
        """Raise when the lease was lost: the job must stop before it writes another batch."""
        if self._lost:
            raise CheckpointError(
                f"This job lost its lease on the checkpoint {self.files.directory}: {self._lost}. It stops before "
                "writing another batch. Restart it once the other job is stopped."
            )

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closes the flock
            self._fd = None
        if self._renewer is not None:
            self._stop.set()
            self._renewer.join(timeout=30)
            self._renewer = None
            if not self._lost and _parse_lease(self.files.read_text(LEASE_FILE))["owner"] == self.owner:
                self.files.delete(LEASE_FILE)


def _parse_lease(text: str | None) -> dict[str, Any]:
    """The lease's fields; an unreadable or vanished lease reads as expired (its writer died mid-write)."""
    try:
        data = json.loads(text or "")
        return {"owner": str(data["owner"]), "expires_ms": int(data["expires_ms"])}
    except (ValueError, KeyError, TypeError):
        return {"owner": "unknown", "expires_ms": 0}
