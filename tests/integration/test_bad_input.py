"""A corpus of bad messages lands in quarantine with the right reason; valid ones beside them land intact."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from streaming.core.config import Settings
from tests.integration.lake import ingest, read_table

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NOW_MS = int(time.time() * 1000) - 60_000


def event(event_id: str, **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schema_version": 1,
        "event_id": event_id,
        "device_id": f"dev-{event_id}",
        "parcel_id": "parcel-1",
        "seq": 1,
        "event_time": NOW_MS,
        "air_temperature_c": 18.25,
        "air_humidity_pct": 61.0,
        "soil_nitrogen_mg_kg": 42.0,
        "soil_salinity_ds_m": 0.8,
        "battery_v": 3.9,
    }
    base.update(changes)
    return base


def js(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


missing_device = event("m1")
del missing_device["device_id"]

BAD: list[tuple[str, bytes | None, str]] = [
    ("not json", b'{"event_id": "x", broken', "malformed_json"),
    ("number as string", js(event("b1", air_temperature_c="21.5")), "wrong_type:air_temperature_c"),
    ("seq as string", js(event("b2", seq="12")), "wrong_type:seq"),
    ("missing device_id", js(missing_device), "missing_field:device_id"),
    ("500 C", js(event("b3", air_temperature_c=500)), "out_of_range:air_temperature_c"),
    ("year 2100", js(event("b4", event_time=4102444800000)), "event_time_in_future"),
    ("year 1970", js(event("b5", event_time=86400000)), "event_time_too_old"),
    ("empty value", b"", "empty_value"),
    ("null value", None, "empty_value"),
    ("binary garbage", bytes(range(256)) * 4, "invalid_utf8"),
    ("invalid utf-8 in a string", b'{"event_id": "\xc3\x28"}', "invalid_utf8"),
    ("json array", b'[{"event_id": "a"}]', "not_json_object"),
    ("json scalar", b'"just a string"', "not_json_object"),
    ("deep nesting", b'{"a":' * 5000 + b"1" + b"}" * 5000, "malformed_json"),
    ("near the size limit", js(event("big", parcel_id="p" * 1_500_000)), "message_too_large"),
    ("unknown schema_version", js(event("b6", schema_version=99)), "unknown_schema_version"),
]
ODD_IDS = ["quote'd", 'double"quote', "back`tick", "with space", "emoji 🌱🚜", "x') OR 1=1 --", "semi;colon"]


def test_bad_messages_are_quarantined_with_their_reason(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "message.max.bytes": 3_000_000})
    delivered: dict[tuple[int, int], str] = {}
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any, expected: str) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered[(msg.partition(), msg.offset())] = expected

    messages: list[tuple[bytes | None, str]] = []
    for i in range(3):  # interleave good and bad so every batch holds both
        messages += [(js(event(f"good-{i}-{n}", device_id=n, parcel_id=n, seq=i + 1)), "") for n in ODD_IDS]
        messages += [(value, reason) for _, value, reason in BAD]
    for n, (value, reason) in enumerate(messages):
        producer.produce(
            settings.kafka.topic,
            value=value,
            key=f"k{n}".encode(),
            on_delivery=lambda err, msg, r=reason: on_delivery(err, msg, r),
        )
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors

    env = {**test_env, "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": "40"}  # several batches, the stream goes on
    reports = ingest(spark, env)
    assert len(reports) > 1, "the bad messages were meant to spread over several batches"

    quarantine = read_table(settings, "quarantine", stack_secrets)
    got = {(q["kafka_partition"], q["kafka_offset"]): q for q in quarantine}
    expected_bad = {k: v for k, v in delivered.items() if v}
    assert {k: q["reason"] for k, q in got.items()} == expected_bad
    for q in quarantine:  # the raw bytes are kept, the text when it decodes
        if q["reason"] == "empty_value":
            assert q["raw_value"] in (None, b"")
        else:
            assert q["raw_value"]
        if q["reason"] == "invalid_utf8":
            assert q["value_text"] is None
    assert len(quarantine) == len(BAD) * 3

    readings = read_table(settings, "readings", stack_secrets)
    assert sorted(r["device_id"] for r in readings) == sorted(ODD_IDS * 3)
    assert all(r["parcel_id"] == r["device_id"] for r in readings)
