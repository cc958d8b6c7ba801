"""`iotlake history|show|changes|restore|delete-device` on a lake built by the real pipeline.

One lake per module (two sensor-sim runs, each ingested by the job in this process) on the tests' one Spark
session, which the in-process CLI calls reuse (build_session's getOrCreate returns it). The tests run in file
order: restore and delete-device change the lake last.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
import uuid
from collections import Counter
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from confluent_kafka import Producer

from stack import ensure_topic
from streaming.cli import main as iotlake_main
from streaming.core.config import Settings, load_settings
from streaming.core.preflight import minio_client
from tests.integration.lake import ingest, read_table, reader_options, simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAULTS = ("--duplicate-rate", "0.05", "--malformed-rate", "0.05")


@dataclass
class Lake:
    env: dict[str, str]
    settings: Settings
    secrets: dict[str, str]
    round_one_version: int  # readings' version after the first ingest
    round_one_rows: int
    rows: int  # readings rows after both ingests


def iotlake(env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    """`iotlake ARGV` in this process (reusing the module's Spark session), stdin not a terminal."""
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, env, clear=True),
        mock.patch.object(sys, "stdin", io.StringIO()),
        redirect_stdout(out),
        redirect_stderr(err),
    ):
        code = iotlake_main(list(argv))
    return code, out.getvalue(), err.getvalue()


def iotlake_json(env: dict[str, str], *argv: str) -> Any:
    code, out, err = iotlake(env, *argv, "--json")
    assert code == 0, f"iotlake {' '.join(argv)} exited {code}\n{out}\n{err}"
    return json.loads(out)


@pytest.fixture(scope="module")
def lake(
    spark: Any, stack_env: dict[str, str], stack_secrets: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Lake:
    tmp = tmp_path_factory.mktemp("table-ops")
    base = {**os.environ, **stack_env}
    uid = uuid.uuid4().hex[:12]
    env = {
        **base,
        "IOTLAKE_STORAGE__BASE_URI": f"s3a://{load_settings(env=base).storage.bucket}/tests/{uid}",
        "IOTLAKE_KAFKA__TOPIC": f"test-ops-{uid}",
        "IOTLAKE_INGEST__CHECKPOINT_LOCATION": str(tmp / "checkpoint"),
        "IOTLAKE_INGEST__METRICS_PORT": "0",
    }
    settings = load_settings(env=env)
    ensure_topic(settings)
    versions: list[int] = []
    counts: list[int] = []
    for seed in (7, 8):
        simulate(settings, tmp, *FAULTS, count=3000, seed=seed)
        ingest(spark, env)
        from deltalake import DeltaTable

        from streaming.core.storage import delta_rs_uri, delta_storage_options

        table = DeltaTable(
            delta_rs_uri(settings.storage.table_uri("readings")), storage_options=delta_storage_options(settings)
        )
        versions.append(table.version())
        counts.append(len(read_table(settings, "readings", stack_secrets)))
    assert counts[1] > counts[0] > 0
    return Lake(env, settings, stack_secrets, versions[0], counts[0], counts[1])


def test_history_lists_every_merge_with_its_metrics(lake: Lake) -> None:
    entries = iotlake_json(lake.env, "history", "readings", "--limit", "0")
    versions = [e["version"] for e in entries]
    assert versions == sorted(versions, reverse=True) == list(range(versions[0], -1, -1))
    assert entries[-1]["operation"] == "CREATE TABLE"
    merges = [e for e in entries if e["operation"] == "MERGE"]
    assert len(merges) >= 2
    assert sum(e["metrics"].get("numTargetRowsInserted", 0) for e in merges) == lake.rows
    assert all(e["timestamp"] and "predicate" in e["parameters"] for e in merges)

    code, out, _ = iotlake(lake.env, "history", "readings", "--limit", "3")
    assert code == 0 and "MERGE" in out and "numTargetRowsInserted=" in out
    assert len(out.strip().splitlines()) == 2 + 1 + 3  # title, header, rule, three commits


def test_show_travels_in_time_by_version_and_by_timestamp(lake: Lake) -> None:
    then = iotlake_json(lake.env, "show", "readings", "--version", str(lake.round_one_version), "--limit", "5")
    assert then["row_count"] == lake.round_one_rows and len(then["rows"]) == 5
    assert "event_id" in then["columns"]
    newest = iotlake_json(lake.env, "history", "readings", "--limit", "1")[0]["version"]
    latest = iotlake_json(lake.env, "show", "readings", "--version", str(newest), "--limit", "0")
    assert latest["row_count"] == lake.rows
    assert iotlake_json(lake.env, "show", "readings", "--version", "0")["row_count"] == 0

    # The time of round one's last commit resolves to that version.
    at = iotlake_json(lake.env, "show", "readings", "--timestamp", then["commit_timestamp"], "--limit", "0")
    assert (at["version"], at["row_count"], at["rows"]) == (lake.round_one_version, lake.round_one_rows, [])

    # One device's rows only, through a typed filter.
    readings = read_table(lake.settings, "readings", lake.secrets)
    device = readings[0]["device_id"]
    own = iotlake_json(lake.env, "show", "readings", "--version", str(newest), "--device", device, "--limit", "100")
    expected = sum(1 for r in readings if r["device_id"] == device)
    assert own["row_count"] == expected > 0 and own["device"] == device
    assert len(own["rows"]) == min(100, expected)
    assert all(r[own["columns"].index("device_id")] == device for r in own["rows"])

    code, out, _ = iotlake(lake.env, "show", "readings", "--version", str(lake.round_one_version), "--limit", "2")
    assert code == 0 and f"{lake.round_one_rows} row(s)" in out and "(first 2 shown)" in out


def test_changes_returns_the_inserts_of_a_merge(lake: Lake) -> None:
    entries = iotlake_json(lake.env, "history", "readings", "--limit", "0")
    merge = next(e for e in entries if e["operation"] == "MERGE" and e["metrics"].get("numTargetRowsInserted"))
    inserted = merge["metrics"]["numTargetRowsInserted"]
    v = str(merge["version"])
    feed = iotlake_json(lake.env, "changes", "readings", "--from-version", v, "--to-version", v, "--limit", "10")
    assert feed["counts"] == {"insert": inserted}
    assert feed["columns"][:3] == ["_change_type", "_commit_version", "_commit_timestamp"]
    assert len(feed["rows"]) == min(10, inserted)
    assert all(r[0] == "insert" and r[1] == merge["version"] for r in feed["rows"])

    # From version 0 on, every row ever inserted shows up as an insert.
    everything = iotlake_json(lake.env, "changes", "readings", "--from-version", "0", "--limit", "0")
    assert everything["counts"].get("insert") == lake.rows and everything["rows"] == []


def test_bad_input_exits_2_with_a_clear_message(lake: Lake) -> None:
    cases = [
        (["history", "sensors"], "Unknown table 'sensors'. The lake's tables are: readings, device_state, quarantine"),
        (["show", "readings", "--version", "999"], "readings has no version 999: its newest version is"),
        (["show", "readings", "--timestamp", "yesterday-ish"], "--timestamp 'yesterday-ish' is not a time"),
        (["show", "readings", "--timestamp", "2001-01-01T00:00:00Z"], "readings did not exist yet at 2001-01-01"),
        (["changes", "readings", "--from-version", "999"], "readings has no version 999"),
        (["restore", "readings", "--version", "1"], "stdin is not a terminal"),
        (["delete-device", "dev-0001"], "Add --yes to confirm"),
    ]
    for argv, message in cases:
        code, out, err = iotlake(lake.env, *argv)
        assert code == 2, (argv, out, err)
        assert message in err and "Traceback" not in err, (argv, err)
    # Refusals changed nothing.
    assert len(read_table(lake.settings, "readings", lake.secrets)) == lake.rows

    empty = {**lake.env, "IOTLAKE_STORAGE__BASE_URI": lake.env["IOTLAKE_STORAGE__BASE_URI"] + "-none"}
    code, _, err = iotlake(empty, "history", "readings")
    assert code == 2 and "does not exist yet" in err and "iotlake ingest" in err


def test_restore_brings_back_the_old_rows_and_is_in_history(lake: Lake) -> None:
    result = iotlake_json(lake.env, "restore", "readings", "--version", str(lake.round_one_version), "--yes")
    assert result["restored_version"] == lake.round_one_version
    assert result["rows_after"] == lake.round_one_rows
    assert len(read_table(lake.settings, "readings", lake.secrets)) == lake.round_one_rows
    newest = iotlake_json(lake.env, "history", "readings", "--limit", "1")[0]
    assert newest["operation"] == "RESTORE" and newest["version"] == result["new_version"]
    assert newest["parameters"]["version"] == str(lake.round_one_version)


def _commit_actions(settings: Settings, table: str, version: int, kind: str) -> list[dict[str, Any]]:
    s = settings.storage
    prefix = s.base_uri.removeprefix(f"s3a://{s.bucket}/").rstrip("/")
    body = minio_client(settings).get_object(s.bucket, f"{prefix}/{table}/_delta_log/{version:020d}.json").read()
    return [a[kind] for a in map(json.loads, body.decode().splitlines()) if kind in a]


def payload_device(value_text: str | None) -> Any:
    """The top-level device_id of a quarantined JSON payload (None when it isn't a JSON object)."""
    try:
        data = json.loads(value_text or "")
    except ValueError:
        return None
    return data.get("device_id") if isinstance(data, dict) else None


def of_device(row: dict[str, Any], device: str) -> bool:
    """A quarantine row of the device: its Kafka key, or its payload's device_id."""
    return row["raw_key"] == device.encode() or payload_device(row["value_text"]) == device


def test_delete_device_purges_every_table_and_reports_what_vacuum_needs(lake: Lake) -> None:
    quarantine = read_table(lake.settings, "quarantine", lake.secrets)
    key, _ = Counter(q["raw_key"] for q in quarantine).most_common(1)[0]
    device = key.decode()
    before = {
        "readings": sum(r["device_id"] == device for r in read_table(lake.settings, "readings", lake.secrets)),
        "device_state": sum(r["device_id"] == device for r in read_table(lake.settings, "device_state", lake.secrets)),
        "quarantine": sum(of_device(q, device) for q in quarantine),
    }
    assert before["readings"] > 0 and before["device_state"] == 1 and before["quarantine"] > 0

    report = iotlake_json(lake.env, "delete-device", device, "--yes")
    tables = {t["table"]: t for t in report["tables"]}
    assert {name: t["rows_deleted"] for name, t in tables.items()} == before
    assert report["rows_deleted"] == sum(before.values())
    assert tables["quarantine"]["matched_on"] == "raw_key or value_text $.device_id"
    assert tables["readings"]["matched_on"] == "device_id"
    # No other writer: no conflict to retry, nothing of the device left behind.
    assert report["retries"] == 0 and all(t["retries"] == 0 and t["rows_remaining"] == 0 for t in tables.values())
    # readings is partitioned by event_date: the DELETE read only the device's dates (all of them here).
    assert tables["readings"]["partitions"] is not None and tables["readings"]["partitions"] >= 1
    assert tables["device_state"]["partitions"] is None  # unpartitioned: the whole (small) table

    # Gone from every table's current version.
    assert not any(r["device_id"] == device for r in read_table(lake.settings, "readings", lake.secrets))
    assert not any(r["device_id"] == device for r in read_table(lake.settings, "device_state", lake.secrets))
    assert not any(of_device(q, device) for q in read_table(lake.settings, "quarantine", lake.secrets))

    # The report's files and bytes are those of the DELETE commit, and VACUUM's horizon is 7 days later.
    for name, t in tables.items():
        removed = _commit_actions(lake.settings, name, t["commit_version"], "remove")
        assert t["files_removed"] == len(removed) > 0, name
        assert t["bytes_removed"] == sum(r["size"] for r in removed), name
        info = _commit_actions(lake.settings, name, t["commit_version"], "commitInfo")[0]
        assert info["operation"] == "DELETE"
        committed = datetime.fromisoformat(t["commit_timestamp"])
        assert datetime.fromisoformat(t["vacuum_eligible_at"]) == (committed + timedelta(days=7)).replace(microsecond=0)
        assert t["deleted_file_retention"] == "interval 7 days"
    assert report["vacuum_eligible_at"] == max(t["vacuum_eligible_at"] for t in tables.values())
    assert datetime.fromisoformat(report["vacuum_eligible_at"]) > datetime.now(UTC) + timedelta(days=6)

    # Deleting it again finds nothing and commits nothing.
    again = iotlake_json(lake.env, "delete-device", device, "--yes")
    assert again["rows_deleted"] == 0 and all(t["commit_version"] is None for t in again["tables"])


def devices_at(lake: Lake, table: str, version: int | None = None) -> set[str]:
    from deltalake import DeltaTable

    from streaming.core.storage import delta_rs_uri

    uri = delta_rs_uri(lake.settings.storage.table_uri(table))
    delta = DeltaTable(uri, version=version, storage_options=reader_options(lake.settings, lake.secrets))
    return set(delta.to_pyarrow_table(columns=["device_id"]).column("device_id").to_pylist())


def test_restore_to_before_a_purge_names_the_device_and_needs_yes(lake: Lake) -> None:
    entries = iotlake_json(lake.env, "history", "readings", "--limit", "0")
    purge = next(e for e in entries if e["operation"] == "DELETE")
    before = purge["version"] - 1
    (device,) = devices_at(lake, "readings", before) - devices_at(lake, "readings", purge["version"])

    code, out, err = iotlake(lake.env, "restore", "readings", "--version", str(before))
    assert code == 2, (out, err)
    assert f"'{device}'" in err and f"version {purge['version']}" in err and "delete-device" in err, err
    assert "Add --yes" in err and "Traceback" not in err
    assert iotlake_json(lake.env, "history", "readings", "--limit", "1")[0]["version"] == entries[0]["version"]

    code, out, err = iotlake(lake.env, "restore", "readings", "--version", str(before), "--yes", "--json")
    assert code == 0, (out, err)
    assert f"'{device}'" in err and "brings back" in err  # --yes doesn't ask, but still warns
    result = json.loads(out)
    assert [(p["device_id"], p["version"]) for p in result["purges_undone"]] == [(device, purge["version"])]
    assert device in devices_at(lake, "readings")  # the warning was true: the device is back


def test_delete_device_matches_the_payloads_device_id_in_quarantine(spark: Any, lake: Lake) -> None:
    """A quarantined message of the device is purged whether the device is in its key or in its payload."""
    quarantine = read_table(lake.settings, "quarantine", lake.secrets)
    key, _ = Counter(q["raw_key"] for q in quarantine).most_common(1)[0]
    device, other = key.decode(), "dev-not-purged"
    tag = uuid.uuid4().hex[:8]

    def too_hot(device_id: str, n: int) -> bytes:  # quarantined by out_of_range:air_temperature_c
        event = {
            "schema_version": 1,
            "event_id": f"crafted-{tag}-{n}",
            "device_id": device_id,
            "parcel_id": "parcel-001",
            "seq": 1,
            "event_time": int(time.time() * 1000),
            "air_temperature_c": 500.0,
            "air_humidity_pct": 50.0,
            "soil_nitrogen_mg_kg": 10.0,
            "soil_salinity_ds_m": 1.0,
            "battery_v": 3.9,
        }
        return json.dumps(event).encode()

    crafted = {
        "payload of the device, another key": (b"relay-7", too_hot(device, 1), True),
        "payload of the device, no key": (None, too_hot(device, 2), True),
        "key of the device, another device's payload": (key, too_hot(other, 3), True),
        "another key and device": (b"relay-7", too_hot(other, 4), False),
        "not JSON, mentions the device": (b"relay-7", f'{{"device_id": "{device}"'.encode(), False),
    }
    producer = Producer({"bootstrap.servers": lake.settings.kafka.bootstrap_servers, "enable.idempotence": True})
    for message_key, value, _ in crafted.values():
        producer.produce(lake.settings.kafka.topic, key=message_key, value=value)
    assert producer.flush(30) == 0
    ingest(spark, lake.env)

    quarantine = read_table(lake.settings, "quarantine", lake.secrets)
    by_value = {q["raw_value"]: q for q in quarantine}
    assert all(value in by_value for _, value, _ in crafted.values()), "a crafted message was not quarantined"
    expected = [q for q in quarantine if of_device(q, device)]

    report = iotlake_json(lake.env, "delete-device", device, "--yes")
    tables = {t["table"]: t for t in report["tables"]}
    assert tables["quarantine"]["rows_deleted"] == len(expected)
    left = {q["raw_value"] for q in read_table(lake.settings, "quarantine", lake.secrets)}
    for what, (_, value, purged) in crafted.items():
        assert (value not in left) is purged, what
    assert not any(of_device(q, device) for q in read_table(lake.settings, "quarantine", lake.secrets))


def test_delete_device_of_an_unknown_device_changes_nothing(lake: Lake) -> None:
    code, out, err = iotlake(lake.env, "delete-device", "no-such-device", "--yes")
    assert code == 0, err
    assert "deleted device 'no-such-device': 0 row(s)" in out and "readings" in out
