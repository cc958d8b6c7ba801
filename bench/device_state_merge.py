"""`python -m bench.device_state_merge`: what one device_state MERGE costs, alone, with nothing else in the batch.

On a private stack, a warm session runs the job's own upsert (`LakeTables.upsert_device_state`, with a transaction id
per MERGE) of one row per device, newer each round, into device_state tables that differ in one table property each:
as the job creates it, with the change data feed off, and with deletion vectors on. The tables take turns within each
round, so drift (JIT, background load) hits all alike. The first `--warm` rounds are not counted. Writes
bench/results/<date>-device-state-merge.json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from bench import report
from bench.stack import bench_stack
from streaming.core.config import Settings, load_settings
from streaming.core.session import build_session
from streaming.pipeline.schema import DEVICE_STATE_COLUMNS
from streaming.pipeline.tables import LakeTables, Txn

RESULTS = Path(__file__).resolve().parent / "results"
# Each arm: the table properties set after the job's own creation of the table (none: as the job creates it).
ARMS: dict[str, dict[str, str]] = {
    "as created": {},
    "change data feed off": {"delta.enableChangeDataFeed": "false"},
    "deletion vectors on": {"delta.enableDeletionVectors": "true"},
}


def device_rows(devices: int, round_: int) -> list[tuple[Any, ...]]:
    """One reading per device in device_state's column order, all newer than the round before (event_time and seq
    grow with the round)."""
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=round_)
    names = [c.name for c in DEVICE_STATE_COLUMNS]
    rows = []
    for d in range(devices):
        values = {
            "event_id": f"r{round_}-d{d}",
            "device_id": f"dev-{d:05d}",
            "parcel_id": f"parcel-{d % 20}",
            "seq": round_,
            "event_time": at,
            "schema_version": 1,
            "air_temperature_c": 20.0,
            "air_humidity_pct": 50.0,
            "soil_nitrogen_mg_kg": 100.0,
            "soil_salinity_ds_m": 1.0,
            "battery_v": 3.7,
            "kafka_topic": "bench",
            "kafka_partition": d % 6,
            "kafka_offset": round_ * devices + d,
            "kafka_timestamp": at,
            "ingest_time": at,
        }
        rows.append(tuple(values[n] for n in names))  # a KeyError names a column added to the table and not here
    return rows


def source(spark: SparkSession, devices: int, round_: int) -> DataFrame:
    schema = T.StructType([T.StructField(c.name, c.type, c.nullable) for c in DEVICE_STATE_COLUMNS])
    return spark.createDataFrame(device_rows(devices, round_), schema)


def summarize(seconds: Mapping[str, Sequence[float]], warm: int) -> dict[str, Any]:
    """Per arm: the median and spread of the counted MERGEs (after the first `warm`), and its ratio to the first arm."""
    arms: dict[str, Any] = {}
    first: float | None = None
    for arm, times in seconds.items():
        counted = list(times[warm:])
        if not counted:
            raise ValueError(f"{arm}: no MERGE after the {warm} warm-up rounds")
        median = statistics.median(counted)
        first = median if first is None else first
        arms[arm] = {
            "median_s": round(median, 3),
            "min_s": round(min(counted), 3),
            "max_s": round(max(counted), 3),
            "merges": len(counted),
            "over_first": round(median / first, 2),
        }
    return arms


def render(result: Mapping[str, Any]) -> str:
    lines = [
        f"# One device_state MERGE alone, {result['date']}",
        "",
        f"{report.run_line(result)} {result['devices']} devices a MERGE, {result['rounds']} rounds, the first "
        f"{result['warm']} not counted; the tables take turns within each round.",
        "",
        "| table | median | min-max | MERGEs | over the first row |",
        "|---|---|---|---|---|",
        *(
            f"| {arm} | {a['median_s']} s | {a['min_s']}-{a['max_s']} s | {a['merges']} | {a['over_first']} |"
            for arm, a in result["arms"].items()
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.device_state_merge", description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=200, help="rows a MERGE, one per device (default 200)")
    p.add_argument("--rounds", type=int, default=24, help="MERGEs into each table (default 24)")
    p.add_argument("--warm", type=int, default=8, help="first rounds not counted (default 8)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    load = report.machine()["loadavg_at_start"]
    seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}
    with bench_stack(echo=None) as stack, tempfile.TemporaryDirectory(prefix="iotlake-ds-merge-") as work:

        def settings(name: str) -> Settings:
            return load_settings(env=stack.workload(name, Path(work), topic=False))

        arm_settings = {arm: settings(f"ds-merge-{i}") for i, arm in enumerate(ARMS)}
        spark = build_session(next(iter(arm_settings.values())), app_name="iotlake-ds-merge")
        try:
            tables: dict[str, LakeTables] = {}
            for arm, properties in ARMS.items():
                tables[arm] = LakeTables(spark, arm_settings[arm])
                tables[arm].ensure()
                for key, value in properties.items():
                    spark.sql(f"ALTER TABLE delta.`{tables[arm].device_state_uri}` SET TBLPROPERTIES ({key} = {value})")
            for round_ in range(args.rounds):
                for arm, lake in tables.items():
                    rows = source(spark, args.devices, round_)
                    began = time.monotonic()
                    lake.upsert_device_state(rows, Txn("bench-device-state", round_), evolve=False)
                    seconds[arm].append(time.monotonic() - began)
        finally:
            spark.stop()
    result = {
        **report.run_header("bench.device_state_merge", argv, load),
        "devices": args.devices,
        "rounds": args.rounds,
        "warm": args.warm,
        "arms": summarize(seconds, args.warm),
        "seconds": {arm: [round(s, 3) for s in times] for arm, times in seconds.items()},
    }
    report.write_text_report(result, render(result).splitlines(), args.out, f"{result['date']}-device-state-merge")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
