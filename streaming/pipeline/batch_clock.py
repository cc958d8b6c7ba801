"""Each micro-batch's clock, recorded in the checkpoint when the batch first runs and read back on replay.

The time rules (event_time_in_future, event_time_too_old) and the ingest_time columns depend on "now". A batch
that crashed after some of its commits is replayed, maybe hours later: with the wall clock, the replay could
decide differently from the first attempt (quarantine an event already in readings, skip device_state). With
the recorded clock, a batch's decisions are a pure function of its input.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

from streaming.core.hadoop_fs import HadoopFiles

CLOCK_DIR = "iotlake/clock"
RETAINED = 200  # Spark keeps 100 batches of offsets; a replay never goes back further than that
PRUNE_EVERY = 50  # batches between two clean-ups of records older than RETAINED


class BatchClocks:
    """`<checkpoint>/iotlake/clock/<batch id>` holds the batch's clock in epoch milliseconds (local or s3a://)."""

    def __init__(self, files: HadoopFiles, now: Callable[[], datetime]) -> None:
        self._files = files
        self._now = now
        self._last: int | None = None  # the newest batch this process recorded: a newer one can't have a record

    def recorded(self, batch_id: int) -> datetime | None:
        """The clock the batch ran with before, or None (never ran, or killed while recording it)."""
        text = self._files.read_text(f"{CLOCK_DIR}/{batch_id}")
        try:
            return datetime.fromtimestamp(int(json.loads(text or "")["now_ms"]) / 1000, UTC)
        except (ValueError, KeyError, TypeError):
            return None

    def for_batch(self, batch_id: int) -> datetime:
        """The recorded clock of a replayed batch; for a new batch, now, recorded before anything is decided."""
        if self._last is None or batch_id <= self._last:  # the first batch after a start may be a replay
            recorded = self.recorded(batch_id)
            if recorded is not None:
                self._last = batch_id
                return recorded
        now = self._now()
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)  # what the record can hold
        # Overwrites only a record cut short by a kill.
        self._files.write_text(f"{CLOCK_DIR}/{batch_id}", json.dumps({"now_ms": round(now.timestamp() * 1000)}))
        if batch_id % PRUNE_EVERY == 0:
            for name in self._files.names(CLOCK_DIR):
                if name.isdigit() and int(name) <= batch_id - RETAINED:
                    self._files.delete(f"{CLOCK_DIR}/{name}")
        self._last = batch_id
        return now
