"""MERGE batch time against table size: the job's literal-date MERGE and the seed-style one, at 1M and 10M rows.

The readings table is created by LakeTables.ensure() on MinIO (s3a) and filled with synthetic rows in its schema:
one row per `step_ms` of event time going back from a head 50 s before now (the batch's new events fill the gap),
written in contiguous time slices of `rows_per_file` rows (one file per slice and date, like the job's batches).
Like the job's files, each slice holds `late_fraction` late rows, 5 minutes to 6 hours older than the slice, so its
event_time range spans hours. Growing from 1M to 10M adds the 9M older rows: spread over the previous days in the
`merge` section (the dedup horizon: the date literals prune them), within the open partition at 5,000 rows/s in
`merge_open` (10M rows are 33 minutes of a stream at the demo rate: what a batch meets during the day).

Each timed MERGE gets a fresh, materialized batch (new event ids), in `make run`'s fault mix: new events
after the table's newest row, as dense as the batch would be at 5,000 events/s (250,000 rows: 50 s); 2% exact
copies of the table's newest DUPLICATE_HISTORY rows (the simulator re-sends one of its last 10,000 messages);
1% late events, 5 minutes to 6 hours back. Event ids are the simulator's: one run's prefix and a counter in send
order, so a late event carries a new id and an old time. `ids="random"` hashes them instead (random UUIDs).
The literal MERGE gets the dates and event-time ranges computed exactly as streaming/pipeline/ingest.py computes
them. Before each MERGE the table is restored (Delta RESTORE) to the version of the size under test, so every run
sees the same table.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stack import BenchStack, free_port
from bench.stats import median
from producers.encoding import event_id_prefix
from producers.faults import DUPLICATE_HISTORY
from streaming.cli.run import DEMO_FAULT_RATES
from streaming.core.config import load_settings
from streaming.core.http import get_json
from streaming.core.session import build_session
from streaming.pipeline.schema import READINGS_COLUMNS
from streaming.pipeline.tables import LakeTables

ID_PREFIX = event_id_prefix(1, 0)  # one simulator run sent every row
HEAD_COUNTER = 1 << 40  # the counter of the table's newest row; older rows count down from it
MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
LATE_SPAN_MS = 6 * HOUR_MS - 5 * MINUTE_MS  # the simulator's late events: 5 min to 6 h behind
SCAN_METRICS = {
    "number of files read": "files_read",
    "size of files read": "bytes_read",
    "number of output rows": "rows_read",
    "number of partitions read": "partitions_read",
}


@dataclass(frozen=True)
class MergeParams:
    sizes: tuple[int, ...] = (1_000_000, 10_000_000)
    batch_rows: int = 250_000
    duplicate_fraction: float = DEMO_FAULT_RATES["duplicate"]  # `make run`'s fault mix
    late_fraction: float = DEMO_FAULT_RATES["late"]  # of the batch and of the table's rows
    runs: int = 3
    span_days: float = 7.0  # the largest table covers this much event time (the dedup horizon)
    rows_per_file: int = 250_000
    warmup_rounds: int = 2  # untimed (literal, seed) pairs at the first size: JIT and caches
    devices: int = 200
    batch_rate: float = 5000.0  # the batch's new events are as dense as a stream of this many events/s
    rate: float | None = None  # table rows as dense as a stream of this many events/s (None: over span_days)
    ids: str = "sent"  # event ids: "sent" (the simulator's: a counter in send order) or "random" (hashed)


class Synth:
    """Synthetic readings rows in the table's schema, from an index (0 = newest table row)."""

    def __init__(self, spark: Any, now_ms: int, params: MergeParams) -> None:
        from pyspark.sql import types as T

        self.spark = spark
        self.params = params
        self.now_ms = now_ms
        self.head_ms = now_ms - int(params.batch_rows / params.batch_rate * 1000)  # the batch's new events follow
        self.step_ms = 1000 / params.rate if params.rate else params.span_days * DAY_MS / max(params.sizes)
        self.schema = T.StructType([T.StructField(c.name, c.type, True) for c in READINGS_COLUMNS])

    def _rows(self, ids: Any, counter: Any, time_ms: Any, batch_id: Any) -> Any:
        """Rows from a DataFrame with an `id` column, given expressions for the event id's counter (its place in
        send order), event time (ms) and batch id."""
        from pyspark.sql import functions as F

        n = self.params.devices
        dev = (F.col("id") % n).cast("int")
        sent_id = F.concat(F.lit(ID_PREFIX), F.lpad(F.lower(F.hex(counter)), 12, "0"))
        seeded = F.xxhash64(sent_id)
        unit = (F.abs(seeded % 1_000_000) / 1_000_000.0).cast("double")
        cols = {
            "event_id": sent_id if self.params.ids == "sent" else F.substring(F.sha2(sent_id, 256), 1, 32),
            "device_id": F.concat(F.lit("dev-"), F.lpad((dev + 1).cast("string"), 5, "0")),
            "parcel_id": F.concat(F.lit("parcel-"), F.lpad((dev % 20 + 1).cast("string"), 3, "0")),
            "seq": (F.lit(10**9) - F.col("id") / n).cast("long"),
            "event_time": F.timestamp_millis(time_ms.cast("long")),
            "schema_version": F.lit(1),
            "air_temperature_c": F.lit(5.0) + unit * 20,
            "air_humidity_pct": F.lit(40.0) + unit * 40,
            "soil_nitrogen_mg_kg": F.lit(20.0) + unit * 60,
            "soil_salinity_ds_m": F.lit(0.5) + unit * 3,
            "battery_v": F.lit(3.3) + unit * 0.9,
            "event_date": F.to_date(F.timestamp_millis(time_ms.cast("long"))),
            "kafka_topic": F.lit("bench"),
            "kafka_partition": (F.col("id") % 6).cast("int"),
            "kafka_offset": F.col("id"),
            "kafka_timestamp": F.timestamp_millis((time_ms + 50).cast("long")),
            "ingest_time": F.timestamp_millis((time_ms + 3000).cast("long")),
            "ingest_batch_id": batch_id.cast("long"),
            "warnings": F.array().cast("array<string>"),
        }
        return ids.select(*[cols[f.name].cast(f.dataType).alias(f.name) for f in self.schema.fields])

    def _table_time_ms(self) -> Any:
        """Event time (ms) of table row `id`: one every step_ms back from the head; a late_fraction of the rows
        5 min to 6 h older than that (the simulator's late events), as in the job's files."""
        from pyspark.sql import functions as F

        def unit(salt: str) -> Any:
            return F.abs(F.xxhash64(F.lit(salt), F.col("id")) % 1_000_000) / 1_000_000.0

        lag = F.lit(5 * MINUTE_MS) + unit("lag") * F.lit(LATE_SPAN_MS)
        late = unit("late") < F.lit(self.params.late_fraction)
        return F.lit(self.head_ms) - F.col("id") * F.lit(self.step_ms) - F.when(late, lag).otherwise(F.lit(0.0))

    def table_rows(self, start: int, end: int) -> Any:
        """Table rows start..end-1, in contiguous file slices of rows_per_file."""
        from pyspark.sql import functions as F

        slices = max(1, -(-(end - start) // self.params.rows_per_file))
        ids = self.spark.range(start, end, numPartitions=slices)
        return self._rows(ids, self._table_counter(), self._table_time_ms(), F.col("id") / self.params.rows_per_file)

    @staticmethod
    def _table_counter() -> Any:
        """Table row `id`'s counter: the newest row was sent last."""
        from pyspark.sql import functions as F

        return F.lit(HEAD_COUNTER) - F.col("id")

    def batch(self, run: int) -> Any:
        """A fresh MERGE batch: new events since the table's head, duplicates of its newest rows, late ones."""
        from pyspark.sql import functions as F

        p = self.params
        n_dup = int(p.batch_rows * p.duplicate_fraction)
        n_late = int(p.batch_rows * p.late_fraction)
        n_new = p.batch_rows - n_dup - n_late
        window = self.now_ms - self.head_ms  # new events fall between the table's head and now
        sent = F.lit(HEAD_COUNTER + 1 + run * p.batch_rows) + F.col("id")  # sent after the table's rows, in order
        new = self._rows(
            self.spark.range(0, n_new),
            sent,
            F.lit(self.now_ms) - F.col("id") * F.lit(window / max(n_new, 1)),
            F.lit(-1 - run),
        )
        late = self._rows(
            self.spark.range(n_new, n_new + n_late),
            sent,
            F.lit(self.now_ms - 5 * MINUTE_MS) - (F.col("id") - n_new) * F.lit(LATE_SPAN_MS / max(n_late, 1)),
            F.lit(-1 - run),
        )
        # Exact copies of the table's newest DUPLICATE_HISTORY rows (same event_id, event_time, event_date); 7 is
        # coprime with DUPLICATE_HISTORY, so a batch's copies are distinct.
        dup_ids = self.spark.range(0, n_dup).select(((F.col("id") * 7 + run) % DUPLICATE_HISTORY).alias("id"))
        dups = self._rows(
            dup_ids,
            self._table_counter(),
            self._table_time_ms(),
            F.col("id") / self.params.rows_per_file,
        )
        return new.unionByName(late).unionByName(dups).repartition(4, "event_id")


def job_span(rows: Any) -> tuple[list[Any], list[tuple[int, int]], tuple[str, str]]:
    """The batch's literal dates, event-time ranges and event-id range, as streaming/pipeline/ingest.py derives
    them for the MERGE.

    The job takes the UTC dates and the TIME_BUCKET_MS buckets of the kept rows' event times, turns the buckets into
    ranges with time_ranges(), and takes their smallest and largest event_id; the same values come from the
    deduplicated rows here.
    """
    from pyspark.sql import functions as F

    from streaming.pipeline.batch import TIME_BUCKET_MS, time_ranges

    span = rows.agg(
        F.collect_set("event_date").alias("dates"),
        F.collect_set(F.floor(F.unix_millis("event_time") / TIME_BUCKET_MS)).alias("buckets"),
        F.min("event_id").alias("first_id"),
        F.max("event_id").alias("last_id"),
    ).first()
    assert span is not None
    return list(span["dates"]), time_ranges(int(b) for b in span["buckets"]), (span["first_id"], span["last_id"])


def seed_merge(spark: Any, uri: str, source: Any) -> None:
    """The seed's MERGE: condition t.event_id = s.event_id only, no partition literals, insert-only."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    target = DeltaTable.forPath(spark, uri).alias("t")
    target.merge(source.alias("s"), F.col("t.event_id") == F.col("s.event_id")).whenNotMatchedInsertAll().execute()


class ScanMetrics:
    """Target scan metrics (files, bytes, rows read) of the MERGEs run since the last call, from Spark's
    REST API (SQL executions named "MERGE operation ...", their "Scan parquet" nodes)."""

    def __init__(self, spark: Any, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1/applications/{spark.sparkContext.applicationId}"
        self.seen = self._max_id()

    def _get(self, path: str) -> Any:
        return get_json(self.base + path, timeout=30)

    def _max_id(self) -> int:
        data = self._get("/sql?details=false&length=100000") or []
        return max((int(x["id"]) for x in data), default=-1)

    def since_last(self) -> dict[str, float]:
        """Scan metrics summed over the SQL executions since the previous call."""
        # The API's offset counts the executions the UI retains, not their ids: ids run on across the
        # SparkContexts of one JVM (a second section's start after the first's), so new ones are picked by id.
        data = self._get("/sql?details=true&planDescription=false&length=100000") or []
        totals: dict[str, float] = {}
        for execution in data:
            if int(execution["id"]) <= self.seen:
                continue
            self.seen = max(self.seen, int(execution["id"]))
            if not str(execution.get("description", "")).startswith("MERGE operation"):
                continue  # Delta's snapshot and log reads have their own executions
            for node in execution.get("nodes", []):
                if node.get("nodeName") != "Scan parquet":
                    continue
                for metric in node.get("metrics", []):
                    if metric.get("name") in SCAN_METRICS:
                        key = SCAN_METRICS[metric["name"]]
                        totals[key] = totals.get(key, 0.0) + _metric_value(metric["value"])
        return totals


def _metric_value(text: str) -> float:
    """A Spark UI metric value: '12', '1,234', '5.2 MiB' (as bytes), 'total (min, med, max)\\n12 (...)'."""
    value = str(text).split("\n")[-1].split("(")[0].strip().replace(",", "")
    units = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
    parts = value.split()
    try:
        if len(parts) == 2 and parts[1] in units:
            return float(parts[0]) * units[parts[1]]
        return float(parts[0]) if parts else 0.0
    except ValueError:
        return 0.0


MERGE_KEYS = (
    "executionTimeMs", "scanTimeMs", "rewriteTimeMs", "materializeSourceTimeMs", "numSourceRows",
    "numTargetRowsInserted", "numTargetRowsCopied", "numTargetFilesAdded", "numTargetFilesRemoved",
    "numTargetFilesBeforeSkipping", "numTargetFilesAfterSkipping", "numTargetBytesBeforeSkipping",
    "numTargetBytesAfterSkipping", "numTargetPartitionsAfterSkipping",
)  # fmt: skip


def run_merge(stack: BenchStack, workdir: Path, params: MergeParams, echo: Any = print) -> dict[str, Any]:
    """Median MERGE times at each table size, literal-date (the job's) and seed-style, and their ratios.

    Sizes are built first (each a Delta version); the timed runs then alternate sizes and kinds, restoring
    the version of the size under test before each MERGE, so drift (JIT, background load) hits all alike.
    """
    from delta.tables import DeltaTable
    from pyspark.storagelevel import StorageLevel

    env = stack.workload("merge", workdir, topic=False)
    settings = load_settings(env=env)
    ui_port = free_port()
    spark = build_session(
        settings,
        app_name="iotlake-bench-merge",
        extra_conf={"spark.ui.enabled": "true", "spark.ui.port": str(ui_port), "spark.ui.host": "127.0.0.1"},
    )
    sizes = sorted(params.sizes)
    result: dict[str, Any] = {"sizes": {}, "warmup": []}
    try:
        tables = LakeTables(spark, settings)
        tables.ensure()
        uri = tables.readings_uri
        synth = Synth(spark, int(time.time() * 1000), params)
        scans = ScanMetrics(spark, ui_port)
        result["table"] = {
            "uri": uri,
            "head": datetime.fromtimestamp(synth.head_ms / 1000, UTC).isoformat(),
            "step_ms": round(synth.step_ms, 3),
            "rows_per_file": params.rows_per_file,
        }
        versions: dict[int, int] = {}
        written = 0
        for size in sizes:
            started = time.monotonic()
            synth.table_rows(written, size).write.format("delta").mode("append").save(uri)
            written = size
            versions[size] = tables.version(uri)
            row = DeltaTable.forPath(spark, uri).detail().first()
            detail = row.asDict() if row is not None else {}
            oldest = datetime.fromtimestamp((synth.head_ms - (size - 1) * synth.step_ms) / 1000, UTC)
            result["sizes"][str(size)] = {
                "version": versions[size],
                "files": detail.get("numFiles"),
                "bytes": detail.get("sizeInBytes"),
                "oldest_event": oldest.isoformat(),
                "write_s": round(time.monotonic() - started, 1),
                "literal": {"runs": []},
                "seed": {"runs": []},
            }
            echo(
                f"merge: table at {size:,} rows (v{versions[size]}, {detail.get('numFiles')} files, oldest "
                f"{oldest:%Y-%m-%d %H:%M}) written in {time.monotonic() - started:.0f} s"
            )

        current: int | None = versions[sizes[-1]]  # the version whose content the table has now
        batches = itertools.count()

        def measure(size: int, kind: str) -> dict[str, Any]:
            nonlocal current
            if current != versions[size]:
                DeltaTable.forPath(spark, uri).restoreToVersion(versions[size])
            rows = synth.batch(next(batches)).persist(StorageLevel.MEMORY_AND_DISK)
            try:
                source_rows = rows.count()
                dates, ranges, ids = job_span(rows)
                scans.since_last()
                t0 = time.monotonic()
                if kind == "literal":
                    tables.merge_readings(rows, dates, ranges, None, False, ids)
                else:
                    seed_merge(spark, uri, rows)
                seconds = time.monotonic() - t0
            finally:
                current = None
                rows.unpersist()
            history = DeltaTable.forPath(spark, uri).history(1).first()
            metrics = dict(history["operationMetrics"] or {}) if history is not None else {}
            return {
                "seconds": round(seconds, 3),
                "source_rows": source_rows,
                "dates": [str(d) for d in sorted(dates)],
                "time_ranges": len(ranges),
                "delta_metrics": {k: metrics[k] for k in MERGE_KEYS if k in metrics},
                "scan": scans.since_last(),
            }

        plan = [(sizes[0], kind, True) for _ in range(params.warmup_rounds) for kind in ("literal", "seed")]
        plan += [(size, kind, False) for _ in range(params.runs) for size in sizes for kind in ("literal", "seed")]
        for size, kind, warmup in plan:
            entry = measure(size, kind)
            echo(
                f"merge: {size:,} rows, {kind}{' (warm-up)' if warmup else ''}: {entry['seconds']:.2f} s, "
                f"target files read {entry['scan'].get('files_read', -1):.0f}"
            )
            if warmup:
                result["warmup"].append({"size": size, "kind": kind, **entry})
            else:
                result["sizes"][str(size)][kind]["runs"].append(entry)
    finally:
        spark.stop()
    for size in sizes:
        for kind in ("literal", "seed"):
            d = result["sizes"][str(size)][kind]
            d["median_s"] = round(median([r["seconds"] for r in d["runs"]]), 3)
    small, large = str(sizes[0]), str(sizes[-1])
    for kind in ("literal", "seed"):
        ratio = result["sizes"][large][kind]["median_s"] / result["sizes"][small][kind]["median_s"]
        result[f"{kind}_ratio"] = round(ratio, 3)
    echo(
        f"merge: ratio {large}/{small}: literal {result['literal_ratio']:.2f}x, seed-style {result['seed_ratio']:.2f}x"
    )
    return result
