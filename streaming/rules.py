"""Validation rules as Column expressions: each failed rule is a reason code, each code has an action.

Reason codes are `rule` or `rule:field` (e.g. `missing_field:device_id`). The action of a record is the
most severe action among its reasons: fail > quarantine > drop > warn > ok.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from streaming.config import Range, Settings
from streaming.schema import CORRUPT, EVENT_FIELD_NAMES, EVENT_FIELDS
from streaming.schema import Column as SchemaColumn

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


def reasons_and_action(rules: Rules, now_ms: int) -> tuple[Column, Column]:
    """(array<string> of every failed rule, the record's action), from the columns value, value_text, json_keys,
    typed, text.

    The checks are gated so one defect yields one reason: a non-JSON value is not also missing fields. The action
    is the most severe of the failed rules' actions ('ok' when none failed), taken from the same conditions rather
    than from the codes: no lambda over the array, so Spark compiles the whole expression instead of interpreting
    it row by row (a higher-order function is evaluated without code generation, and with it every expression
    inside it).
    """
    checks: list[tuple[Column, str]] = []  # (condition, reason code)

    def _code(condition: Column, code: str) -> Column:
        checks.append((condition, code))
        return F.when(condition, F.lit(code))

    typed, text = F.col("typed"), F.col("text")
    size = F.coalesce(F.length(F.col("value")), F.lit(0))
    gate_decoded = size.between(1, rules.max_message_bytes) & F.col("value_text").isNotNull()
    is_object = gate_decoded & F.col("json_keys").isNotNull()
    corrupt = typed[CORRUPT].isNotNull()

    envelope = [
        _code(size == 0, "empty_value"),
        _code(size > rules.max_message_bytes, "message_too_large"),
        _code((size.between(1, rules.max_message_bytes)) & F.col("value_text").isNull(), "invalid_utf8"),
        # Only rows that are not a JSON object pay for the second parse.
        _code(
            gate_decoded & F.col("json_keys").isNull() & F.try_parse_json("value_text").isNotNull(), "not_json_object"
        ),
        _code(gate_decoded & F.col("json_keys").isNull() & F.try_parse_json("value_text").isNull(), "malformed_json"),
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
    storable = event_time.between(MIN_EVENT_TIME_MS, MAX_EVENT_TIME_MS)
    values = [
        _code(
            is_object & version.isNotNull() & ~version.isin(list(rules.schema_versions)),
            "unknown_schema_version",
        ),
        _code(is_object & event_time.isNotNull() & ~storable, "unstorable_event_time"),
        _code(is_object & storable & (event_time > now_ms + rules.max_future_skew_ms), "event_time_in_future"),
        _code(is_object & storable & (event_time < now_ms - rules.max_lateness_ms), "event_time_too_old"),
    ]
    # A malformed object whose corruption no field explains (deep nesting, a bad token) is still malformed.
    explained = [F.coalesce(condition, F.lit(False)) for condition, _ in checks]
    # array_except with [null] drops the unmet checks' nulls (array_compact is a lambda: not compiled).
    codes = F.array_except(F.array(*envelope, *per_field, *values), F.array(F.lit(None).cast("string")))
    unexplained = is_object & corrupt & ~reduce(operator.or_, explained)
    codes = F.when(unexplained, F.array(F.lit("malformed_json"))).otherwise(codes)
    checks.append((unexplained, "malformed_json"))
    if rules.allow_new_fields and not rules.refused_fields:
        return codes, _worst_action(rules, checks)
    if rules.allow_new_fields:
        extra_keys = F.array_intersect(F.col("json_keys"), F.array(*[F.lit(n) for n in rules.refused_fields]))
    else:
        extra_keys = F.array_except(F.col("json_keys"), F.array(*[F.lit(n) for n in rules.known_fields]))
    # The only lambda left runs over the few unexpected keys, never over the checks above.
    unexpected = F.transform(F.array_sort(extra_keys), lambda k: F.concat(F.lit("unexpected_field:"), k))
    checks.append((is_object & (F.size(extra_keys) > 0), "unexpected_field"))
    return F.when(is_object, F.concat(codes, unexpected)).otherwise(codes), _worst_action(rules, checks)


def _worst_action(rules: Rules, checks: list[tuple[Column, str]]) -> Column:
    """The most severe action among the failed checks' rules ('ok' when none failed)."""
    severity = [F.when(condition, F.lit(SEVERITY[rules.action(code.split(":")[0])])) for condition, code in checks]
    worst = F.greatest(F.lit(SEVERITY["ok"]), *severity)
    names = F.array(*[F.lit(ACTION_BY_SEVERITY[i]) for i in range(len(ACTION_BY_SEVERITY))])
    return F.element_at(names, worst + 1)
