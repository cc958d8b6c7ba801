"""`iotlake delete-device` while `iotlake ingest` keeps committing: the purge lands between the stream's commits.

The stream runs for real (long-running mode, a 1-second trigger, its own process and JVM) and a background
sensor-sim keeps feeding it, so readings, device_state and quarantine get a commit every few seconds while the purge
runs in a second JVM: the tests' shared session, through the TableOps that `iotlake delete-device` runs (its CLI is
tested in test_table_ops). On every table the commit before the DELETE and the one after it are the stream's, so the
purge met a live writer on both sides; whether a stream commit also lands inside the purge's few seconds is chance,
so the lost-race retries are tested deterministically in tests/unit/test_ops_delete.py instead. The purged device
only sent messages before the purge (the background producer leaves it out), so the check is exact at the DELETE's
own commit (the device is gone there, and every other row of the version before it is still there) and after the
stream's next commit (which brings none of the device back).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from stack import proc
from streaming.core.config import Settings
from streaming.core.storage import delta_rs_uri
from streaming.lake.ops import TableOps
from tests.helpers import wait_for
from tests.integration.lake import committed_offsets_sum, reader_options, simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DEVICES = 40
TARGET = "dev-00040"  # sensor-sim's last device: `--devices 39` leaves it out
TABLES = ("readings", "device_state", "quarantine")
# What identifies a row of each table, to compare the rows of other devices before and after the DELETE.
IDENTITY = {
    "readings": ("event_id", "event_time"),
    "device_state": ("device_id", "event_id"),
    "quarantine": ("kafka_partition", "kafka_offset"),
}


def payload_device(value_text: str | None) -> Any:
    try:
        data = json.loads(value_text or "")
    except ValueError:
        return None
    return data.get("device_id") if isinstance(data, dict) else None


def is_target(table: str, row: dict[str, Any]) -> bool:
    if table != "quarantine":
        return row["device_id"] == TARGET
    return row["raw_key"] == TARGET.encode() or payload_device(row["value_text"]) == TARGET


def rows_at(settings: Settings, secrets: dict[str, str], table: str, version: int) -> list[dict[str, Any]]:
    uri = delta_rs_uri(settings.storage.table_uri(table))
    return (
        DeltaTable(uri, version=version, storage_options=reader_options(settings, secrets))
        .to_pyarrow_table()
        .to_pylist()
    )


def history(settings: Settings, secrets: dict[str, str], table: str) -> list[dict[str, Any]]:
    uri = delta_rs_uri(settings.storage.table_uri(table))
    return DeltaTable(uri, storage_options=reader_options(settings, secrets)).history()


def is_stream_commit(commit: dict[str, Any]) -> bool:
    """A commit of `iotlake ingest` (the CLI's own commits carry an `iotlake ...` userMetadata)."""
    return commit["operation"] in ("MERGE", "WRITE") and "iotlake" not in (commit.get("userMetadata") or "")


def stop(job: subprocess.Popen[bytes]) -> None:
    if job.poll() is None:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=10)


def test_delete_device_while_the_stream_commits(
    spark: SparkSession,
    test_env: dict[str, str],
    settings: Settings,
    stack_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    first = simulate(settings, tmp_path, "--malformed-rate", "0.05", count=4_000, seed=11)
    assert TARGET in first["latest_by_device"]
    location = Path(test_env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])
    env = {**test_env, "IOTLAKE_INGEST__TRIGGER_INTERVAL": "1 second", "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": "2000"}
    logs = {name: tmp_path / f"{name}.log" for name in ("ingest", "producer")}
    handles = {name: path.open("w") for name, path in logs.items()}
    jobs: dict[str, subprocess.Popen[bytes]] = {}

    def alive() -> None:
        for name, job in jobs.items():
            assert job.poll() is None, f"{name} exited {job.returncode}\n{proc.tail(logs[name], 60)}"

    def waited(predicate: Callable[[], bool], timeout: float, message: str) -> None:
        """wait_for, with the stream's log when the deadline passes (a loaded machine makes batches slow)."""
        try:
            wait_for(predicate, timeout=timeout, interval=1.0, message=message)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- ingest.log\n{proc.tail(logs['ingest'], 40)}") from e

    try:
        jobs["ingest"] = subprocess.Popen(
            [sys.executable, "-m", "streaming.cli", "ingest"],
            env=env,
            stdout=handles["ingest"],
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def caught_up() -> bool:
            alive()
            return committed_offsets_sum(location, settings.kafka.topic) >= first["sent_total"]

        waited(caught_up, 900, "the stream to ingest the first run")
        versions_before = {t: history(settings, stack_secrets, t)[0]["version"] for t in TABLES}

        # From now on the other 39 devices keep sending (5% malformed), the purged one never again.
        producer = [
            sys.executable, "-m", "producers", "--bootstrap-servers", settings.kafka.bootstrap_servers,
            "--topic", settings.kafka.topic, "--devices", str(DEVICES - 1), "--parcels", "5", "--rate", "150",
            "--duration", "900", "--seed", "12", "--malformed-rate", "0.05", "--quiet",
        ]  # fmt: skip
        jobs["producer"] = subprocess.Popen(
            producer, env=env, stdout=handles["producer"], stderr=subprocess.STDOUT, start_new_session=True
        )

        def stream_commits_again() -> bool:
            alive()
            return all(history(settings, stack_secrets, t)[0]["version"] > versions_before[t] for t in TABLES)

        waited(stream_commits_again, 600, "a stream commit to every table")

        report = TableOps(spark, settings).delete_device(TARGET).as_dict()
        alive()
        deleted_at = {t["table"]: t["commit_version"] for t in report["tables"]}
        assert all(deleted_at.get(t) is not None for t in TABLES), report

        def stream_commits_after_the_purge() -> bool:
            alive()
            return all(history(settings, stack_secrets, t)[0]["version"] > deleted_at[t] for t in TABLES)

        waited(stream_commits_after_the_purge, 600, "a stream commit to every table after the purge")
    finally:
        for job in jobs.values():
            stop(job)
        for handle in handles.values():
            handle.close()
    assert jobs["ingest"].returncode == 0, proc.tail(logs["ingest"], 60)
    tables = {t["table"]: t for t in report["tables"]}
    print("retries per table:", {name: t["retries"] for name, t in tables.items()})

    for name in TABLES:
        deletion = tables[name]
        version = deletion["commit_version"]
        commits = {h["version"]: h for h in history(settings, stack_secrets, name)}
        # The stream committed to the table right before the DELETE and right after it.
        assert is_stream_commit(commits[version - 1]) and is_stream_commit(commits[version + 1]), (
            name,
            commits[version - 1],
            commits[version + 1],
        )
        # At the DELETE's commit the device is gone, and nothing else went with it.
        before, after = (
            rows_at(settings, stack_secrets, name, version - 1),
            rows_at(settings, stack_secrets, name, version),
        )
        assert not any(is_target(name, r) for r in after), name
        purged = [r for r in before if is_target(name, r)]
        assert deletion["rows_deleted"] == len(purged) > 0, name

        def others(rows: list[dict[str, Any]], table: str = name) -> list[tuple[Any, ...]]:
            return sorted(tuple(r[k] for k in IDENTITY[table]) for r in rows if not is_target(table, r))

        assert others(after) == others(before), f"{name}: rows of other devices changed"
        commit = commits[version]
        assert commit["operation"] == "DELETE" and TARGET in commit["userMetadata"], commit
        # Nothing of the device came back after the purge either (it sent nothing more), nor with the stream's commits.
        assert deletion["rows_remaining"] == 0, (name, deletion)
        latest = max(commits)
        assert not any(is_target(name, r) for r in rows_at(settings, stack_secrets, name, latest)), (name, latest)
