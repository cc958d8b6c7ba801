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
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

CLOCK_DIR = "iotlake/clock"
RETAINED = 200  # Spark keeps 100 batches of offsets; a replay never goes back further than that


class BatchClocks:
    """`<checkpoint>/iotlake/clock/<batch id>` holds the batch's clock in epoch milliseconds (local or s3a://)."""

    def __init__(self, spark: SparkSession, checkpoint: str, now: Callable[[], datetime]) -> None:
        jvm: Any = spark._jvm
        jsc: Any = spark._jsc
        self._jvm = jvm
        self._dir = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/{CLOCK_DIR}")
        self._fs = self._dir.getFileSystem(jsc.hadoopConfiguration())
        self._now = now

    def _path(self, batch_id: int) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._dir, str(batch_id))

    def recorded(self, batch_id: int) -> datetime | None:
        """The clock the batch ran with before, or None (never ran, or killed while recording it)."""
        path = self._path(batch_id)
        if not self._fs.exists(path):
            return None
        try:
            stream = self._fs.open(path)
            try:
                text = self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
            finally:
                stream.close()
        except Py4JJavaError as e:
            if "ChecksumException" in str(e.java_exception):  # a local record cut short by a kill
                return None
            raise
        try:
            return datetime.fromtimestamp(int(json.loads(text)["now_ms"]) / 1000, UTC)
        except (ValueError, KeyError, TypeError):
            return None

    def for_batch(self, batch_id: int) -> datetime:
        """The recorded clock of a replayed batch; for a new batch, now, recorded before anything is decided."""
        recorded = self.recorded(batch_id)
        if recorded is not None:
            return recorded
        now = self._now()
        now = now.replace(microsecond=now.microsecond // 1000 * 1000)  # what the record can hold
        out = self._fs.create(self._path(batch_id), True)  # overwrites only a record cut short by a kill
        try:
            out.write(json.dumps({"now_ms": round(now.timestamp() * 1000)}).encode())
        finally:
            out.close()
        self._fs.delete(self._path(batch_id - RETAINED), False)
        return now
