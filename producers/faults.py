"""Fault kinds, the per-message fault draw and malformed payloads, each failing exactly one rule (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from producers.encoding import dumps, event_dict

VALID = "valid"
LATE = "late"
OUT_OF_ORDER = "out_of_order"
DUPLICATE = "duplicate"
MALFORMED = "malformed"
VALID_KINDS = (VALID, LATE, OUT_OF_ORDER)
# Each kind is quarantined by exactly one rule of the streaming job (named in the comment).
NOT_JSON = "not_json"  # malformed_json
WRONG_TYPE = "wrong_type"  # wrong_type: air_temperature_c is a JSON string
MISSING_FIELD = "missing_field"  # missing_field: no device_id
OUT_OF_RANGE = "out_of_range"  # out_of_range: air_temperature_c = 500
FUTURE_TIME = "future_time"  # event_time_in_future: year 2100
ANCIENT_TIME = "ancient_time"  # event_time_too_old: 1970
MALFORMED_KINDS = (NOT_JSON, WRONG_TYPE, MISSING_FIELD, OUT_OF_RANGE, FUTURE_TIME, ANCIENT_TIME)
# The one reason code the streaming job's default rules give each kind: the contract the tests check.
REASON_BY_KIND = {
    NOT_JSON: "malformed_json",
    WRONG_TYPE: "wrong_type:air_temperature_c",
    MISSING_FIELD: "missing_field:device_id",
    OUT_OF_RANGE: "out_of_range:air_temperature_c",
    FUTURE_TIME: "event_time_in_future",
    ANCIENT_TIME: "event_time_too_old",
}

LATE_MIN_MS = 5 * 60_000
LATE_MAX_MS = 6 * 3_600_000
OUT_OF_RANGE_TEMP = 500.0
YEAR_2100_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z
ANCIENT_MS = 86_400_000  # 1970-01-02T00:00:00Z
_DAY_MS = 86_400_000
DUPLICATE_HISTORY = 10_000  # duplicates re-send one of the last this-many valid messages


@dataclass(frozen=True)
class FaultPlan:
    """Cumulative thresholds: one uniform draw in [0, 1) decides the fate of a message slot."""

    duplicate: float = 0.0
    malformed: float = 0.0
    late: float = 0.0
    out_of_order: float = 0.0

    @property
    def any_fault(self) -> float:
        """Draws at or above this are plain valid events."""
        return self.duplicate + self.malformed + self.late + self.out_of_order

    def pick(self, u: float) -> str:
        """DUPLICATE, MALFORMED, LATE, OUT_OF_ORDER or VALID for the draw `u`."""
        edge = self.duplicate
        if u < edge:
            return DUPLICATE
        edge += self.malformed
        if u < edge:
            return MALFORMED
        edge += self.late
        if u < edge:
            return LATE
        edge += self.out_of_order
        if u < edge:
            return OUT_OF_ORDER
        return VALID


def late_lag_ms(u: float) -> int:
    """How far behind the clock a late event is, from a uniform draw: 5 min to 6 h."""
    return LATE_MIN_MS + int(u * (LATE_MAX_MS - LATE_MIN_MS))


def malformed_payload(
    kind: str,
    eid: str,
    device_id: str,
    parcel_id: str,
    seq: int,
    event_time: int,
    readings: tuple[float, float, float, float, float],
) -> bytes:
    """The bytes of a malformed message of `kind`: otherwise a valid event, broken in one way only."""
    if kind == NOT_JSON:
        return f'{{"event_id":"{eid}","device_id":"{device_id}", broken'.encode()
    event = event_dict(eid, device_id, parcel_id, seq, event_time, readings)
    if kind == WRONG_TYPE:
        event["air_temperature_c"] = f"{readings[0]:.2f}"
    elif kind == MISSING_FIELD:
        del event["device_id"]
    elif kind == OUT_OF_RANGE:
        event["air_temperature_c"] = OUT_OF_RANGE_TEMP
    elif kind == FUTURE_TIME:
        event["event_time"] = YEAR_2100_MS + event_time % _DAY_MS
    elif kind == ANCIENT_TIME:
        event["event_time"] = ANCIENT_MS + event_time % _DAY_MS
    else:
        raise ValueError(f"unknown malformed kind {kind!r}; known: {', '.join(MALFORMED_KINDS)}")
    return dumps(event)
