"""Wires the Kafka source, foreachBatch and the tables: the streaming job behind `iotlake ingest`."""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from pyspark import InheritableThread
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)
from pyspark.storagelevel import StorageLevel

from streaming.core.config import Settings
from streaming.core.errors import CheckpointError, CredentialsError, IotLakeError, ValidationFailure
from streaming.core.hadoop_fs import HadoopFiles
from streaming.core.logstore import check_writers_safe
from streaming.core.preflight import check_kafka, check_storage
from streaming.core.session import build_session
from streaming.core.storage import delta_storage_options
from streaming.pipeline import batch, kafka_batch
from streaming.pipeline.batch_clock import BatchClocks
from streaming.pipeline.checkpoint import CheckpointLock, check_not_older, read_state, txn_versions
from streaming.pipeline.device_state import DeviceStateFolder, PurgeRepair, catch_up
from streaming.pipeline.faults import Faults
from streaming.pipeline.metrics import IngestMetrics
from streaming.pipeline.rules import Rules
from streaming.pipeline.tables import LakeTables, MergeResult, Txn, retry_on_conflict, txn_app_id
from streaming.pipeline.warmup import QUERY_ID_PROPERTY, wants_warm_up, warm_up

log = logging.getLogger("iotlake.ingest")
T = TypeVar("T")
QUERY_NAME = "iotlake_ingest"
# A continuous stream with data to read starts its next batch within a trigger interval of the last one's end, plus
# the offset lookup and the offset log's write: no batch for this much longer, and the stream is idle.
IDLE_MARGIN_S = 2.0
IDENTITY_FILE = "iotlake.json"  # in the checkpoint: the topic and base_uri it belongs to


@dataclass(frozen=True)
class BatchReport:
    """What one micro-batch did, for logs, metrics and tests."""

    batch_id: int
    input_rows: int
    by_action: dict[str, int]
    quarantined_by_rule: dict[str, int]
    inserted: int
    device_updates: int
    seconds: float
    steps: dict[str, float]  # wall seconds of validate (incl. Kafka read and stats), each write


class BatchWriter:
    """The foreachBatch body: validate, split, then MERGE/append each table under its transaction id."""

    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        tables: LakeTables,
        metrics: IngestMetrics,
        faults: Faults | None = None,
        check_lock: Callable[[], None] = lambda: None,
        label: str = "batch",  # how its log lines name a batch
    ) -> None:
        self.spark = spark
        self.label = label
        self.check_lock = check_lock
        self.settings = settings
        self.tables = tables
        self.metrics = metrics
        self.faults = faults or Faults()
        self.clocks = BatchClocks(HadoopFiles(spark, settings.ingest.checkpoint_uri), self.faults.now)
        self.validator = batch.Validator.of(Rules.from_settings(settings, tables.evolved_columns()))
        self.reports: list[BatchReport] = []
        self.newest_event = 0.0
        repair = PurgeRepair(spark, tables, lambda: self._evolving, lambda write: self._retry(write, "device_state"))
        self.device_state = DeviceStateFolder(
            self.upsert_device_state, settings.ingest.device_state_interval_s, after_upsert=repair
        )
        self._busy = threading.Lock()  # a batch, or a device_state upsert between batches: one at a time
        self._idle_after_s = settings.ingest.trigger_interval_s + IDLE_MARGIN_S
        self._batch_ended = time.monotonic()  # a query about to start is not idle yet

    def __call__(self, raw: DataFrame, batch_id: int) -> None:
        with self._busy:
            try:
                self._run_batch(raw, batch_id)
            finally:
                self._batch_ended = time.monotonic()

    def flush_device_state(self, *, wait: bool) -> None:
        """Upsert the folded device states: now (`wait`, at the end), or if due and the stream has gone idle.

        Idle: no batch for a trigger interval and IDLE_MARGIN_S. A stream with data to read upserts them in its next
        batch, after that batch's readings commit; an upsert between two of its batches would hold the next one back
        by a whole MERGE. A failure is logged, not raised: the folded rows are kept for the next try, and they are
        in readings, from which the next start brings device_state up to date (streaming.pipeline.device_state).
        """
        if not self._busy.acquire(blocking=wait):
            return
        try:
            idle = time.monotonic() - self._batch_ended >= self._idle_after_s
            if wait or (idle and self.device_state.due()):
                self.device_state.flush()
        except Exception as e:  # see the docstring
            log.warning(
                "device_state upsert failed (%d batches folded, their rows are in readings; the next try, or the "
                "next start, upserts them): %s",
                self.device_state.pending,
                str(e).splitlines()[0][:500],
            )
        finally:
            self._busy.release()

    def _run_batch(self, raw: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        self.check_lock()  # a job that lost its checkpoint lease writes nothing more
        query_id = self._query_id()
        planned = kafka_batch.planned_messages(raw)
        if planned == 0:  # no job, clock or commit: its replay is as empty
            self._record(BatchReport(batch_id, 0, {}, {}, 0, 0, time.monotonic() - started, {}))
            self.faults.crash_if("after_batch", batch_id)
            return
        raw = kafka_batch.one_partition_if_small(raw, planned)
        info = batch.BatchInfo(batch_id, self.clocks.for_batch(batch_id))
        steps: dict[str, float] = {}
        validated = self.validator(raw, info).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            new_fields = batch.new_field_names(validated) if self.rules.allow_new_fields else []
            if new_fields:
                validated = self._evolve(raw, validated, new_fields, info)
            stats = batch.summarize(batch.batch_stats(validated).collect(), self.rules)
            steps["validate"] = time.monotonic() - started
            if stats.failed:
                reason, rows = next(iter(stats.failed.items()))
                raise ValidationFailure(
                    f"Validation rule {reason!r} has action 'fail' and matched {rows} message(s) in batch "
                    f"{batch_id}; the stream stops before writing it. Fix the producer, or change "
                    f"validation.actions.{reason.split(':')[0]} to quarantine, drop or warn."
                )
            report = self._write(validated, stats, info, query_id, started, steps)
        finally:
            validated.unpersist()
        self._record(report)
        self.faults.crash_if("after_batch", batch_id)

    @property
    def rules(self) -> Rules:
        return self.validator.rules

    def _query_id(self) -> str:
        """The transaction ids' base: stable across restarts from one checkpoint, new when it is deleted."""
        query_id = self.spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query_id:
            # A constant instead would make a reset checkpoint's batches 0, 1, ... look already committed.
            raise CheckpointError(
                "The streaming query id is missing from the batch's context, so its writes can't be made "
                "exactly-once. Run the batch writer inside a streaming query (foreachBatch)."
            )
        return str(query_id)

    def _evolve(self, raw: DataFrame, validated: DataFrame, names: list[str], info: batch.BatchInfo) -> DataFrame:
        """Add new optional fields as columns (inferred types), or mark the ones that can't evolve."""
        columns, refused = batch.infer_new_columns(validated, names)
        rules = replace(
            self.rules,
            extra_columns=(*self.rules.extra_columns, *columns),
            refused_fields=tuple(sorted({*self.rules.refused_fields, *refused})),
        )
        self.validator = batch.Validator.of(rules)
        log.warning("schema evolution: adding %s; not evolvable: %s", [c.name for c in columns], refused)
        validated.unpersist()
        return self.validator(raw, info).persist(StorageLevel.MEMORY_AND_DISK)

    def _write(
        self,
        validated: DataFrame,
        stats: batch.BatchStats,
        info: batch.BatchInfo,
        query_id: str,
        started: float,
        steps: dict[str, float],
    ) -> BatchReport:
        """The readings MERGE first, alone: its commit is what makes a reading queryable. Then the device_state
        MERGE, with the quarantine append beside it in a second thread.

        The append carries its transaction id as writer options, the MERGEs as session settings, so the
        two don't interfere; either failing fails the batch, which then replays.
        """

        def txn(table: str) -> Txn | None:
            return None if self.faults.no_txn_ids else Txn(txn_app_id(query_id, table), info.batch_id)

        quarantine_error: list[BaseException] = []

        def append_quarantine() -> None:
            began = time.monotonic()
            try:
                rows = batch.quarantine(validated)
                self._retry(lambda: self.tables.append_quarantine(rows, txn("quarantine")), "quarantine")
            except BaseException as e:  # re-raised in the batch's thread below
                quarantine_error.append(e)
            steps["quarantine_append"] = time.monotonic() - began

        side = InheritableThread(target=append_quarantine, name=f"quarantine-{info.batch_id}")
        inserted = device_updates = 0
        readings = batch.readings(validated, self.rules).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            merged = self._merge_readings(readings, stats, txn, steps) if stats.kept else None
            self.faults.crash_if("after_readings", info.batch_id)
            if stats.by_action.get("quarantine"):
                side.start()
            if merged is not None:
                inserted = merged.inserted
                device_updates = self._merge_device_state(readings, txn, steps)
        finally:
            readings.unpersist()
            if side.is_alive():
                side.join()
        if quarantine_error:
            raise quarantine_error[0]
        return BatchReport(
            info.batch_id,
            stats.messages,
            stats.by_action,
            stats.quarantined_by_rule,
            inserted,
            device_updates,
            time.monotonic() - started,
            steps,
        )

    def _merge_readings(
        self, rows: DataFrame, stats: batch.BatchStats, txn: Callable[[str], Txn | None], steps: dict[str, float]
    ) -> MergeResult:
        ranges = batch.time_ranges(stats.buckets)
        began = time.monotonic()
        merged = self._retry(
            lambda: self.tables.merge_readings(
                rows, stats.dates, ranges, txn("readings"), self._evolving, stats.id_range
            ),
            "readings",
        )
        steps["readings_merge"] = time.monotonic() - began
        m = self.metrics
        m.merged.labels("readings", "inserted").inc(merged.inserted)
        m.duplicates.inc(max(stats.kept - merged.inserted, 0) if not merged.skipped else 0)
        if stats.newest_event_ms is not None:
            self.newest_event = max(self.newest_event, stats.newest_event_ms / 1000)
            m.set_newest_event(self.newest_event)
        return merged

    def _merge_device_state(self, rows: DataFrame, txn: Callable[[str], Txn | None], steps: dict[str, float]) -> int:
        began = time.monotonic()
        state = self.device_state.add(rows, txn("device_state"))
        steps["device_state_merge" if state is not None else "device_state_fold"] = time.monotonic() - began
        return 0 if state is None else state.inserted + state.updated

    def upsert_device_state(self, latest: DataFrame, txn: Txn | None) -> MergeResult:
        """One device_state MERGE of the newest rows per device, retried on a conflict and counted."""
        state = self._retry(lambda: self.tables.upsert_device_state(latest, txn, self._evolving), "device_state")
        self.metrics.merged.labels("device_state", "inserted").inc(state.inserted)
        self.metrics.merged.labels("device_state", "updated").inc(state.updated)
        return state

    @property
    def _evolving(self) -> bool:
        """Whether the MERGEs may add columns: evolution is on and has added some."""
        return self.rules.allow_new_fields and bool(self.rules.extra_columns)

    def _retry(self, write: Callable[[], T], table: str) -> T:
        """A table write that survives losing a conflict to the maintenance sidecar (counted per table)."""
        return retry_on_conflict(write, table, lambda t: self.metrics.write_conflicts.labels(t).inc())

    def _record(self, report: BatchReport) -> None:
        m = self.metrics
        m.batches.inc()
        m.input_rows.inc(report.input_rows)
        for action, rows in report.by_action.items():
            m.rows.labels(action).inc(rows)
        for rule, rows in report.quarantined_by_rule.items():
            m.quarantined.labels(rule).inc(rows)
        m.batch_seconds.observe(report.seconds)
        for step, seconds in report.steps.items():
            m.step_seconds.labels(step).set(seconds)
        m.last_batch.set(report.batch_id)
        self.reports.append(report)
        log.info(
            "%s %d: %d messages %s, %d readings inserted, %d device states, %.1f s",
            self.label,
            report.batch_id,
            report.input_rows,
            report.by_action,
            report.inserted,
            report.device_updates,
            report.seconds,
        )
        if report.steps:
            steps = ", ".join(f"{k} {v:.1f} s" for k, v in report.steps.items())
            log.info("%s %d steps: %s", self.label, report.batch_id, steps)


class _ProgressListener(StreamingQueryListener):
    def __init__(self, metrics: IngestMetrics) -> None:
        self.metrics = metrics

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        self.metrics.up.set(1)
        self.metrics.starts.inc()

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        self.metrics.record_progress(event.progress.json)

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        self.metrics.up.set(0)


# Defaults for the Spark Kafka source's consumers; `kafka.options` in the config overrides each.
# fetch.max.wait.ms: after each poll the consumer pipelines its next fetch, which at the end of the log the broker holds
# for this long; Spark's source then asks for the partition's offset range on the same connection, which waits behind
# that fetch. Kafka's 500 ms default added half a second to every task reading up to the log's end: each batch of a
# live stream (6 partitions on 2 cores: 1.4 s a batch). Data already there is returned at once, whatever the value.
SOURCE_DEFAULTS = {"kafka.fetch.max.wait.ms": "10"}


def source_options(settings: Settings) -> dict[str, str]:
    """The Kafka source's options: the topic and limits, the defaults above, then the config's kafka.options."""
    k = settings.kafka
    return {
        "kafka.bootstrap.servers": k.bootstrap_servers,
        "subscribe": k.topic,
        "startingOffsets": k.starting_offsets,
        "maxOffsetsPerTrigger": str(k.max_offsets_per_trigger),
        "failOnDataLoss": str(k.fail_on_data_loss).lower(),
        "includeHeaders": "false",
        **SOURCE_DEFAULTS,
        **k.options,
    }


def kafka_stream(spark: SparkSession, settings: Settings) -> DataFrame:
    """The topic as a streaming DataFrame (the job's, and the benchmark floor's, so both read it alike)."""
    return spark.readStream.format("kafka").options(**source_options(settings)).load()


def claim_checkpoint(files: HadoopFiles, settings: Settings) -> None:
    """Record what the checkpoint belongs to on first use; refuse a checkpoint of a different query.

    Spark would replay another topic's offsets into these tables, or these offsets into other tables.
    """
    identity = {"topic": settings.kafka.topic, "base_uri": settings.storage.base_uri}
    text = files.read_text(IDENTITY_FILE)
    if text is None:
        files.write_text(IDENTITY_FILE, json.dumps(identity))
        return
    recorded = json.loads(text)
    if recorded != identity:
        raise CheckpointError(
            f"The checkpoint at {files.directory} belongs to a different query: it was made for {recorded}, "
            f"this run is for {identity}. Point ingest.checkpoint_location at a new folder (the stream then "
            "starts from kafka.starting_offsets), or restore the topic and base_uri it was made for."
        )


def guard_checkpoint(settings: Settings, files: HadoopFiles) -> tuple[str, dict[str, int | None]] | None:
    """Refuse a checkpoint older than the tables (streaming.pipeline.checkpoint), before anything is written.

    Returns the query id and each table's transaction version for it, or None for a new checkpoint.
    """
    state = read_state(files)
    if state.query_id is None:
        return None  # a new checkpoint: a new query id, which no table has seen
    versions = txn_versions(settings, delta_storage_options(settings), state.query_id)
    check_not_older(state, versions, files.directory)
    return state.query_id, versions


def start_query(
    spark: SparkSession, settings: Settings, writer: Callable[[DataFrame, int], None], available_now: bool
) -> StreamingQuery:
    """The job's streaming query: the Kafka stream, each micro-batch handed to `writer` (a BatchWriter)."""
    stream = kafka_stream(spark, settings).writeStream.foreachBatch(writer)
    stream = stream.queryName(QUERY_NAME).option("checkpointLocation", settings.ingest.checkpoint_uri)
    if available_now:
        stream = stream.trigger(availableNow=True)
    else:
        stream = stream.trigger(processingTime=f"{settings.ingest.trigger_interval_s:.3f} seconds")
    return stream.start()


def run(
    settings: Settings,
    available_now: bool = False,
    metrics: IngestMetrics | None = None,
    faults: Faults | None = None,
    spark: SparkSession | None = None,
) -> list[BatchReport]:
    """Run the streaming job until stopped (SIGINT/SIGTERM) or, with available_now, until caught up.

    Without `spark` the job builds its session and stops it at the end; a given session (one built by
    streaming.core.session for the same storage, as the tests share) is used and left running.
    """
    faults = faults or Faults()
    check_writers_safe(settings, "ingest")
    check_kafka(settings)
    check_storage(settings)
    metrics = metrics or IngestMetrics()
    stop_serving = metrics.serve(settings.ingest.metrics_host, settings.ingest.metrics_port)
    own_session = spark is None
    spark = spark or build_session(settings)
    listener = _ProgressListener(metrics)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    files = HadoopFiles(spark, settings.ingest.checkpoint_uri)
    lock = CheckpointLock(files, settings.ingest.checkpoint_lease_ttl_s)
    try:
        spark.streams.addListener(listener)  # first in the try: the finally always removes it
        lock.acquire()
        claim_checkpoint(files, settings)
        known = guard_checkpoint(settings, files)
        tables = LakeTables(spark, settings)
        tables.ensure(on_created=lambda name: faults.crash_if("after_create", name))
        if wants_warm_up(settings, available_now):
            warm_up(
                spark, settings, lambda scratch, on: BatchWriter(spark, scratch, on, IngestMetrics(), label="warm-up")
            )
        writer = BatchWriter(spark, settings, tables, metrics, faults, lock.check)
        if known is not None:  # folded device states a crash lost: from the readings they came from
            query_id, versions = known
            app_id = txn_app_id(query_id, "device_state")
            catch_up(spark, tables, writer.upsert_device_state, app_id, versions["readings"], versions["device_state"])
        try:
            query = start_query(spark, settings, writer, available_now)
        except Exception as e:
            raise _explain(e, settings) from e
        log.info("streaming query %s started (checkpoint %s)", query.id, settings.ingest.checkpoint_uri)
        while query.isActive and not stop.is_set():
            query.awaitTermination(1)
            writer.flush_device_state(wait=False)  # an idle stream runs no batch that would upsert them
        if query.isActive:
            log.info("stopping the streaming query (signal received)")
            query.stop()
        error = query.exception()
        if error is not None:
            raise _explain(error, settings)
        writer.flush_device_state(wait=True)
        return writer.reports
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        metrics.up.set(0)
        lock.release()
        spark.streams.removeListener(listener)
        stop_serving()
        if own_session:
            spark.stop()


def _explain(error: BaseException, settings: Settings) -> IotLakeError:
    """Turn a Spark failure into one paragraph naming the cause and the fix."""
    text = str(error)
    # A ValidationFailure raised in foreachBatch comes back through py4j as text inside Spark's error.
    marker = f"{ValidationFailure.__name__}:"
    if marker in text:
        return ValidationFailure(text.split(marker, 1)[1].strip().splitlines()[0])
    # Spark's Kafka client refused by the broker (when preflight could not check the options itself).
    auth = "SaslAuthenticationException:"
    if auth in text:
        return CredentialsError(
            f"Kafka at {settings.kafka.bootstrap_servers} refused the credentials "
            f"({text.split(auth, 1)[1].strip().splitlines()[0][:500]}). Fix the username and password in "
            "kafka.sasl.jaas.config of kafka.options (IOTLAKE_KAFKA__OPTIONS), and kafka.sasl.mechanism if the "
            "broker expects another mechanism."
        )
    return IotLakeError(
        f"The streaming query failed: {text.splitlines()[0][:2000]} "
        f"(checkpoint {settings.ingest.checkpoint_uri}; the full log is above)."
    )
