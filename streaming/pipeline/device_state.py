"""device_state follows readings: each batch's newest reading per device is folded, and upserted once per interval.

A device_state MERGE is about 1.3 s of fixed Spark and Delta work however few rows it has (docs/benchmark-log.md).
So the job keeps each batch's newest reading per device (a few hundred rows, cached) and upserts their union at most
once per `ingest.device_state_interval`, under the transaction version of the newest batch folded in. The upsert's
order (event_time, seq, event_id) is total, so one upsert of several batches' rows gives what one upsert per batch
gives; an exact tie (the same event re-sent in a later batch) keeps the earlier batch's row, as per-batch upserts do.

Invariant: device_state at transaction version v holds every `readings` row of batches up to v. A crash loses only
folded rows, and those are in `readings` already: at start, `catch_up` upserts the rows of the batches after
device_state's version up to readings', from `readings` itself.

`iotlake delete-device` beside the stream purges readings, then device_state. Rows folded before the purge (or a
batch's upsert that lands after it) would bring the device back into device_state alone. So after each upsert
`PurgeRepair` looks for purge commits in device_state's log since it last looked, and sets each purged device's row
to what readings now holds: the newest of its readings sent after the purge, or none.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

from streaming.core.commit_tags import purged_device
from streaming.pipeline import batch
from streaming.pipeline.tables import LakeTables, MergeResult, Txn

log = logging.getLogger("iotlake.device_state")
FOLD = "#fold"  # which fold a row came from, oldest first: an exact tie keeps the earlier batch's row

Upsert = Callable[[DataFrame, Txn | None], MergeResult]


def newest_of_folds(folds: list[DataFrame]) -> DataFrame:
    """One row per device from several folds (each with FOLD): the newest by DEVICE_ORDER, then the oldest fold."""
    rows = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), folds)
    order = [*(F.col(c).desc() for c in batch.DEVICE_ORDER), F.col(FOLD).asc()]
    return batch.first_per_key(rows, ("device_id",), order).drop(FOLD)


class DeviceStateFolder:
    """Folds batches' newest readings per device and upserts them when `interval_s` has passed since the last upsert.

    With `interval_s` 0 every batch is upserted at once, as its own transaction. Not thread-safe: the caller
    serialises `add` and `flush` (BatchWriter holds its lock around both).
    """

    def __init__(
        self,
        upsert: Upsert,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        after_upsert: Callable[[], object] = lambda: None,
    ) -> None:
        self.upsert = upsert
        self.interval_s = interval_s
        self.clock = clock
        self.after_upsert = after_upsert
        self._folds: list[DataFrame] = []
        self._txn: Txn | None = None  # the newest folded batch's transaction id: the upsert's
        self._last = -math.inf  # when the last upsert ran: the first batch is upserted at once

    @property
    def pending(self) -> int:
        """Batches folded and not yet upserted."""
        return len(self._folds)

    def due(self) -> bool:
        """Folded rows wait and the interval has passed since the last upsert."""
        return bool(self._folds) and self._interval_passed()

    def _interval_passed(self) -> bool:
        return self.clock() - self._last >= self.interval_s

    def add(self, readings: DataFrame, txn: Txn | None) -> MergeResult | None:
        """Fold one batch's readings (cached by the caller), or upsert them with everything folded before if the
        interval has passed. The result, or None if only folded."""
        latest = batch.latest_per_device(readings)
        if self._interval_passed():  # this batch's rows need not be kept: upserted now, from the batch's cache
            source = latest if not self._folds else newest_of_folds([*self._folds, self._tagged(latest)])
            return self._upsert(source, txn)
        fold = self._tagged(latest).persist(StorageLevel.MEMORY_AND_DISK)
        fold.count()  # materialised now: the batch's cached rows are released when it ends
        self._folds.append(fold)
        self._txn = txn
        return None

    def flush(self) -> MergeResult | None:
        """Upsert everything folded, as the newest folded batch's transaction; None if nothing was folded."""
        return self._upsert(newest_of_folds(self._folds), self._txn) if self._folds else None

    def _tagged(self, latest: DataFrame) -> DataFrame:
        """A batch's newest rows per device, marked as the next fold."""
        return latest.withColumn(FOLD, F.lit(len(self._folds)))

    def _upsert(self, source: DataFrame, txn: Txn | None) -> MergeResult:
        result = self.upsert(source, txn)
        self._discard()
        self._last = self.clock()
        self.after_upsert()
        return result

    def _discard(self) -> None:
        """Forget the folded rows (they are in readings; `catch_up` brings them back after a restart)."""
        for fold in self._folds:
            fold.unpersist()
        self._folds = []
        self._txn = None


class PurgeRepair:
    """Sets the rows of devices purged from device_state since the last look to what readings holds of them."""

    def __init__(
        self,
        spark: SparkSession,
        tables: LakeTables,
        evolving: Callable[[], bool],
        retry: Callable[[Callable[[], MergeResult]], MergeResult],
    ) -> None:
        self.spark = spark
        self.tables = tables
        self.evolving = evolving
        self.retry = retry
        self._seen = tables.version(tables.device_state_uri)  # purges before the job started are not its concern

    def __call__(self) -> set[str]:
        """Look at device_state's new commits; repair the purged devices. Which devices were repaired."""
        commits = self.tables.commits_after(self.tables.device_state_uri, self._seen)
        if not commits:
            return set()
        devices = {d for _, metadata in commits if (d := purged_device(metadata)) is not None}
        if devices:
            readings = self.spark.read.format("delta").load(self.tables.readings_uri)
            truth = batch.latest_per_device(readings.where(F.col("device_id").isin(sorted(devices))))
            self.retry(lambda: self.tables.replace_device_states(truth, sorted(devices), self.evolving()))
            log.warning(
                "device_state: %s purged beside the stream; their rows now follow readings", ", ".join(sorted(devices))
            )
        self._seen = commits[-1][0]
        return devices


def catch_up(
    spark: SparkSession,
    tables: LakeTables,
    upsert: Upsert,
    app_id: str,
    readings_version: int | None,
    device_state_version: int | None,
) -> int | None:
    """Upsert device_state from the readings of the batches after its transaction version, up to readings'.

    The versions are this query's (streaming.pipeline.checkpoint.txn_versions). Returns the batch caught up to,
    or None when device_state was not behind.
    """
    if readings_version is None or (device_state_version is not None and device_state_version >= readings_version):
        return None
    batch_id = F.col("ingest_batch_id")
    window = batch_id <= readings_version
    if device_state_version is not None:
        window = window & (batch_id > device_state_version)
    rows = spark.read.format("delta").load(tables.readings_uri).where(window)
    began = time.monotonic()
    upsert(batch.latest_per_device(rows), Txn(app_id, readings_version))
    log.info(
        "device_state caught up with readings: batches %s to %d, %.1f s",
        "0" if device_state_version is None else device_state_version + 1,
        readings_version,
        time.monotonic() - began,
    )
    return readings_version
