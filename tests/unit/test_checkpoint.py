"""The checkpoint guards' rules: which table versions make a checkpoint too old, and a log with no commit."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streaming.core.errors import CheckpointError
from streaming.core.hadoop_fs import HadoopFiles
from streaming.pipeline.checkpoint import CheckpointLock, CheckpointState, check_not_older, newest_batch, tables_ahead
from streaming.pipeline.tables import clear_uncommitted_log, has_commit

pytestmark = pytest.mark.unit


def test_newest_batch_ignores_temporary_and_checksum_files() -> None:
    assert newest_batch(["0", "1", "12", ".12.crc", ".13.abc.tmp", "2"]) == 12
    assert newest_batch([".0.crc"]) is None
    assert newest_batch([]) is None


@pytest.mark.parametrize(
    ("planned", "versions", "ahead"),
    [
        (90, {"readings": 90, "device_state": 90, "quarantine": 90}, {}),
        # Killed after the readings commit of batch 91, before Spark's commit: batch 91 replays with its offsets.
        (91, {"readings": 91, "device_state": 90, "quarantine": None}, {}),
        # A copy of the checkpoint taken at batch 90, the tables at batch 100.
        (
            90,
            {"readings": 100, "device_state": 100, "quarantine": 99},
            {"readings": 100, "device_state": 100, "quarantine": 99},
        ),
        (90, {"readings": 91, "device_state": 90, "quarantine": 90}, {"readings": 91}),
        # Offsets lost altogether while the tables hold batches of this query.
        (None, {"readings": 0, "device_state": None, "quarantine": None}, {"readings": 0}),
        (None, {"readings": None, "device_state": None, "quarantine": None}, {}),
    ],
)
def test_tables_ahead_of_the_planned_batch_are_named(
    planned: int | None, versions: dict[str, int | None], ahead: dict[str, int]
) -> None:
    assert tables_ahead(CheckpointState("q", planned), versions) == ahead


def test_an_older_checkpoint_is_refused_naming_both_batches_and_the_ways_out() -> None:
    with pytest.raises(CheckpointError) as refused:
        check_not_older(CheckpointState("q-1", 90), {"readings": 100, "device_state": 99}, "s3a://b/cp")
    text = str(refused.value)
    for needle in ("batch 90", "readings holds batch 100", "device_state holds batch 99", "q-1", "restore", "new"):
        assert needle in text
    check_not_older(CheckpointState("q-1", 100), {"readings": 100, "device_state": 99}, "s3a://b/cp")


@pytest.mark.parametrize(
    ("names", "committed"),
    [
        (["_staged_commits"], False),
        (["_staged_commits", ".00000000000000000000.json.tmp"], False),
        (["00000000000000000000.json"], True),
        (["_staged_commits", "00000000000000000000.json", "00000000000000000000.crc"], True),
        (["00000000000000000010.checkpoint.parquet", "_last_checkpoint"], True),
        (["00000000000000000010.checkpoint.0000000001.0000000002.parquet"], True),
        (["_last_checkpoint"], True),
    ],
)
def test_a_log_counts_as_a_table_only_with_a_commit_or_checkpoint(names: list[str], committed: bool) -> None:
    assert has_commit(names) is committed


def test_a_log_without_a_commit_is_removed_and_a_committed_one_kept(spark: SparkSession, tmp_path: Path) -> None:
    cut = tmp_path / "cut" / "_delta_log" / "_staged_commits"
    cut.mkdir(parents=True)
    (cut / "00000000000000000000.4f1c.json").write_text("{}")
    assert clear_uncommitted_log(HadoopFiles(spark, str(tmp_path / "cut")))
    assert not (tmp_path / "cut" / "_delta_log").exists()

    whole = tmp_path / "whole" / "_delta_log"
    whole.mkdir(parents=True)
    (whole / "00000000000000000000.json").write_text("{}")
    assert not clear_uncommitted_log(HadoopFiles(spark, str(tmp_path / "whole")))
    assert not clear_uncommitted_log(HadoopFiles(spark, str(tmp_path / "absent")))
    assert (whole / "00000000000000000000.json").exists()


def test_a_local_checkpoint_is_locked_while_held_and_free_once_released(spark: SparkSession, tmp_path: Path) -> None:
    files = HadoopFiles(spark, str(tmp_path / "cp"))
    first = CheckpointLock(files, ttl_s=60)
    first.acquire()
    try:
        with pytest.raises(CheckpointError, match=f"pid {os.getpid()}"):
            CheckpointLock(files, ttl_s=60).acquire()
    finally:
        first.release()
    fd = os.open(tmp_path / "cp" / "iotlake.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    finally:
        os.close(fd)


def test_transaction_versions_are_read_from_the_configured_table_names(tmp_path: Path) -> None:
    """With tables.*.name changed, the checkpoint guard must read those tables, not ones named like the keys."""
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction, write_deltalake

    from streaming.core.config import load_settings
    from streaming.core.storage import delta_storage_options
    from streaming.pipeline.checkpoint import txn_versions
    from streaming.pipeline.tables import txn_app_id

    settings = load_settings(
        env={
            "IOTLAKE_STORAGE__BASE_URI": (tmp_path / "lake").as_uri(),
            "IOTLAKE_TABLES__READINGS__NAME": "farm_readings",
            "IOTLAKE_TABLES__DEVICE_STATE__NAME": "farm_devices",
            "IOTLAKE_TABLES__QUARANTINE__NAME": "farm_rejects",
        }
    )
    for key, version in (("readings", 7), ("device_state", 6), ("quarantine", 5)):
        name = getattr(settings.tables, key).name
        write_deltalake(
            settings.storage.table_uri(name),
            pa.table({"x": [1]}),
            commit_properties=CommitProperties(app_transactions=[Transaction(txn_app_id("q1", key), version)]),
        )
    versions = txn_versions(settings, delta_storage_options(settings), "q1")
    assert versions == {"readings": 7, "device_state": 6, "quarantine": 5}
