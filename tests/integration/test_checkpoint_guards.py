"""The checkpoint guards: an older copy of the checkpoint, and a second job on the same one, are refused.

Either would plan batches the tables already hold with new Kafka offsets; Delta skips those batch ids as
committed, so their messages would be lost without a word.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streaming.core.config import Settings
from streaming.core.errors import CheckpointError
from tests.helpers import wait_for
from tests.integration.lake import (
    assert_tables_match,
    batch_ids,
    delta_log_actions,
    device_state_differs,
    explain,
    ingest,
    run_ingest,
    simulate,
    start_ingest,
    stop_job,
    table_version,
    trigger_cap,
    wait_for_first_batch,
)
from tests.integration.test_pipeline import FAULTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TABLES = ("readings", "device_state", "quarantine")


def test_an_older_copy_of_the_checkpoint_is_refused_and_nothing_is_written(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    summary = simulate(settings, tmp_path, *FAULTS, count=6_000)
    env = {**test_env, "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": trigger_cap(settings, 6_000, batches=3)}
    checkpoint = Path(env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])
    # Batch 0 committed, batch 1 in the tables and planned (offsets/1) but not committed.
    crashed = run_ingest({**env, "IOTLAKE_TEST_CRASH": "after_batch:1"})
    assert crashed.returncode == -signal.SIGKILL, explain(crashed)
    backup = tmp_path / "checkpoint-backup"
    shutil.copytree(checkpoint, backup)
    ingest(spark, env)  # the killed job's successor finishes the topic
    assert_tables_match(settings, stack_secrets, summary)
    versions = {t: table_version(settings, t, stack_secrets) for t in TABLES}
    last = batch_ids(checkpoint)[-1]
    assert last >= 2

    shutil.rmtree(checkpoint)
    shutil.copytree(backup, checkpoint)  # "restore last night's backup"
    with pytest.raises(CheckpointError) as refused:
        ingest(spark, env)
    for needle in ("older than the tables", "its newest batch is batch 1", f"readings holds batch {last}"):
        assert needle in str(refused.value)
    assert {t: table_version(settings, t, stack_secrets) for t in TABLES} == versions, "a refused start wrote"
    assert batch_ids(checkpoint, "offsets") == [0, 1]


def test_a_second_job_on_the_same_checkpoint_is_refused(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    """And, the job being up anyway, that an idle stream upserts the device states it holds: batch 1's are kept
    (device_state every 20 s) and no batch comes after it, so only the job's loop between batches can write them."""
    summary = simulate(settings, tmp_path, *FAULTS, count=3_000)
    env = {
        **test_env,
        "IOTLAKE_INGEST__TRIGGER_INTERVAL": "1 second",
        "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": trigger_cap(settings, 3_000, batches=2),
        "IOTLAKE_INGEST__DEVICE_STATE_INTERVAL": "20 seconds",
    }
    checkpoint = Path(env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])
    log = tmp_path / "first.log"
    first = start_ingest(env, log)
    try:
        wait_for_first_batch(first, checkpoint, log)
        with pytest.raises(CheckpointError, match="Another job is running on the checkpoint") as refused:
            ingest(spark, env)  # this process is the second job
        assert f"pid {first.pid}" in str(refused.value)
        assert first.poll() is None, "the refused job must not disturb the running one"

        wait_for(
            lambda: first.poll() is not None or not device_state_differs(settings, stack_secrets, summary),
            180,
            interval=1.0,
            message="device_state to hold every device's newest event while the job idles",
        )
        assert first.poll() is None, log.read_text()[-3000:]
        assert batch_ids(checkpoint) == [0, 1]
        flushed_ms = max(c["timestamp"] for c in delta_log_actions(settings, "device_state", "commitInfo"))
        assert flushed_ms > (checkpoint / "commits" / "1").stat().st_mtime * 1000, "upserted inside a batch"
    finally:
        code = stop_job(first)
    assert code == 0, log.read_text()[-3000:]
    assert_tables_match(settings, stack_secrets, summary)
