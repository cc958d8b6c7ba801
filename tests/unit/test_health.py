"""Table health arithmetic, the sidecar's decisions and its metrics, from a synthetic Delta log."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

from streaming.core.catalog import TABLE_KEYS
from streaming.core.config import PROJECT_ROOT, MaintenanceConfig, Settings, load_settings
from streaming.core.errors import ConfigError, VacuumRefusedError, is_conflict
from streaming.lake.health import (
    UNPARTITIONED,
    Commit,
    DataFile,
    PartitionHealth,
    StoredObject,
    StreamProgress,
    check_vacuum_retention,
    churn,
    is_closed,
    partition_health,
    plan_compaction,
    reclaimable,
    table_health,
    vacuum_could_delete,
    vacuum_due,
)
from streaming.lake.lakelog import commits_since, list_objects, read_table
from streaming.lake.maintenance import (
    AUTOGROUP,
    Backoff,
    Maintainer,
    group_niceness,
    manual_tasks,
    partition_predicate,
)
from streaming.lake.metrics import MaintenanceMetrics
from streaming.pipeline.tables import LakeTables
from streaming.pipeline.warmup import scratch_settings

pytestmark = pytest.mark.unit

MiB = 2**20
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
CFG = MaintenanceConfig(min_small_files=10, min_small_file_ratio=0.5, open_partition_min_small_files=50)


def _file(partition: str, size: int, rows: int = 10, path: str | None = None) -> DataFile:
    return DataFile(path or f"{partition}/f-{size}-{rows}.parquet", partition, size, rows, NOW_MS)


# --- arithmetic ---


def test_partition_health_counts_small_files_bytes_and_rows_per_partition() -> None:
    files = [_file("d=2026-11-28", 1 * MiB, path=f"a{i}") for i in range(3)] + [
        _file("d=2026-11-28", 64 * MiB, rows=1000, path="big"),
        _file("d=2026-11-29", 2 * MiB, path="b"),
    ]
    parts = partition_health(files, small_file_bytes=32 * MiB)
    assert parts == (
        PartitionHealth("d=2026-11-28", files=4, small_files=3, bytes=67 * MiB, rows=1030),
        PartitionHealth("d=2026-11-29", files=1, small_files=1, bytes=2 * MiB, rows=10),
    )
    assert parts[0].small_file_ratio == 0.75


def test_churn_reads_each_operations_own_metric_names() -> None:
    commits = [
        Commit(1, 0, "WRITE", {"numFiles": 4, "numOutputBytes": 400, "numOutputRows": 40}),
        Commit(
            2,
            0,
            "MERGE",
            {
                "numTargetFilesAdded": 2,
                "numTargetFilesRemoved": 1,
                "numTargetBytesAdded": 200,
                "numTargetBytesRemoved": 100,
                "numTargetRowsInserted": 7,
                "numTargetRowsUpdated": 3,
                "numTargetRowsDeleted": 0,
                "numOutputRows": 10,
            },
        ),
        Commit(
            3, 0, "OPTIMIZE", {"numAddedFiles": 1, "numRemovedFiles": 6, "numAddedBytes": 500, "numRemovedBytes": 600}
        ),
        Commit(4, 0, "DELETE", {"numAddedFiles": 1, "numRemovedFiles": 1, "numDeletedRows": 5}),
    ]
    c = churn(commits)
    assert (c.commits, c.files_added, c.files_removed) == (4, 4 + 2 + 1 + 1, 1 + 6 + 1)
    assert (c.bytes_added, c.bytes_removed) == (400 + 200 + 500, 100 + 600)
    # OPTIMIZE's rows are a rewrite, and MERGE's numOutputRows is not an insert count.
    assert (c.rows_inserted, c.rows_updated, c.rows_deleted) == (40 + 7, 3, 5)


def test_reclaimable_sizes_vacuums_dry_run_from_the_listing() -> None:
    objects = [
        StoredObject("p/live.parquet", 100, NOW_MS),
        StoredObject("p/old.parquet", 200, NOW_MS),
        StoredObject("p/orphan.parquet", 400, NOW_MS),
    ]
    assert reclaimable(objects, ["p/old.parquet", "p/orphan.parquet", "p/old.parquet"]) == (2, 600)
    assert reclaimable(objects, []) == (0, 0)


def test_table_health_summary_and_skew() -> None:
    files = [_file("d=2026-11-28", 10 * MiB, path="x1"), _file("d=2026-11-29", 10 * MiB, path="x2")] + [
        _file("d=2026-11-30", 10 * MiB, path=f"y{i}") for i in range(4)
    ]
    commits = [
        Commit(5, NOW_MS - 10_000, "MERGE"),
        Commit(4, NOW_MS - 3_600_000, "OPTIMIZE"),
        Commit(3, NOW_MS - 7_200_000, "VACUUM END"),
    ]
    objects = [StoredObject("_delta_log/00000000000000000004.checkpoint.parquet", 1, NOW_MS - 60_000)]
    h = table_health(
        "readings", 5, files, commits, objects, vacuumable=(), small_file_bytes=32 * MiB, interval_s=300, now_ms=NOW_MS
    )
    assert (h.files, h.small_files, h.bytes, h.rows) == (6, 6, 60 * MiB, 60)
    assert h.avg_file_bytes == 10 * MiB
    assert h.partition_skew == 40 / 10  # largest 40 MiB, median 10 MiB
    assert (h.last_commit_ms, h.last_optimize_ms, h.last_vacuum_ms) == (
        NOW_MS - 10_000,
        NOW_MS - 3_600_000,
        NOW_MS - 7_200_000,
    )
    assert h.checkpoint_ms == NOW_MS - 60_000
    assert h.commits_last_interval == 1


# --- decisions ---


@pytest.mark.parametrize(
    ("partition", "now", "closed"),
    [
        ("event_date=2026-11-29", datetime(2026, 11, 30, 0, 30, tzinfo=UTC), False),  # ended 30 min ago < 1 h
        ("event_date=2026-11-29", datetime(2026, 11, 30, 1, 30, tzinfo=UTC), True),
        ("event_date=2026-11-30", NOW, False),  # today
        (UNPARTITIONED, NOW, False),  # unpartitioned: the stream writes it
        ("region=north", NOW, False),  # not a date
    ],
)
def test_a_partition_closes_an_hour_after_its_day(partition: str, now: datetime, closed: bool) -> None:
    assert is_closed(partition, now, close_after_s=3600) is closed


def test_plan_compacts_closed_partitions_over_the_bar_first_and_the_open_one_only_over_the_high_bar() -> None:
    partitions = [
        PartitionHealth("d=2026-11-27", files=12, small_files=10, bytes=1, rows=1),  # closed, at the bar
        PartitionHealth("d=2026-11-28", files=30, small_files=25, bytes=1, rows=1),  # closed, worst
        PartitionHealth("d=2026-11-26", files=9, small_files=9, bytes=1, rows=1),  # closed, under the count bar
        PartitionHealth("d=2026-11-25", files=100, small_files=20, bytes=1, rows=1),  # closed, ratio 0.2 < 0.5
        PartitionHealth("d=2026-11-30", files=40, small_files=40, bytes=1, rows=1),  # open, under 50
    ]
    tasks = plan_compaction(partitions, NOW, CFG)
    assert [t.partition for t in tasks] == ["d=2026-11-28", "d=2026-11-27"]
    assert all(t.closed for t in tasks)
    assert "25 small files" in tasks[0].reason

    busy_open = [*partitions, PartitionHealth("d=2026-11-30", files=60, small_files=55, bytes=1, rows=1)]
    tasks = plan_compaction(busy_open, NOW, CFG)
    assert [t.partition for t in tasks][-1] == "d=2026-11-30"  # the open one last
    assert not tasks[-1].closed and "open partition" in tasks[-1].reason


def test_manual_optimize_takes_every_partition_with_two_small_files_or_the_one_asked_for() -> None:
    h = table_health(
        "readings",
        1,
        [_file("d=2026-11-29", 1, path="a"), _file("d=2026-11-29", 1, path="b"), _file("d=2026-11-30", 1, path="c")],
        [],
        [],
        vacuumable=(),
        small_file_bytes=32 * MiB,
        interval_s=1,
        now_ms=NOW_MS,
    )
    assert [t.partition for t in manual_tasks(h, None)] == ["d=2026-11-29"]
    assert manual_tasks(h, datetime(2026, 11, 30).date()) == []  # one file: nothing to compact


def test_vacuum_is_due_after_the_interval_or_when_never_run() -> None:
    assert vacuum_due(None, NOW_MS, 86400)
    assert not vacuum_due(NOW_MS - 3600_000, NOW_MS, 86400)
    assert vacuum_due(NOW_MS - 86400_000, NOW_MS, 86400)


def test_vacuum_could_delete_only_under_a_table_with_an_object_older_than_the_retention() -> None:
    week = 7 * 86400
    assert not vacuum_could_delete(NOW_MS - 3600_000, NOW_MS, week)  # a table an hour old
    assert not vacuum_could_delete(NOW_MS - week * 1000, NOW_MS, week)  # exactly the retention: VACUUM keeps it
    assert vacuum_could_delete(NOW_MS - week * 1000 - 1, NOW_MS, week)
    assert vacuum_could_delete(None, NOW_MS, week)  # nothing listed: don't guess


def test_the_oldest_object_of_a_table_counts_its_log_and_stray_files() -> None:
    objects = [
        StoredObject("_delta_log/00000000000000000000.json", 10, NOW_MS - 5000),
        StoredObject("d=2026-11-30/part-0.parquet", 10, NOW_MS - 1000),
        StoredObject("stray.tmp", 10, NOW_MS - 9000),
    ]
    h = table_health("t", 0, [], [], objects, vacuumable=[], small_file_bytes=MiB, interval_s=1, now_ms=NOW_MS)
    assert h.oldest_object_ms == NOW_MS - 9000


def test_vacuum_below_the_tables_retention_is_refused_with_the_fix() -> None:
    with pytest.raises(VacuumRefusedError, match=r"below the table's deleted-file retention \(7 days\)"):
        check_vacuum_retention("readings", 3600, 7 * 86400, stream=None)
    check_vacuum_retention("readings", 7 * 86400, 7 * 86400, stream=None)  # at the retention: allowed


def test_vacuum_is_refused_only_while_the_stream_is_stalled_behind_for_the_retention() -> None:
    week = 7 * 86400
    with pytest.raises(VacuumRefusedError, match=r"5 messages behind the topic's end .* for 8 days"):
        check_vacuum_retention("readings", week, week, StreamProgress(behind=5, since_commit_s=8 * 86400))
    with pytest.raises(VacuumRefusedError, match="behind"):  # at the retention: refused, as before
        check_vacuum_retention("readings", week, week, StreamProgress(behind=1, since_commit_s=week))
    # Idle topic: caught up, last commit a month ago. Nothing to replay, so nothing to lose.
    check_vacuum_retention("readings", week, week, StreamProgress(behind=0, since_commit_s=30 * 86400))
    # Behind but committing: working through a backlog.
    check_vacuum_retention("readings", week, week, StreamProgress(behind=10**6, since_commit_s=60))
    # A longer retention than the stall: allowed.
    check_vacuum_retention("readings", 9 * 86400, week, StreamProgress(behind=5, since_commit_s=8 * 86400))
    assert StreamProgress(behind=0, since_commit_s=99.0).stalled_s == 0.0


def test_backoff_doubles_up_to_the_cap_and_resets_on_success() -> None:
    clock = [1000.0]
    b = Backoff(30, 100, clock=lambda: clock[0])
    assert [b.conflict("t"), b.conflict("t"), b.conflict("t"), b.conflict("t")] == [30, 60, 100, 100]
    assert b.waiting("t") == 100
    clock[0] += 40
    assert b.waiting("t") == 60 and b.waiting("other") == 0
    b.success("t")
    assert b.waiting("t") == 0 and b.conflict("t") == 30


def test_partition_predicate_is_built_from_a_parsed_date() -> None:
    assert partition_predicate("event_date=2026-11-29") == "`event_date` = DATE'2026-11-29'"
    with pytest.raises(ConfigError):
        partition_predicate("event_date=2026-11-29' OR 1=1 --")


def test_conflicts_are_told_apart_from_failures() -> None:
    class ConcurrentAppendException(Exception):  # the name delta.exceptions.captured gives it (needs a JVM)
        pass

    assert is_conflict(RuntimeError("io.delta.exceptions.ConcurrentAppendException: Files were added"))
    # what delta-spark really raises: its class, with Delta's error class in the message (the class name not)
    message = "[DELTA_CONCURRENT_APPEND.WITH_PARTITION_HINT] Transaction conflict detected. a concurrent OPTIMIZE"
    assert is_conflict(ConcurrentAppendException("Transaction conflict detected"))
    assert is_conflict(RuntimeError(message))
    assert not is_conflict(RuntimeError("java.io.FileNotFoundException: s3a://x"))


# --- a synthetic Delta log read back through delta-rs, then exported ---


def _write_log(root: Path) -> None:
    log = root / "_delta_log"
    log.mkdir(parents=True)
    schema = {
        "type": "struct",
        "fields": [
            {"name": "device_id", "type": "string", "nullable": True, "metadata": {}},
            {"name": "event_date", "type": "date", "nullable": True, "metadata": {}},
        ],
    }
    meta = {
        "id": "00000000-0000-0000-0000-000000000001",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(schema),
        "partitionColumns": ["event_date"],
        "configuration": {"delta.deletedFileRetentionDuration": "interval 7 days"},
        "createdTime": NOW_MS - 7_200_000,
    }

    def add(path: str, day: str, size: int, rows: int) -> dict:
        stats = json.dumps({"numRecords": rows, "minValues": {}, "maxValues": {}, "nullCount": {}})
        part = {"event_date": day}
        return {
            "add": {
                "path": path,
                "partitionValues": part,
                "size": size,
                "modificationTime": NOW_MS - 3_600_000,
                "dataChange": True,
                "stats": stats,
            }
        }

    def info(ts: int, op: str, metrics: dict) -> dict:
        return {"commitInfo": {"timestamp": ts, "operation": op, "operationMetrics": metrics}}

    v0 = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": meta},
        add("event_date=2026-11-28/a.parquet", "2026-11-28", 1000, 10),
        add("event_date=2026-11-28/b.parquet", "2026-11-28", 1000, 10),
        info(NOW_MS - 7_200_000, "WRITE", {"numFiles": "2", "numOutputBytes": "2000", "numOutputRows": "20"}),
    ]
    v1 = [
        add("event_date=2026-11-29/c.parquet", "2026-11-29", 40 * MiB, 500),
        info(
            NOW_MS - 60_000,
            "MERGE",
            {"numTargetFilesAdded": "1", "numTargetBytesAdded": str(40 * MiB), "numTargetRowsInserted": "500"},
        ),
    ]
    for version, actions in enumerate((v0, v1)):
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def test_health_and_metrics_from_a_synthetic_delta_log(tmp_path: Path) -> None:
    root = tmp_path / "readings"
    _write_log(root)
    for name, size in (("event_date=2026-11-28/a.parquet", 1000), ("event_date=2026-11-28/orphan.parquet", 777)):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * size)
    orphan = root / "event_date=2026-11-28/orphan.parquet"
    old = (NOW_MS - 30 * 86400_000) / 1000
    os.utime(orphan, (old, old))

    settings = load_settings(env={}).on_local_files(tmp_path)
    log = read_table(settings, settings.storage.table_uri("readings"), history=100, retention_s=7 * 86400)
    assert log is not None and log.version == 1
    assert log.vacuumable == ("event_date=2026-11-28/orphan.parquet",)  # untracked and 30 days old
    objects = list(list_objects(settings, settings.storage.table_uri("readings")))
    health = table_health(
        "readings",
        log.version,
        log.files,
        log.commits,
        objects,
        vacuumable=log.vacuumable,
        small_file_bytes=32 * MiB,
        interval_s=300,
        now_ms=NOW_MS,
    )
    assert (health.files, health.small_files, health.rows, len(health.partitions)) == (3, 2, 520, 2)
    assert (health.reclaimable_files, health.reclaimable_bytes) == (1, 777)
    uri = settings.storage.table_uri("readings")
    assert [c.version for c in commits_since(settings, uri, None)] == [1, 0]
    assert [(c.version, c.operation) for c in commits_since(settings, uri, 0)] == [(1, "MERGE")]
    assert commits_since(settings, uri, 1) == ()
    assert commits_since(settings, settings.storage.table_uri("device_state"), None) == ()  # not created

    metrics = MaintenanceMetrics(registry=CollectorRegistry(), clock=lambda: NOW.timestamp())
    metrics.record_health(health, churn(log.commits))
    r = metrics.registry

    def value(name: str, **labels: str) -> float | None:
        return r.get_sample_value(name, {"table": "readings", **labels})

    assert value("iot_table_files") == 3
    assert value("iot_table_small_file_ratio") == pytest.approx(2 / 3)
    assert value("iot_table_bytes") == 2000 + 40 * MiB
    assert value("iot_table_rows") == 520
    assert value("iot_table_partitions") == 2
    assert value("iot_table_version") == 1
    assert value("iot_table_last_commit_age_seconds") == pytest.approx(60)
    assert math.isnan(value("iot_table_last_vacuum_age_seconds") or 0.0)
    assert value("iot_table_vacuum_reclaimable_bytes") == 777
    assert value("iot_table_rows_inserted_total") == 520
    assert value("iot_table_bytes_added_total") == 2000 + 40 * MiB


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"small_file_mb": 500}, "small_file_mb"),
        ({"min_small_files": 1}, "min_small_files must be >= 2"),
        ({"open_partition_min_small_files": 3}, "open_partition_min_small_files >= min_small_files"),
        ({"min_small_file_ratio": 0}, "min_small_file_ratio"),
        ({"interval": "soon"}, "maintenance.interval"),
        ({"niceness": 20}, "niceness must be 0..19"),
        ({"niceness": -5}, "niceness must be 0..19"),
    ],
)
def test_maintenance_config_is_validated_with_the_fix(override: dict, message: str) -> None:
    env = {f"IOTLAKE_MAINTENANCE__{k.upper()}": str(v) for k, v in override.items()}
    with pytest.raises(ConfigError, match=message):
        load_settings(env=env)


def test_the_sidecar_lowers_its_priority_to_the_configured_niceness_and_never_raises_it() -> None:
    """In a child process (the test's own priority could not be raised back): from normal to 10, and a process
    already at 19 stays there; the process it starts next (the JVM) inherits it."""
    assert MaintenanceConfig().niceness == 10
    script = (
        "import os, subprocess, sys\n"
        "from streaming.lake.maintenance import lower_priority\n"
        "os.setpriority(os.PRIO_PROCESS, 0, int(sys.argv[1]))\n"
        "lower_priority(int(sys.argv[2]))\n"
        "child = subprocess.run(['sh', '-c', 'ps -o ni= -p $$'], capture_output=True, text=True)\n"
        "print(os.getpriority(os.PRIO_PROCESS, 0), child.stdout.strip())\n"
    )

    def niceness_after(start: int, asked: int) -> str:
        argv = [sys.executable, "-c", script, str(start), str(asked)]
        return subprocess.run(argv, capture_output=True, text=True, check=True, cwd=PROJECT_ROOT).stdout.strip()

    base = os.getpriority(os.PRIO_PROCESS, 0)  # 0 unless the suite itself runs niced
    assert base < 10
    assert niceness_after(base, 10) == "10 10"
    assert niceness_after(19, 10) == "19 19"
    assert niceness_after(base, 0) == f"{base} {base}"


def _group_niceness_around(asked: int, new_session: bool) -> tuple[int | None, int | None]:
    """The nice of a child's scheduling group (Linux autogroup) before and after it lowered its priority to
    `asked`; None where it is in no autogroup."""
    script = (
        "import sys\n"
        "from streaming.lake.maintenance import AUTOGROUP, group_niceness, lower_priority\n"
        "print(group_niceness(AUTOGROUP.read_text()))\n"
        "lower_priority(int(sys.argv[1]))\n"
        "print(group_niceness(AUTOGROUP.read_text()))\n"
    )
    argv = [sys.executable, "-c", script, str(asked)]
    done = subprocess.run(
        argv, capture_output=True, text=True, check=True, cwd=PROJECT_ROOT, start_new_session=new_session
    )
    before, after = (None if line == "None" else int(line) for line in done.stdout.split())
    return before, after


def test_the_group_niceness_is_read_from_an_autogroup_and_none_outside_one() -> None:
    assert group_niceness("/autogroup-1097 nice 0\n") == 0
    assert group_niceness("/autogroup-7 nice -5\n") == -5
    assert group_niceness("/autogroup-12 nice 19") == 19
    assert group_niceness("") is None  # the kernel's default group, e.g. a CI runner's that never called setsid
    assert group_niceness("/autogroup-3 nice ?\n") is None


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="this kernel has no autogroups (CONFIG_SCHED_AUTOGROUP)")
def test_a_sidecar_leading_its_own_session_lowers_its_scheduling_group_too() -> None:
    """With autogroups, Linux shares the CPU between sessions first and uses nice only inside one: a sidecar in
    a session of its own (as `make run`, the supervisor and the benchmark start it) at nice 10 took half the CPU
    from a stream in another session. Leading its session, it lowers the session's group; otherwise it leaves the
    group, which it shares with whatever started it, alone. This suite's own session may be in no autogroup (the
    default group, as on a CI runner that never called setsid): its children then must not fail either."""
    before, after = _group_niceness_around(10, new_session=True)  # setsid always makes a new autogroup
    assert before is not None and before < 10 and after == 10
    assert _group_niceness_around(0, new_session=True) == (before, before)
    parent = group_niceness(AUTOGROUP.read_text())
    assert parent is None or parent < 10
    assert _group_niceness_around(10, new_session=False) == (parent, parent)


def test_cluster_by_cannot_be_combined_with_partitioning(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("tables:\n  readings: {partition_by: [event_date], cluster_by: [device_id]}\n")
    with pytest.raises(ConfigError, match="cluster_by"):
        load_settings(config, env={})
    config.write_text("tables:\n  readings: {partition_by: [], zorder_by: [], cluster_by: [device_id]}\n")
    assert load_settings(config, env={}).tables.readings.cluster_by == ("device_id",)


def test_a_table_write_that_loses_a_conflict_is_retried_with_backoff_and_counted() -> None:
    from streaming.pipeline.tables import retry_on_conflict

    outcomes: list[BaseException | str] = [RuntimeError("ConcurrentAppendException: files added")] * 2 + ["ok"]
    conflicts: list[str] = []
    waits: list[float] = []

    def write() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    assert retry_on_conflict(write, "readings", conflicts.append, sleep=waits.append) == "ok"
    assert conflicts == ["readings", "readings"] and waits == [0.5, 1.0]

    def broken() -> str:
        raise RuntimeError("java.io.IOException: disk full")

    with pytest.raises(RuntimeError, match="disk full"):  # not a conflict: no retry
        retry_on_conflict(broken, "readings", conflicts.append, sleep=waits.append)
    assert len(conflicts) == 2

    def always() -> str:
        raise RuntimeError("ConcurrentDeleteReadException")

    with pytest.raises(RuntimeError, match="ConcurrentDeleteReadException"):
        retry_on_conflict(always, "readings", conflicts.append, attempts=3, sleep=waits.append)
    assert len(conflicts) == 4  # two more retries, then the third loss is raised


def test_retain_keeps_what_the_next_health_needs_and_drops_the_rest() -> None:
    from streaming.lake.health import retain

    minute = 60_000
    commits = [
        Commit(1, NOW_MS - 90 * minute, "OPTIMIZE"),
        Commit(2, NOW_MS - 80 * minute, "VACUUM END"),
        Commit(3, NOW_MS - 70 * minute, "OPTIMIZE"),
        Commit(4, NOW_MS - 60 * minute, "MERGE"),
        Commit(5, NOW_MS - 2 * minute, "MERGE"),
        Commit(6, NOW_MS - 1 * minute, "MERGE"),
    ]
    kept = retain([*commits, commits[-1]], interval_s=300, now_ms=NOW_MS)  # a repeated commit counts once
    assert [c.version for c in kept] == [2, 3, 5, 6]
    assert retain([], 300, NOW_MS) == ()
    assert [c.version for c in retain(commits[:4], 300, NOW_MS)] == [2, 3, 4]  # the newest, even if old


def test_the_sidecar_runs_no_vacuum_that_could_delete_nothing_and_one_that_could(
    spark: SparkSession, local_settings: Settings, tmp_path: Path
) -> None:
    """Fresh tables: the due VACUUM is skipped, counted and shown as done, and not due again. A stray file older
    than the retention under one table: a new sidecar vacuums that table, and deletes the file."""
    settings = scratch_settings(local_settings, tmp_path)
    LakeTables(spark, settings).ensure()
    registry = CollectorRegistry()
    sidecar = Maintainer(spark, settings, MaintenanceMetrics(registry=registry))
    report = sidecar.cycle()
    assert report.vacuumed == []
    for table in TABLE_KEYS:  # the default config names each table by its key
        assert "younger than" in report.skipped[f"{table} vacuum"], report.skipped
        labels = {"table": table}
        assert registry.get_sample_value("iot_maintenance_vacuum_skipped_total", labels) == 1
        assert registry.get_sample_value("iot_maintenance_runs_total", {**labels, "operation": "vacuum"}) is None
        age = registry.get_sample_value("iot_table_last_vacuum_age_seconds", labels)
        assert age is not None and 0 <= age < 600, age
        history = spark.sql(f"DESCRIBE HISTORY delta.`{settings.storage.table_uri(table)}`")
        assert history.where("operation LIKE 'VACUUM%'").count() == 0
    assert sidecar.cycle().skipped == {}  # checked once an interval, like a VACUUM

    readings = Path(settings.storage.table_uri("readings").removeprefix("file:"))
    stray = readings / "stray.parquet"  # left by a crashed writer 8 days ago
    stray.write_bytes(b"x")
    eight_days_ago = time.time() - 8 * 86400
    os.utime(stray, (eight_days_ago, eight_days_ago))
    report = Maintainer(spark, settings, MaintenanceMetrics(registry=CollectorRegistry())).cycle()
    assert [(v.table, v.outcome, v.files_deleted) for v in report.vacuumed] == [("readings", "ok", 1)], report
    assert not stray.exists()
    assert set(report.skipped) == {"device_state vacuum", "quarantine vacuum"}
