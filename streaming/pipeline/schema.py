"""The event schema on the wire and the three tables' columns, with their descriptions."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import types as T


@dataclass(frozen=True)
class Column:
    name: str
    type: T.DataType
    comment: str
    nullable: bool = True


# The JSON event as sensor-sim and real devices send it (schema_version 1).
EVENT_FIELDS: tuple[Column, ...] = (
    Column("event_id", T.StringType(), "Id of the reading; with event_time, the dedup key"),
    Column("device_id", T.StringType(), "Sensor device id"),
    Column("parcel_id", T.StringType(), "Farm parcel the device is installed on"),
    Column("seq", T.LongType(), "Per-device sequence number, increasing"),
    Column("event_time", T.LongType(), "Measurement time, epoch milliseconds UTC"),
    Column("schema_version", T.IntegerType(), "Version of the event schema"),
    Column("air_temperature_c", T.DoubleType(), "Air temperature, degrees Celsius"),
    Column("air_humidity_pct", T.DoubleType(), "Relative air humidity, percent"),
    Column("soil_nitrogen_mg_kg", T.DoubleType(), "Soil nitrogen, mg per kg"),
    Column("soil_salinity_ds_m", T.DoubleType(), "Soil salinity (electrical conductivity), dS/m"),
    Column("battery_v", T.DoubleType(), "Device battery voltage, volts"),
)
EVENT_FIELD_NAMES: tuple[str, ...] = tuple(c.name for c in EVENT_FIELDS)
CORRUPT = "_corrupt_record"

KAFKA_COLUMNS: tuple[Column, ...] = (
    Column("kafka_topic", T.StringType(), "Kafka topic the message came from"),
    Column("kafka_partition", T.IntegerType(), "Kafka partition"),
    Column("kafka_offset", T.LongType(), "Kafka offset within the partition"),
    Column("kafka_timestamp", T.TimestampType(), "Kafka message timestamp"),
)
INGEST_COLUMNS: tuple[Column, ...] = (
    Column("ingest_time", T.TimestampType(), "When the streaming job wrote the row"),
    Column("ingest_batch_id", T.LongType(), "Structured Streaming micro-batch id"),
)

_EVENT_TIME = Column("event_time", T.TimestampType(), "Measurement time, UTC", False)
_KEYS = {"event_id", "device_id", "parcel_id", "seq", "schema_version"}

READINGS_COLUMNS: tuple[Column, ...] = (
    *(
        Column(c.name, c.type, c.comment, c.name not in _KEYS) if c.name != "event_time" else _EVENT_TIME
        for c in EVENT_FIELDS
    ),
    Column("event_date", T.DateType(), "UTC date of event_time (partition column)", False),
    *KAFKA_COLUMNS,
    *INGEST_COLUMNS,
    Column("warnings", T.ArrayType(T.StringType()), "Rules with action 'warn' this row failed"),
)

DEVICE_STATE_COLUMNS: tuple[Column, ...] = tuple(
    c for c in READINGS_COLUMNS if c.name not in ("event_date", "ingest_batch_id", "warnings")
)

QUARANTINE_COLUMNS: tuple[Column, ...] = (
    Column("raw_key", T.BinaryType(), "Kafka message key, as received"),
    Column("raw_value", T.BinaryType(), "Kafka message value, as received"),
    Column("value_text", T.StringType(), "The value decoded as UTF-8, when it is valid UTF-8"),
    Column("reason", T.StringType(), "The first reason code, e.g. missing_field:device_id"),
    Column("reasons", T.ArrayType(T.StringType()), "Every rule the record failed"),
    *KAFKA_COLUMNS,
    *INGEST_COLUMNS,
    Column("ingest_date", T.DateType(), "UTC date of ingest_time (partition column)", False),
)


def typed_event_schema(extra: tuple[Column, ...] = ()) -> T.StructType:
    """from_json schema with real types; a type mismatch nulls the field and fills the corrupt column."""
    fields = [T.StructField(c.name, c.type) for c in (*EVENT_FIELDS, *extra)]
    return T.StructType([*fields, T.StructField(CORRUPT, T.StringType())])


def text_event_schema(extra: tuple[Column, ...] = ()) -> T.StructType:
    """from_json schema with every field as text: tells a missing field from a mistyped one."""
    fields = [T.StructField(c.name, T.StringType()) for c in (*EVENT_FIELDS, *extra)]
    return T.StructType(fields)
