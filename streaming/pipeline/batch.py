"""One micro-batch, with no I/O: parse -> validate -> split -> dedup -> order (DataFrames in, DataFrames out)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.window import Window

from streaming.pipeline.rules import Rules, action_of, check_codes, clock_codes, reason_codes
from streaming.pipeline.schema import (
    CORRUPT,
    DEVICE_STATE_COLUMNS,
    EVENT_FIELD_NAMES,
    READINGS_COLUMNS,
    text_event_schema,
    typed_event_schema,
)
from streaming.pipeline.schema import Column as SchemaColumn

KEEP = ("ok", "warn")
EPOCH = date(1970, 1, 1)
# A reading's identity: a re-send (same id, same time) is a duplicate; the same id at another time is another reading.
READING_KEY = ("event_id", "event_time")
# A device's newest reading: by event_time, then seq, then event_id, within a batch and across batches alike.
DEVICE_ORDER = ("event_time", "seq", "event_id")
DAY_MS = 86_400_000
TIME_BUCKET_MS = 10 * 60 * 1000  # divides a day: a bucket never spans two event dates
MAX_TIME_RANGES = 16
ROW_NUMBER = "#row"  # a helper column no message field can name (EVOLVABLE_NAME has no '#')
BATCH_CLOCK = "#now_ms"  # the batch's clock (epoch ms), a helper column as ROW_NUMBER
BATCH_ID = "#batch_id"  # the batch's id, another
# A one-row table on the driver (no Spark job to broadcast it) whose values the optimizer doesn't fold into
# literals. (Not a parameterized query: Delta's SQL parser leaves its parameters unbound.)
BATCH_CONSTANTS = "SELECT * FROM VALUES ({now_ms:d}L, {batch_id:d}L) AS t(`" + BATCH_CLOCK + "`, `" + BATCH_ID + "`)"
EVOLVABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_VARIANT_TYPES: dict[str, T.DataType] = {
    "BOOLEAN": T.BooleanType(),
    "STRING": T.StringType(),
    **{t: T.DoubleType() for t in ("TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE", "DECIMAL")},
}


@dataclass(frozen=True)
class BatchInfo:
    """What identifies a micro-batch; fixed before any row is looked at."""

    batch_id: int
    ingest_time: datetime

    @property
    def now_ms(self) -> int:
        return round(self.ingest_time.timestamp() * 1000)


@dataclass(frozen=True, eq=False)  # Columns don't compare to a bool
class Validator:
    """The validation's expressions for one Rules, built once and applied to every batch.

    Building them is several hundred py4j calls (about 0.3 s of the driver's time on this project's 2-core machine),
    so they are not built again for each batch. What is the batch's own, its clock and id, comes in as the columns
    of a one-row table joined to its rows (BATCH_CLOCK, BATCH_ID), not as literals: Spark writes a long literal
    into the Java it generates, and reuses a compiled class only for an identical source, so with literals every
    batch compiled its checks and projections again (Janino, then the JIT from its interpreter up).
    """

    rules: Rules
    steps: tuple[tuple[str, Column], ...]  # (column, expression), added in this order

    @classmethod
    def of(cls, rules: Rules) -> Validator:
        extra = rules.extra_columns
        size = F.coalesce(F.length("value"), F.lit(0))
        as_text = F.col("value").cast("string")
        decodable = size.between(1, rules.max_message_bytes) & F.is_valid_utf8(as_text)
        typed_options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
        corrupt = F.col(f"typed.{CORRUPT}").isNotNull()
        steps = [
            ("value_text", F.when(decodable, as_text)),
            ("json_keys", F.json_object_keys("value_text")),
            ("typed", F.from_json("value_text", typed_event_schema(extra), typed_options)),
            ("text", F.when(corrupt, F.from_json("value_text", text_event_schema(extra)))),
            # Two projections: the checks run in whole-stage generated code; the lambda over unexpected keys, and
            # with it the checks against the batch's clock, in one of their own.
            ("reasons", check_codes(rules)),
            ("reasons", reason_codes(rules, clock_codes(rules, F.col("reasons"), F.col(BATCH_CLOCK)))),
            ("action", action_of(rules, F.col("reasons"))),
        ]
        if rules.allow_new_fields:
            known = F.array(*[F.lit(n) for n in rules.known_fields])
            new_fields = F.when(F.col("action").isin(*KEEP), F.array_except(F.col("json_keys"), known))
            steps.append(("new_fields", new_fields))
        return cls(rules, tuple(steps))

    def __call__(self, raw: DataFrame, info: BatchInfo) -> DataFrame:
        """Kafka rows (key, value, topic, partition, offset, timestamp), the batch's clock and id, and the parse,
        reasons and action."""
        constants = raw.sparkSession.sql(BATCH_CONSTANTS.format(now_ms=info.now_ms, batch_id=info.batch_id))
        validated = raw.crossJoin(F.broadcast(constants))
        for name, expression in self.steps:
            validated = validated.withColumn(name, expression)
        # Only what the writes need is kept (and cached): the parse helpers go.
        return validated.drop("json_keys", "text")


def validate(raw: DataFrame, rules: Rules, info: BatchInfo) -> DataFrame:
    """One batch validated with expressions built for it alone (a stream keeps a Validator instead)."""
    return Validator.of(rules)(raw, info)


def _utc_date(epoch_ms: Column) -> Column:
    """The UTC date of epoch milliseconds (a Spark column; date_of is the same for a Python int)."""
    return F.date_from_unix_date(F.floor(epoch_ms / DAY_MS).cast("int"))


def _kafka_columns() -> list[Column]:
    return [
        F.col("topic").alias("kafka_topic"),
        F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"),
        F.col("timestamp").alias("kafka_timestamp"),
    ]


def _ingest_columns() -> list[Column]:
    """The batch's clock and id, from the validated rows' helper columns (Validator)."""
    return [F.timestamp_millis(F.col(BATCH_CLOCK)).alias("ingest_time"), F.col(BATCH_ID).alias("ingest_batch_id")]


def readings(validated: DataFrame, rules: Rules) -> DataFrame:
    """Rows to keep (action ok or warn), one per READING_KEY: the first by Kafka (partition, offset)."""
    event_time_ms = F.col("typed.event_time")
    fields = [
        F.timestamp_millis(event_time_ms).alias(name) if name == "event_time" else F.col(f"typed.{name}").alias(name)
        for name in EVENT_FIELD_NAMES
    ]
    extra = [F.col(f"typed.{c.name}").alias(c.name) for c in rules.extra_columns]
    rows = validated.where(F.col("action").isin(*KEEP)).select(
        *fields,
        _utc_date(event_time_ms).alias("event_date"),
        *_kafka_columns(),
        *_ingest_columns(),
        F.when(F.col("action") == "warn", F.col("reasons"))
        .otherwise(F.array().cast("array<string>"))
        .alias("warnings"),
        *extra,
    )
    return dedup_first(rows, READING_KEY, ("kafka_partition", "kafka_offset"))


def dedup_first(rows: DataFrame, key: tuple[str, ...], order: tuple[str, ...]) -> DataFrame:
    """One row per key: the smallest by `order` (unique per row), so a replayed batch picks the same row."""
    return first_per_key(rows, key, [F.col(c).asc() for c in order])


def first_per_key(rows: DataFrame, key: tuple[str, ...], order: list[Column]) -> DataFrame:
    """The first row of each key by `order`: a window's row number.

    Not `min_by`/`max_by(struct(every column))`: that aggregate's buffer is a struct, which Spark can only
    sort-aggregate with every column in the sort (1.15-1.3x the time on 250k messages).
    """
    first = Window.partitionBy(*key).orderBy(*order)
    return rows.withColumn(ROW_NUMBER, F.row_number().over(first)).where(F.col(ROW_NUMBER) == 1).drop(ROW_NUMBER)


def latest_per_device(readings_df: DataFrame) -> DataFrame:
    """The newest reading of each device in the batch by DEVICE_ORDER: the device_state source."""
    names = [c.name for c in DEVICE_STATE_COLUMNS if c.name != "ingest_time"]
    extra = [c for c in readings_df.columns if c not in {col.name for col in READINGS_COLUMNS}]
    cols = [*names, *extra, "ingest_time"]
    return first_per_key(readings_df.select(*cols), ("device_id",), [F.col(c).desc() for c in DEVICE_ORDER])


def quarantine(validated: DataFrame) -> DataFrame:
    """Rejected records as received, with every reason and their Kafka coordinates."""
    return validated.where(F.col("action") == "quarantine").select(
        F.col("key").alias("raw_key"),
        F.col("value").alias("raw_value"),
        "value_text",
        F.col("reasons")[0].alias("reason"),
        "reasons",
        *_kafka_columns(),
        *_ingest_columns(),
        _utc_date(F.col(BATCH_CLOCK)).alias("ingest_date"),
    )


@dataclass(frozen=True)
class BatchStats:
    """Everything the driver needs to know about a validated batch, from one small aggregation."""

    by_action: dict[str, int]
    quarantined_by_rule: dict[str, int]
    failed: dict[str, int]  # an example reason -> messages, per group of rules that includes a `fail` one
    dates: tuple[date, ...]  # event dates of the kept rows: the MERGE's literal partitions
    buckets: tuple[int, ...]  # event-time buckets (epoch ms // TIME_BUCKET_MS) of the kept rows
    newest_event_ms: int | None  # the newest event time among the kept rows
    id_range: tuple[str, str] | None = None  # the kept rows' smallest and largest event_id

    @property
    def messages(self) -> int:
        return sum(self.by_action.values())

    @property
    def kept(self) -> int:
        return sum(self.by_action.get(a, 0) for a in KEEP)


def batch_stats(validated: DataFrame) -> DataFrame:
    """Rows per (action, rules failed, event-time bucket of kept rows), with an example reason, the newest time and
    the kept rows' event-id range.

    Only counts, mins and maxes: a handful of rows. Grouped by rule names, not reason codes, because
    codes like `unexpected_field:<key>` carry names from the messages: a producer could make them unbounded.
    Dates follow from the buckets.
    """
    kept = F.col("action").isin(*KEEP)
    event_ms = F.col("typed.event_time")
    # The lambda runs in a projection of its own (and only on rows with reasons): in the aggregate's grouping
    # it would keep the aggregate out of generated code.
    names = F.sort_array(F.array_distinct(F.transform("reasons", lambda r: F.split(r, ":", 2)[0])))
    rules = F.when(F.size("reasons") > 0, names).otherwise(F.array().cast("array<string>"))
    grouped = validated.select(
        "action",
        "reasons",
        rules.alias("rules"),
        F.when(kept, F.floor(event_ms / TIME_BUCKET_MS)).alias("bucket"),
        F.when(kept, event_ms).alias("kept_ms"),
        F.when(kept, F.col("typed.event_id")).alias("kept_id"),
    )
    return grouped.groupBy("action", "rules", "bucket").agg(
        F.count(F.lit(1)).alias("rows"),
        F.max("kept_ms").alias("newest"),
        F.min("reasons").alias("example"),
        F.min("kept_id").alias("first_id"),
        F.max("kept_id").alias("last_id"),
    )


def new_field_names(validated: DataFrame) -> list[str]:
    """Keys of kept rows that no column holds yet: the candidates for schema evolution (evolution only)."""
    return sorted(r[0] for r in validated.select(F.explode("new_fields")).distinct().collect())


def summarize(rows: list[Row], rules: Rules) -> BatchStats:
    """Fold batch_stats rows into counts by action and rule, plus the kept rows' dates, buckets and id range."""
    by_action: dict[str, int] = {}
    by_rule: dict[str, int] = {}
    failed: dict[str, int] = {}
    buckets: set[int] = set()
    newest: int | None = None
    first_ids: list[str] = []
    last_ids: list[str] = []
    for row in rows:
        action, count = row["action"], row["rows"]
        by_action[action] = by_action.get(action, 0) + count
        if action == "quarantine":
            for rule in row["rules"]:
                by_rule[rule] = by_rule.get(rule, 0) + count
        if action == "fail":
            for reason in row["example"]:
                if rules.action(reason.split(":")[0]) == "fail":
                    failed[reason] = failed.get(reason, 0) + count
                    break
        if row["bucket"] is not None:
            buckets.add(int(row["bucket"]))
        if row["newest"] is not None:
            newest = max(newest or 0, int(row["newest"]))
        if row["first_id"] is not None:
            first_ids.append(row["first_id"])
            last_ids.append(row["last_id"])
    dates = sorted({date_of(b * TIME_BUCKET_MS) for b in buckets})
    id_range = (min(first_ids), max(last_ids)) if first_ids else None
    return BatchStats(by_action, by_rule, failed, tuple(dates), tuple(sorted(buckets)), newest, id_range)


def date_of(epoch_ms: int) -> date:
    """The UTC date of an instant, by integer arithmetic: no local timezone, no float rounding."""
    return EPOCH + timedelta(days=epoch_ms // DAY_MS)


def time_ranges(buckets: Iterable[int], width_ms: int = TIME_BUCKET_MS) -> list[tuple[int, int]]:
    """Contiguous event-time ranges [first ms, last ms] covering the given bucket numbers (epoch ms // width_ms).

    Late events make a batch's [min, max] span hours; a few narrow ranges keep file skipping effective.
    At most MAX_TIME_RANGES ranges: the smallest gaps are closed first. Epoch milliseconds, not datetimes:
    a naive datetime literal would be read in the Python process's local timezone.
    """
    ordered = sorted(set(buckets))
    if not ordered:
        return []
    spans: list[list[int]] = [[ordered[0], ordered[0]]]
    for b in ordered[1:]:
        if b == spans[-1][1] + 1:
            spans[-1][1] = b
        else:
            spans.append([b, b])
    while len(spans) > MAX_TIME_RANGES:
        gaps = [spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1)]
        i = gaps.index(min(gaps))
        spans[i : i + 2] = [[spans[i][0], spans[i + 1][1]]]
    return [(lo * width_ms, (hi + 1) * width_ms - 1) for lo, hi in spans]


def infer_new_columns(validated: DataFrame, names: list[str]) -> tuple[list[SchemaColumn], list[str]]:
    """Types of new fields, from their first occurrence by Kafka position; (columns, names that can't evolve).

    Numbers become double, so 3 and 3.5 don't conflict; objects, arrays and odd names don't evolve.
    """
    evolvable = [n for n in names if EVOLVABLE_NAME.match(n)]
    refused = [n for n in names if not EVOLVABLE_NAME.match(n)]
    if not evolvable:
        return [], refused
    variant = F.try_parse_json("value_text")
    firsts = validated.where(F.col("action").isin(*KEEP)).select(
        *[
            F.min_by(
                F.schema_of_variant(F.try_variant_get(variant, f"$.{n}", "variant")),
                F.when(
                    F.try_variant_get(variant, f"$.{n}", "variant").isNotNull(),
                    F.struct("partition", "offset"),
                ),
            ).alias(n)
            for n in evolvable
        ]
    )
    row = firsts.first()
    columns: list[SchemaColumn] = []
    for name in evolvable:
        kind = (row[name] if row is not None else None) or ""
        data_type = _VARIANT_TYPES.get(kind.split("(")[0])
        if data_type is None:
            refused.append(name)
        else:
            columns.append(SchemaColumn(name, data_type, f"Added by schema evolution on {_today()}"))
    return columns, refused


def _today() -> str:
    return datetime.now(UTC).date().isoformat()
