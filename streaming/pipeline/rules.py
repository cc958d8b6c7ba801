"""Validation rules as Column expressions: each failed rule is a reason code, each code has an action.

Reason codes are `rule` or `rule:field` (e.g. `missing_field:device_id`). The action of a record is the
most severe action among its reasons: fail > quarantine > drop > warn > ok.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from streaming.core.config import ALL_RULES, Range, Settings
from streaming.pipeline.schema import CORRUPT, EVENT_FIELD_NAMES, EVENT_FIELDS
from streaming.pipeline.schema import Column as SchemaColumn

SEVERITY: dict[str, int] = {"ok": 0, "warn": 1, "drop": 2, "quarantine": 3, "fail": 4}
ACTION_BY_SEVERITY: dict[int, str] = {v: k for k, v in SEVERITY.items()}
STRING_FIELDS = frozenset(c.name for c in EVENT_FIELDS if isinstance(c.type, T.StringType))
# event_time (epoch ms) must be a timestamp and a date Spark, Delta and Python can all hold: years 1..9999.
MIN_EVENT_TIME_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
MAX_EVENT_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


@dataclass(frozen=True)
class Rules:
    """Everything validation needs, fixed at start-up (plus the columns schema evolution has added)."""

    required: tuple[str, ...]
    schema_versions: tuple[int, ...]
    ranges: Mapping[str, Range]
    max_future_skew_ms: int
    max_lateness_ms: int
    max_message_bytes: int
    actions: Mapping[str, str]
    allow_new_fields: bool = False
    extra_columns: tuple[SchemaColumn, ...] = field(default=())
    refused_fields: tuple[str, ...] = ()  # new fields schema evolution can't add (objects, odd names)

    @classmethod
    def from_settings(cls, settings: Settings, extra_columns: tuple[SchemaColumn, ...] = ()) -> Rules:
        v = settings.validation
        return cls(
            required=v.required,
            schema_versions=v.schema_versions,
            ranges=v.ranges,
            max_future_skew_ms=int(v.max_future_skew_s * 1000),
            max_lateness_ms=int(v.max_lateness_s * 1000),
            max_message_bytes=v.max_message_bytes,
            actions=dict(v.actions),
            allow_new_fields=settings.schema_evolution.add_new_fields,
            extra_columns=extra_columns,
        )

    @property
    def known_fields(self) -> tuple[str, ...]:
        return (*EVENT_FIELD_NAMES, *(c.name for c in self.extra_columns))

    def action(self, rule: str) -> str:
        return self.actions.get(rule, "quarantine")


def _code(condition: Column, code: str) -> Column:
    return F.when(condition, F.lit(code))


def _size() -> Column:
    return F.coalesce(F.length(F.col("value")), F.lit(0))


def _decoded(rules: Rules) -> Column:
    """The value is within the size limit and valid UTF-8 (value_text holds it)."""
    return _size().between(1, rules.max_message_bytes) & F.col("value_text").isNotNull()


def _is_object(rules: Rules) -> Column:
    """The value decoded to a JSON object (json_object_keys found keys): the gate of every per-field check."""
    return _decoded(rules) & F.col("json_keys").isNotNull()


def check_codes(rules: Rules) -> Column:
    """array<string> of every failed check but those against the batch's clock and unexpected fields (clock_codes,
    reason_codes), from value, value_text, json_keys, typed and text.

    The checks are gated so one defect yields one reason: a non-JSON value is not also missing fields. No lambda
    (higher-order function) may wrap them, nor stand in the projection that computes them: Spark evaluates such a
    projection row by row without generated code, and these are about 40 conditions a row.
    """
    typed, text = F.col("typed"), F.col("text")
    size = _size()
    gate_decoded = _decoded(rules)
    is_object = _is_object(rules)
    corrupt = typed[CORRUPT].isNotNull()

    envelope = [
        _code(size == 0, "empty_value"),
        _code(size > rules.max_message_bytes, "message_too_large"),
        _code((size.between(1, rules.max_message_bytes)) & F.col("value_text").isNull(), "invalid_utf8"),
        F.when(
            gate_decoded & F.col("json_keys").isNull(),
            # Only rows that are not a JSON object pay for this second parse.
            F.when(F.try_parse_json(F.col("value_text")).isNotNull(), F.lit("not_json_object")).otherwise(
                F.lit("malformed_json")
            ),
        ),
    ]

    per_field: list[Column] = []
    evolved = {c.name for c in rules.extra_columns}
    for name in rules.known_fields:
        value = typed[name]
        # The typed parse nulls a mistyped field; the text parse (read only for corrupt rows) tells the two apart.
        present_as_text = F.when(corrupt, text[name].isNotNull()).otherwise(F.lit(False))
        missing = value.isNull() & ~present_as_text
        if name in STRING_FIELDS:
            missing = missing | (F.trim(value) == "")
        if name in rules.required:
            per_field.append(_code(is_object & missing, f"missing_field:{name}"))
        # A value that doesn't fit a column schema evolution added is a conflict with earlier messages.
        mistyped = "type_conflict" if name in evolved else "wrong_type"
        per_field.append(_code(is_object & value.isNull() & present_as_text, f"{mistyped}:{name}"))
        bounds = rules.ranges.get(name)
        if bounds is not None:
            outside = (value < bounds.min) | (value > bounds.max) | F.isnan(value.cast("double"))
            per_field.append(_code(is_object & value.isNotNull() & outside, f"out_of_range:{name}"))

    version = typed["schema_version"]
    event_time = typed["event_time"]
    values = [
        _code(
            is_object & version.isNotNull() & ~version.isin(list(rules.schema_versions)),
            "unknown_schema_version",
        ),
        _code(is_object & event_time.isNotNull() & ~_storable(event_time), "unstorable_event_time"),
    ]
    return compact(F.array(*envelope, *per_field, *values))


def clock_codes(rules: Rules, codes: Column, now_ms: Column) -> Column:
    """The check codes, then those of the checks against `now_ms` (the batch's clock, epoch ms); `malformed_json`
    alone for a corrupt JSON object that no code explains (deep nesting, a bad token).

    Not in check_codes, whose whole-stage method they would take from about 6 kB to 11.5 kB: they run in
    reason_codes' projection (batch.Validator). The clock is a column of the batch (batch.BATCH_CLOCK), not a
    literal, so their code is the same for every batch.
    """
    event_time = F.col("typed")["event_time"]
    is_object = _is_object(rules)
    in_time = is_object & _storable(event_time)
    clock = [
        _code(in_time & (event_time > now_ms + rules.max_future_skew_ms), "event_time_in_future"),
        _code(in_time & (event_time < now_ms - rules.max_lateness_ms), "event_time_too_old"),
    ]
    codes = F.concat(codes, compact(F.array(*clock)))
    unexplained = is_object & F.col("typed")[CORRUPT].isNotNull() & (F.size(codes) == 0)
    return F.when(unexplained, F.array(F.lit("malformed_json"))).otherwise(codes)


def _storable(event_time: Column) -> Column:
    return event_time.between(MIN_EVENT_TIME_MS, MAX_EVENT_TIME_MS)


def reason_codes(rules: Rules, codes: Column) -> Column:
    """The check codes plus `unexpected_field:<key>` for each unexpected key of a JSON object, sorted.

    Its lambda runs over the few unexpected keys, in a projection of its own after check_codes' (batch.validate).
    """
    is_object = _is_object(rules)
    if rules.allow_new_fields:
        if not rules.refused_fields:
            return codes
        extra_keys = F.array_intersect(F.col("json_keys"), F.array(*[F.lit(n) for n in rules.refused_fields]))
    else:
        extra_keys = F.array_except(F.col("json_keys"), F.array(*[F.lit(n) for n in rules.known_fields]))
    unexpected = F.transform(F.array_sort(extra_keys), lambda k: F.concat(F.lit("unexpected_field:"), k))
    return F.when(is_object, F.concat(codes, unexpected)).otherwise(codes)


def compact(codes: Column) -> Column:
    """The array without its nulls (the unmet checks), in order.

    Not `array_compact`: that is a lambda (`filter`), which Spark evaluates row by row without generated code,
    and with it every check inside its argument. `array_except` compiles; codes never repeat, so its dedup is moot.
    """
    return F.array_except(codes, F.array(F.lit(None).cast("string")))


def action_of(rules: Rules, reasons: Column) -> Column:
    """The most severe action among the reasons ('ok' when there are none)."""
    rank_by_rule = F.create_map(
        *[item for rule in sorted(ALL_RULES) for item in (F.lit(rule), F.lit(SEVERITY[rules.action(rule)]))]
    )
    quarantine = F.lit(SEVERITY["quarantine"])
    ranks = F.transform(
        reasons, lambda code: F.coalesce(F.element_at(rank_by_rule, F.split(code, ":", 2)[0]), quarantine)
    )
    worst = F.coalesce(F.array_max(ranks), F.lit(SEVERITY["ok"]))
    names = F.array(*[F.lit(ACTION_BY_SEVERITY[i]) for i in range(len(ACTION_BY_SEVERITY))])
    return F.element_at(names, worst + 1)
