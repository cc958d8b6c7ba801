"""Cheap, valid JSON for events: pre-encoded constant parts and fixed-decimal floats (pure)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

SCHEMA_VERSION = 1


# One valid event: %-formatting straight to bytes is the cheapest exact way to build it in Python.
# Arguments: id prefix, counter, ids fragment, seq, event_time, the five readings, extra fields.
EVENT_TEMPLATE = (
    b'{"schema_version":1,"event_id":"%s%012x",%s,"seq":%d,"event_time":%d,'
    b'"air_temperature_c":%.2f,"air_humidity_pct":%.2f,"soil_nitrogen_mg_kg":%.2f,'
    b'"soil_salinity_ds_m":%.2f,"battery_v":%.2f%s}'
)


def event_id_prefix(seed: int, start_time_ms: int) -> str:
    """First 24 characters of a UUIDv8-shaped id unique to (seed, start); a 12-hex counter follows."""
    h = hashlib.sha256(f"sensor-sim:{seed}:{start_time_ms}".encode()).hexdigest()
    return f"{h[0:8]}-{h[8:12]}-8{h[12:15]}-{'89ab'[int(h[15], 16) % 4]}{h[16:19]}-"


def event_id(prefix: str, n: int) -> str:
    """The id of generated event number `n` (48-bit counter)."""
    return f"{prefix}{n:012x}"


def ids_fragment(device_id: str, parcel_id: str) -> bytes:
    """The constant `"device_id":...,"parcel_id":...` part of a device's events."""
    return f'"device_id":"{device_id}","parcel_id":"{parcel_id}"'.encode()


def added_fields_fragment(names: tuple[str, ...], seq: int) -> bytes:
    """Schema-drift fields: `,"NAME":<float>` for each name, the value varying with seq."""
    value = 1.5 + (seq % 50) * 0.01
    return "".join(f',"{name}":{value:.2f}' for name in names).encode()


def event_dict(
    eid: str,
    device_id: str,
    parcel_id: str,
    seq: int,
    event_time: int,
    readings: tuple[float, float, float, float, float],
) -> dict[str, Any]:
    """The same event as a dict (slow path, used to build malformed variants)."""
    temp, humidity, nitrogen, salinity, battery = (round(v, 2) for v in readings)
    return {
        "schema_version": SCHEMA_VERSION,
        "event_id": eid,
        "device_id": device_id,
        "parcel_id": parcel_id,
        "seq": seq,
        "event_time": event_time,
        "air_temperature_c": temp,
        "air_humidity_pct": humidity,
        "soil_nitrogen_mg_kg": nitrogen,
        "soil_salinity_ds_m": salinity,
        "battery_v": battery,
    }


def dumps(obj: dict[str, Any]) -> bytes:
    """Compact JSON bytes, like the fast path."""
    return json.dumps(obj, separators=(",", ":")).encode()
