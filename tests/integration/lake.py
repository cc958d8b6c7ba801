"""Helpers for pipeline tests: run the real CLIs, read the real tables with the read-only key."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from producers.cli import main as sensor_sim
from producers.faults import REASON_BY_KIND
from stack import secrets as stack_secrets
from streaming.core.config import Settings, load_settings
from streaming.core.preflight import minio_client
from streaming.core.storage import delta_rs_uri, delta_storage_options
from streaming.lake.status import committed_offsets
from streaming.pipeline.faults import CRASH_ENV, Faults
from streaming.pipeline.ingest import BatchReport, run
from tests.helpers import wait_for


def simulate(settings: Settings, out: Path, *flags: str, count: int = 20_000, seed: int = 7) -> dict[str, Any]:
    """Run sensor-sim against the test topic; its summary JSON (exact counts of what was acknowledged)."""
    summary = out / f"summary-{seed}.json"
    start = datetime.now(UTC) - timedelta(minutes=30)
    argv = [
        "--bootstrap-servers",
        settings.kafka.bootstrap_servers,
        "--topic",
        settings.kafka.topic,
        "--count",
        str(count),
        "--rate",
        "0",
        "--seed",
        str(seed),
        "--devices",
        "40",
        "--parcels",
        "5",
        "--start-time",
        start.isoformat(),
        "--time-step-ms",
        "10",
        "--summary-json",
        str(summary),
        "--quiet",
        *flags,
    ]
    code = sensor_sim(argv)
    assert code == 0, f"sensor-sim exited {code}"
    return json.loads(summary.read_text())


def combine_summaries(*runs: dict[str, Any]) -> dict[str, Any]:
    """What several simulator runs into one topic sent, as one summary for assert_tables_match."""
    combined: dict[str, Any] = {
        "valid_distinct": sum(r["valid_distinct"] for r in runs),
        "malformed_total": sum(r["malformed_total"] for r in runs),
        "malformed_by_kind": dict(sum((Counter(r["malformed_by_kind"]) for r in runs), Counter())),
        "latest_by_device": {},
    }
    latest = combined["latest_by_device"]
    for one in runs:
        for device, newest in one["latest_by_device"].items():
            held = latest.get(device)
            if held is None or (newest["event_time"], newest["seq"]) > (held["event_time"], held["seq"]):
                latest[device] = newest
    return combined


def trigger_cap(settings: Settings, messages: int, batches: int) -> str:
    """The maxOffsetsPerTrigger that reads `messages` in exactly `batches` batches.

    Spark splits the cap over the partitions by their backlog and floors each share, so a batch can read up to one
    message per partition less than the cap: an exact multiple (6,000 at 2,000) leaves a few for one batch more.
    """
    return str(-(-messages // batches) + settings.kafka.partitions)


def batch_ids(checkpoint: Path, folder: str = "commits") -> list[int]:
    """The batch ids in a local checkpoint's folder, in order (commits: committed; offsets: planned)."""
    return sorted(int(p.name) for p in (checkpoint / folder).glob("*") if p.name.isdigit())


def committed_offsets_sum(checkpoint: Path, topic: str) -> int:
    """The sum of the Kafka offsets the last committed batch covers (0 before the first)."""
    committed = batch_ids(checkpoint)
    if not committed:
        return 0
    return sum(committed_offsets((checkpoint / "offsets" / str(committed[-1])).read_text(), topic).values())


def ingest(spark: SparkSession, env: Mapping[str, str]) -> list[BatchReport]:
    """`iotlake ingest --available-now` in this process on the tests' shared session (no JVM start, a warm JIT).

    The settings and the test hooks come from `env`, as for run_ingest; a refusal raises its IotLakeError.
    A crash hook would kill the test run itself: those tests use run_ingest.
    """
    assert not env.get(CRASH_ENV), f"{CRASH_ENV} kills this process: run the job with run_ingest"
    return run(load_settings(env=env), available_now=True, faults=Faults.from_env(env), spark=spark)


def run_ingest(env: Mapping[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`iotlake ingest --available-now` as its own process (its own JVM), the way a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "streaming.cli", "ingest", "--available-now", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_ingest(env: Mapping[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    """`iotlake ingest` in the background, in its own process group (its JVM joins it: stop_job reaches both)."""
    with log.open("ab") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "streaming.cli", "ingest", *args],
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_for_first_batch(job: subprocess.Popen[bytes], checkpoint: Path, log: Path, timeout: float = 300) -> None:
    """Wait until a job from start_ingest has committed batch 0; fail with the end of its log if it exits first."""
    wait_for(
        lambda: job.poll() is not None or (checkpoint / "commits" / "0").exists(),
        timeout,
        interval=0.5,
        message="the job's first batch",
    )
    assert job.poll() is None, log.read_text()[-3000:]


def stop_job(job: subprocess.Popen[bytes], timeout: float = 120) -> int:
    """SIGTERM the job (a clean stop), SIGKILL its whole group if it takes longer than `timeout`; its exit code."""
    if job.poll() is None:
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
    return job.returncode


def kill_job(job: subprocess.Popen[bytes]) -> None:
    """SIGKILL the job and its JVM at once, like a power cut."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)
    job.wait(30)


def reader_options(settings: Settings, secrets: Mapping[str, str]) -> dict[str, str]:
    """delta-rs options with the read-only key: what another engine would use."""
    return delta_storage_options(
        settings, secrets[stack_secrets.READER_ACCESS_KEY], secrets[stack_secrets.READER_SECRET_KEY]
    )


def read_table(settings: Settings, name: str, secrets: Mapping[str, str]) -> list[dict[str, Any]]:
    uri = delta_rs_uri(settings.storage.table_uri(name))
    table = DeltaTable(uri, storage_options=reader_options(settings, secrets))
    return table.to_pyarrow_table().to_pylist()


def table_version(settings: Settings, name: str, secrets: Mapping[str, str]) -> int:
    uri = delta_rs_uri(settings.storage.table_uri(name))
    return DeltaTable(uri, storage_options=reader_options(settings, secrets)).version()


def delta_log_commits(settings: Settings, name: str) -> list[list[dict[str, Any]]]:
    """The actions of each of a table's JSON commit files, oldest commit first."""
    s = settings.storage
    prefix = s.base_uri.removeprefix(f"s3a://{s.bucket}/").rstrip("/")
    client = minio_client(settings)
    objects = client.list_objects(s.bucket, prefix=f"{prefix}/{name}/_delta_log/")
    return [
        [json.loads(line) for line in client.get_object(s.bucket, obj.object_name).read().decode().splitlines()]
        for obj in sorted(objects, key=lambda o: o.object_name)
        if obj.object_name.endswith(".json")
    ]


def delta_log_actions(settings: Settings, name: str, kind: str) -> list[dict[str, Any]]:
    """Every action of one kind ('txn', 'commitInfo', ...) in a table's JSON commit files, in order."""
    return [action[kind] for commit in delta_log_commits(settings, name) for action in commit if kind in action]


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-6000:]}"


def assert_tables_match(settings: Settings, secrets: dict[str, str], summary: dict) -> None:
    """readings = distinct valid events, quarantine = malformed by kind, device_state = newest per device."""
    readings = read_table(settings, "readings", secrets)
    ids = [r["event_id"] for r in readings]
    assert len(ids) == summary["valid_distinct"]
    assert len(set(ids)) == len(ids), "duplicate event_id in readings"

    quarantine = read_table(settings, "quarantine", secrets)
    assert len(quarantine) == summary["malformed_total"]
    expected = Counter({REASON_BY_KIND[k]: n for k, n in summary["malformed_by_kind"].items() if n})
    assert Counter(q["reason"] for q in quarantine) == expected
    assert all(len(q["reasons"]) == 1 for q in quarantine), "each malformed kind must have one reason"

    assert device_state_differs(settings, secrets, summary) == []


def device_state_differs(settings: Settings, secrets: Mapping[str, str], summary: dict) -> list[str]:
    """The devices whose device_state row is missing, extra, or not the summary's newest event by (event_time, seq)."""
    state = {r["device_id"]: r for r in read_table(settings, "device_state", secrets)}
    latest = summary["latest_by_device"]
    differ = sorted(state.keys() ^ latest.keys())
    for device in sorted(state.keys() & latest.keys()):
        row, newest = state[device], latest[device]
        if (int(row["event_time"].timestamp() * 1000), row["seq"]) != (newest["event_time"], newest["seq"]):
            differ.append(device)
    return differ
