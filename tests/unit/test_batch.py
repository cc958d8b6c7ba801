"""Batch logic on small DataFrames: every validation rule and action, dedup, ordering (local Spark, no services)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from streaming.core.config import Settings, load_settings
from streaming.pipeline import batch
from streaming.pipeline.rules import Rules, compact

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
INFO = batch.BatchInfo(7, NOW)
RAW_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp timestamp"


def event(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schema_version": 1,
        "event_id": "e-1",
        "device_id": "dev-1",
        "parcel_id": "parcel-1",
        "seq": 1,
        "event_time": NOW_MS - 1000,
        "air_temperature_c": 20.5,
        "air_humidity_pct": 55.0,
        "soil_nitrogen_mg_kg": 30.0,
        "soil_salinity_ds_m": 1.2,
        "battery_v": 3.7,
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not DROP}


DROP = object()


def encode(e: dict[str, Any]) -> bytes:
    return json.dumps(e).encode()


def kafka_rows(spark: SparkSession, values: list[bytes | None], partition: int = 0) -> DataFrame:
    rows = [(b"k", v, "t", partition, offset, NOW) for offset, v in enumerate(values)]
    return spark.createDataFrame(rows, RAW_SCHEMA)


def outcomes(spark: SparkSession, values: list[bytes | None], rules: Rules) -> list[tuple[list[str], str]]:
    validated = batch.validate(kafka_rows(spark, values), rules, INFO)
    return [(list(r.reasons), r.action) for r in validated.orderBy("offset").select("reasons", "action").collect()]


@pytest.fixture(scope="module")
def rules(local_settings: Settings) -> Rules:
    return Rules.from_settings(local_settings)


CASES: list[tuple[str, bytes | None, list[str]]] = [
    ("valid", encode(event()), []),
    ("number as string", encode(event(air_temperature_c="21.5")), ["wrong_type:air_temperature_c"]),
    ("seq as string", encode(event(seq="12")), ["wrong_type:seq"]),
    ("missing device", encode(event(device_id=DROP)), ["missing_field:device_id"]),
    ("null device", encode(event(device_id=None)), ["missing_field:device_id"]),
    ("blank device", encode(event(device_id="  ")), ["missing_field:device_id"]),
    ("hot", encode(event(air_temperature_c=500)), ["out_of_range:air_temperature_c"]),
    ("negative humidity", encode(event(air_humidity_pct=-1)), ["out_of_range:air_humidity_pct"]),
    ("year 2100", encode(event(event_time=4102444800000)), ["event_time_in_future"]),
    ("year 1970", encode(event(event_time=86400000)), ["event_time_too_old"]),
    ("schema v7", encode(event(schema_version=7)), ["unknown_schema_version"]),
    ("extra field", encode(event(wind_ms=3.2)), ["unexpected_field:wind_ms"]),
    ("not json", b'{"event_id": "x", broken', ["malformed_json"]),
    ("empty", b"", ["empty_value"]),
    ("null", None, ["empty_value"]),
    ("invalid utf8", b"\xff\xfe\xfa", ["invalid_utf8"]),
    ("array", b"[1, 2]", ["not_json_object"]),
    ("scalar", b"42", ["not_json_object"]),
    ("deep nesting", b'{"a":' * 3000 + b"1" + b"}" * 3000, ["malformed_json"]),
    ("too large", encode(event(parcel_id="p" * 70000)), ["message_too_large"]),
]


def test_every_rule_gives_exactly_its_reason(spark: SparkSession, rules: Rules) -> None:
    got = outcomes(spark, [value for _, value, _ in CASES], rules)
    for (name, _, expected), (reasons, action) in zip(CASES, got, strict=True):
        assert reasons == expected, name
        assert action == ("ok" if not expected else "quarantine"), name


def test_future_skew_and_lateness_bounds_are_inclusive_of_the_allowance(spark: SparkSession, rules: Rules) -> None:
    values = [
        encode(event(event_time=NOW_MS + rules.max_future_skew_ms)),
        encode(event(event_time=NOW_MS + rules.max_future_skew_ms + 1)),
        encode(event(event_time=NOW_MS - rules.max_lateness_ms)),
        encode(event(event_time=NOW_MS - rules.max_lateness_ms - 1)),
    ]
    got = [reasons for reasons, _ in outcomes(spark, values, rules)]
    assert got == [[], ["event_time_in_future"], [], ["event_time_too_old"]]


def test_one_validator_judges_each_batch_by_its_own_clock(spark: SparkSession, rules: Rules) -> None:
    """A stream builds its checks once (batch.Validator); the clock still comes from each batch, never the first."""
    validator = batch.Validator.of(rules)
    skew, lateness = rules.max_future_skew_ms, rules.max_lateness_ms
    values = [encode(event(event_time=NOW_MS + skew + 1)), encode(event(event_time=NOW_MS - lateness))]
    now = batch.BatchInfo(1, NOW)
    later = batch.BatchInfo(2, NOW + timedelta(milliseconds=1))
    got = {}
    for info in (now, later, now):  # the same expressions, a clock each time, and back
        validated = validator(kafka_rows(spark, values), info)
        rows = validated.orderBy("offset").select("reasons", batch.BATCH_CLOCK, batch.BATCH_ID).collect()
        assert {(r[batch.BATCH_CLOCK], r[batch.BATCH_ID]) for r in rows} == {(info.now_ms, info.batch_id)}
        got[info.batch_id] = [list(r.reasons) for r in rows]
    assert got[1] == [["event_time_in_future"], []]
    assert got[2] == [[], ["event_time_too_old"]]


def test_actions_warn_drop_and_fail(spark: SparkSession, local_settings: Settings) -> None:
    settings = replace(
        local_settings,
        validation=replace(
            local_settings.validation,
            actions={"out_of_range": "warn", "event_time_too_old": "drop", "event_time_in_future": "fail"},
        ),
    )
    rules = Rules.from_settings(settings)
    values = [
        encode(event(air_temperature_c=500)),
        encode(event(event_time=86400000)),
        encode(event(event_time=4102444800000)),
        encode(event(air_temperature_c=500, event_time=4102444800000)),  # the worst action wins
    ]
    assert [a for _, a in outcomes(spark, values, rules)] == ["warn", "drop", "fail", "fail"]


def test_warned_rows_are_kept_with_their_warnings(spark: SparkSession, local_settings: Settings) -> None:
    settings = replace(local_settings, validation=replace(local_settings.validation, actions={"out_of_range": "warn"}))
    rules = Rules.from_settings(settings)
    validated = batch.validate(kafka_rows(spark, [encode(event(air_temperature_c=500))]), rules, INFO)
    rows = batch.readings(validated, rules).collect()
    assert len(rows) == 1
    assert rows[0].warnings == ["out_of_range:air_temperature_c"]


def test_readings_dedup_within_batch_keeps_the_first_by_kafka_position(spark: SparkSession, rules: Rules) -> None:
    values = [
        encode(event(event_id="a", seq=1)),
        encode(event(event_id="b", seq=2)),
        encode(event(event_id="a", seq=1)),
    ]
    raw = kafka_rows(spark, values, partition=3)
    rows = batch.readings(batch.validate(raw, rules, INFO), rules).orderBy("event_id").collect()
    assert [(r.event_id, r.kafka_offset) for r in rows] == [("a", 0), ("b", 1)]
    assert rows[0].event_time == datetime.fromtimestamp((NOW_MS - 1000) / 1000, UTC).replace(tzinfo=None)
    assert str(rows[0].event_date) == "2026-11-30"
    assert rows[0].ingest_batch_id == 7


def test_latest_per_device_orders_by_event_time_then_seq(spark: SparkSession, rules: Rules) -> None:
    values = [
        encode(event(event_id="new", device_id="d1", seq=5, event_time=NOW_MS - 1000)),
        encode(event(event_id="late", device_id="d1", seq=9, event_time=NOW_MS - 3_600_000)),
        encode(event(event_id="tie-low", device_id="d2", seq=1, event_time=NOW_MS - 500)),
        encode(event(event_id="tie-high", device_id="d2", seq=2, event_time=NOW_MS - 500)),
    ]
    raw = kafka_rows(spark, values)
    latest = batch.latest_per_device(batch.readings(batch.validate(raw, rules, INFO), rules))
    assert {r.device_id: r.event_id for r in latest.collect()} == {"d1": "new", "d2": "tie-high"}


def test_quarantine_keeps_raw_bytes_text_and_coordinates(spark: SparkSession, rules: Rules) -> None:
    values = [b"\xff\xfe", b"not json", encode(event())]
    rows = batch.quarantine(batch.validate(kafka_rows(spark, values), rules, INFO)).orderBy("kafka_offset")
    got = rows.collect()
    assert [(bytes(r.raw_value), r.value_text, r.reason, r.kafka_offset) for r in got] == [
        (b"\xff\xfe", None, "invalid_utf8", 0),
        (b"not json", "not json", "malformed_json", 1),
    ]
    assert all(str(r.ingest_date) == "2026-11-30" for r in got)


def test_unusual_ids_pass_through_intact(spark: SparkSession, rules: Rules) -> None:
    odd = ["quote'd", 'dq"id', "back`tick", "with space", "emoji 🚀🌱", "semi;colon -- DROP TABLE x"]
    values = [encode(event(event_id=i, device_id=i, parcel_id=i)) for i in odd]
    rows = batch.readings(batch.validate(kafka_rows(spark, values), rules, INFO), rules).collect()
    assert sorted(r.event_id for r in rows) == sorted(odd)
    assert all(r.device_id == r.event_id == r.parcel_id for r in rows)


def test_schema_evolution_allows_new_fields_and_infers_types(spark: SparkSession, local_settings: Settings) -> None:
    settings = replace(local_settings, schema_evolution=replace(local_settings.schema_evolution, add_new_fields=True))
    rules = Rules.from_settings(settings)
    values = [
        encode(event(event_id="a", wind_ms=3)),
        encode(event(event_id="b", wind_ms=3.5, label="north")),
        encode(event(event_id="c", nested={"x": 1})),
        encode(event(event_id="d", **{"bad name": 1})),
    ]
    validated = batch.validate(kafka_rows(spark, values), rules, INFO)
    assert all(r.action == "ok" for r in validated.collect())
    new = batch.new_field_names(validated)
    assert new == ["bad name", "label", "nested", "wind_ms"]
    columns, refused = batch.infer_new_columns(validated, new)
    assert {c.name: c.type.simpleString() for c in columns} == {"label": "string", "wind_ms": "double"}
    assert sorted(refused) == ["bad name", "nested"]
    evolved = replace(rules, extra_columns=tuple(columns), refused_fields=tuple(refused))
    again = batch.validate(kafka_rows(spark, values), evolved, INFO)
    got = {r.offset: list(r.reasons) for r in again.collect()}
    assert got == {0: [], 1: [], 2: ["unexpected_field:nested"], 3: ["unexpected_field:bad name"]}
    rows = {r.event_id: r for r in batch.readings(again, evolved).collect()}
    assert rows["a"].wind_ms == 3.0 and rows["b"].label == "north"


def test_type_conflict_with_an_evolved_column_is_quarantined(spark: SparkSession, local_settings: Settings) -> None:
    from pyspark.sql import types as T

    from streaming.pipeline.schema import Column

    settings = replace(local_settings, schema_evolution=replace(local_settings.schema_evolution, add_new_fields=True))
    rules = replace(Rules.from_settings(settings), extra_columns=(Column("wind_ms", T.DoubleType(), ""),))
    got = outcomes(spark, [encode(event(wind_ms="windy"))], rules)
    assert got == [(["type_conflict:wind_ms"], "quarantine")]


def test_batch_stats_count_actions_rules_dates_buckets_and_the_kept_id_range(
    spark: SparkSession, local_settings: Settings
) -> None:
    settings = replace(
        local_settings, validation=replace(local_settings.validation, actions={"event_time_in_future": "fail"})
    )
    rules = Rules.from_settings(settings)
    two_days_ago = NOW_MS - 2 * 86_400_000
    values = [
        encode(event()),
        encode(event(event_id="x", event_time=two_days_ago)),
        b"nope",
        encode(event(event_id="a", device_id=DROP)),
        encode(event(event_id="zz", event_time=4102444800000)),
    ]
    validated = batch.validate(kafka_rows(spark, values), rules, INFO)
    stats = batch.summarize(batch.batch_stats(validated).collect(), rules)
    assert stats.by_action == {"ok": 2, "quarantine": 2, "fail": 1}
    assert stats.quarantined_by_rule == {"malformed_json": 1, "missing_field": 1}
    assert stats.failed == {"event_time_in_future": 1}
    assert [str(d) for d in stats.dates] == ["2026-11-28", "2026-11-30"]
    assert stats.buckets == tuple(
        sorted({two_days_ago // batch.TIME_BUCKET_MS, (NOW_MS - 1000) // batch.TIME_BUCKET_MS})
    )
    assert stats.newest_event_ms == NOW_MS - 1000
    assert stats.id_range == ("e-1", "x")  # the kept rows' ids only: not "a" (quarantined) nor "zz" (failed)
    assert (stats.messages, stats.kept) == (5, 2)


def test_a_batch_that_keeps_nothing_has_no_id_range(spark: SparkSession, local_settings: Settings) -> None:
    rules = Rules.from_settings(local_settings)
    validated = batch.validate(kafka_rows(spark, [b"nope", encode(event(device_id=DROP))]), rules, INFO)
    stats = batch.summarize(batch.batch_stats(validated).collect(), rules)
    assert (stats.kept, stats.id_range, stats.dates) == (0, None, ())


def test_rules_follow_config(tmp_path: Any) -> None:
    settings = load_settings(env={"IOTLAKE_VALIDATION__RANGES": "{battery_v: {min: 1, max: 2}}"})
    rules = Rules.from_settings(settings)
    assert dict(rules.ranges).keys() == {"battery_v"}


EXTREME_TIMES: list[tuple[str, Any, str]] = [
    # (name, event_time as sent, the rule it fails)
    ("epoch zero", 0, "event_time_too_old"),
    ("negative", -1, "event_time_too_old"),
    ("year 33658", 10**15, "unstorable_event_time"),
    ("long max", 2**63 - 1, "unstorable_event_time"),
    ("long min", -(2**63), "unstorable_event_time"),
    ("beyond long", 2**64, "wrong_type:event_time"),
    ("a float", 1.5, "wrong_type:event_time"),
    ("a float in exponent form", 1e15, "wrong_type:event_time"),
    ("a string", "soon", "wrong_type:event_time"),
]


@pytest.mark.parametrize("time_action", ["warn", "drop", "quarantine"])
@pytest.mark.parametrize("unstorable_action", ["quarantine", "drop"])
def test_extreme_event_times_land_where_their_action_says_and_never_break_the_batch(
    spark: SparkSession, local_settings: Settings, time_action: str, unstorable_action: str
) -> None:
    actions = {
        "event_time_in_future": time_action,
        "event_time_too_old": time_action,
        "unstorable_event_time": unstorable_action,
    }
    settings = replace(local_settings, validation=replace(local_settings.validation, actions=actions))
    rules = Rules.from_settings(settings)
    values = [encode(event(event_id=f"e{i}", seq=i, event_time=t)) for i, (_, t, _) in enumerate(EXTREME_TIMES)]
    validated = batch.validate(kafka_rows(spark, [*values, encode(event(event_id="fine"))]), rules, INFO)
    got = {r.offset: (list(r.reasons), r.action) for r in validated.select("offset", "reasons", "action").collect()}
    for offset, (name, _, rule) in enumerate(EXTREME_TIMES):
        expected = {"unstorable_event_time": unstorable_action, "event_time_too_old": time_action}.get(
            rule, "quarantine"
        )
        assert got[offset] == ([rule], expected), name
    # The driver's arithmetic (dates, ranges) and the readings' timestamps hold whatever was kept.
    stats = batch.summarize(batch.batch_stats(validated).collect(), rules)
    kept = {r.event_id: r for r in batch.readings(validated, rules).collect()}
    assert set(kept) == ({"fine", "e0", "e1"} if time_action == "warn" else {"fine"})
    assert min(stats.dates) == (date(1969, 12, 31) if time_action == "warn" else NOW.date())
    assert batch.time_ranges(stats.buckets)
    quarantined = {r.raw_value for r in batch.quarantine(validated).collect()}
    assert len(quarantined) == sum(a == "quarantine" for _, a in got.values())


def test_batch_stats_stay_small_with_100k_distinct_unexpected_keys(spark: SparkSession, rules: Rules) -> None:
    """A hostile producer sending a new key in every message must not make the driver's stats unbounded."""
    rows = spark.range(100_000).selectExpr(
        "cast('k' as binary) as key",
        f"""cast(concat('{{"event_id": "e', id, '", "device_id": "d", "parcel_id": "p", "seq": ', id,
            ', "event_time": {NOW_MS - 1000}, "schema_version": 1, "odd_', id, '": 1}}') as binary) as value""",
        "'t' as topic",
        "0 as partition",
        "id as offset",
        "current_timestamp() as timestamp",
    )
    validated = batch.validate(rows, rules, INFO)
    stats_rows = batch.batch_stats(validated).collect()
    assert len(stats_rows) <= 10
    stats = batch.summarize(stats_rows, rules)
    assert stats.by_action == {"quarantine": 100_000}
    assert stats.quarantined_by_rule == {"unexpected_field": 100_000}


def test_a_failing_rule_is_reported_with_an_example_reason(spark: SparkSession, local_settings: Settings) -> None:
    settings = replace(
        local_settings, validation=replace(local_settings.validation, actions={"unexpected_field": "fail"})
    )
    rules = Rules.from_settings(settings)
    values = [encode(event(event_id=f"e{i}", seq=i, **{f"odd_{i}": 1})) for i in range(3)]
    stats = batch.summarize(batch.batch_stats(batch.validate(kafka_rows(spark, values), rules, INFO)).collect(), rules)
    ((reason, count),) = stats.failed.items()
    assert reason.startswith("unexpected_field:odd_") and count == 3


@contextmanager
def final_plan_up_front(spark: SparkSession) -> Iterator[None]:
    """Adaptive execution off, so a plan shows its whole-stage subtrees (`*(n)`) before it runs."""
    adaptive = spark.conf.get("spark.sql.adaptive.enabled")
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    try:
        yield
    finally:
        spark.conf.set("spark.sql.adaptive.enabled", adaptive)


def whole_stage(spark: SparkSession, frame: DataFrame) -> list[tuple[str, int]]:
    """(Java source, largest method's bytecode size) of each whole-stage subtree of a DataFrame's final plan."""
    with final_plan_up_front(spark):
        stages = frame._jdf.queryExecution().debug().codegenToSeq()
        return [(str(s._2()), int(s._3().maxMethodCodeSize())) for s in (stages.apply(i) for i in range(stages.size()))]


def test_the_checks_run_in_generated_code(spark: SparkSession, rules: Rules) -> None:
    """Spark evaluates a projection that holds a lambda (higher-order function, e.g. array_compact's `filter`)
    row by row without generated code, and with it every expression of that projection: the ~40 checks of a
    row must sit in a projection that whole-stage code generation (`*(n)` in the plan) compiles."""
    validated = batch.validate(kafka_rows(spark, [encode(event()), encode(event(wind_ms=1.0))]), rules, INFO)
    with final_plan_up_front(spark):
        plan = validated._jdf.queryExecution().executedPlan().toString()
    checks = [line for line in plan.splitlines() if "missing_field:device_id" in line]
    assert checks, plan[:2000]
    assert all(re.match(r"^[\s:+-]*\*\(\d+\) Project", line) for line in checks), [c[:200] for c in checks]
    assert "unexpected_field:" in plan  # the lambda over unexpected keys is still there, in a projection of its own
    assert [list(r.reasons) for r in validated.orderBy("offset").collect()] == [[], ["unexpected_field:wind_ms"]]


def test_the_validations_whole_stage_method_runs_and_the_jit_compiles_it(spark: SparkSession, rules: Rules) -> None:
    """The ~40 checks made one generated method of about 11.5 kB, over HotSpot's 8,000-byte JIT limit (about 6 kB
    since the checks against the clock left it; columns added by schema evolution add checks). Left to per-operator
    code (hugeMethodLimit 8000), every task generated the projections' code again; run whole-stage, the method must be
    JIT-compiled or every row's checks run in the bytecode interpreter. So: whole-stage, and a JVM started with
    -XX:-DontCompileHugeMethods."""
    validated = batch.validate(kafka_rows(spark, [encode(event()), b"{"]), rules, INFO)
    sizes = [size for _, size in whole_stage(spark, validated)]
    limit = int(spark.conf.get("spark.sql.codegen.hugeMethodLimit"))
    assert all(size <= limit for size in sizes), (sizes, limit)  # every subtree runs whole-stage
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hotspot = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    assert hotspot.getVMOption("DontCompileHugeMethods").getValue() == "false"


def test_compact_drops_nulls_and_keeps_order(spark: SparkSession) -> None:
    row = (
        spark.range(1)
        .select(
            compact(F.array(F.lit("b"), F.lit(None).cast("string"), F.lit("a"), F.lit(None).cast("string"))).alias("c"),
            compact(F.array(F.lit(None).cast("string"))).alias("empty"),
        )
        .first()
    )
    assert row is not None
    assert list(row["c"]) == ["b", "a"]
    assert list(row["empty"]) == []


def test_a_later_batch_compiles_no_new_code(spark: SparkSession, rules: Rules) -> None:
    """Spark writes long, date and timestamp literals into the Java it generates and reuses a compiled class only
    for an identical source. With the batch's clock and id as literals, every batch compiled the checks against
    the clock and the readings and quarantine projections again (Janino, then the JIT from its interpreter up: in
    a 5,000 events/s run the only JIT work that did not fade after warm-up). Only the MERGE's literal dates and
    time ranges, which Delta needs to skip files, may still differ (streaming.pipeline.tables)."""
    validator = batch.Validator.of(rules)
    future = NOW_MS + 3 * 86_400_000  # ahead of both batches' clocks: the two batches' rows meet the same fates
    values = [encode(event()), encode(event(event_time=future)), b"{", encode(event(air_temperature_c=500))]

    def one_batch(info: batch.BatchInfo) -> tuple[list[Any], list[Any], list[Any]]:
        validated = validator(kafka_rows(spark, values), info)
        batch.summarize(batch.batch_stats(validated).collect(), rules)
        kept = batch.readings(validated, rules)
        ms = F.unix_millis("ingest_time").alias("ingest_ms")
        return (
            kept.select(F.unix_millis("event_time"), "ingest_batch_id", ms).orderBy("event_time").collect(),
            batch.latest_per_device(kept).select("device_id", ms).collect(),
            batch.quarantine(validated).select("reason", "ingest_batch_id", "ingest_date").collect(),
        )

    compilations = spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    one_batch(INFO)
    before = compilations.getCount()
    later = batch.BatchInfo(INFO.batch_id + 1, NOW + timedelta(days=1, minutes=20))
    kept, latest, quarantined = one_batch(later)
    assert compilations.getCount() - before == 0
    # The later batch's own clock, id and date all the same (its clock deciding its checks: the test above).
    assert [tuple(r) for r in kept] == [(NOW_MS - 1000, 8, later.now_ms)]
    assert [tuple(r) for r in latest] == [("dev-1", later.now_ms)]
    assert sorted(tuple(r) for r in quarantined) == [
        ("event_time_in_future", 8, date(2026, 12, 1)),
        ("malformed_json", 8, date(2026, 12, 1)),
        ("out_of_range:air_temperature_c", 8, date(2026, 12, 1)),
    ]
