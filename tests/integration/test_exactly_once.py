"""Crash and replay: SIGKILL the driver after a batch's Delta commits, before the checkpoint commit."""

from __future__ import annotations

import logging
import signal
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streaming.core.config import Settings
from tests.integration.lake import (
    combine_summaries,
    delta_log_actions,
    explain,
    ingest,
    read_table,
    run_ingest,
    simulate,
)
from tests.integration.test_pipeline import FAULTS, assert_tables_match

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CRASH_BATCH = 1


def crash_then_restart(spark: SparkSession, test_env: dict[str, str], exactly_once: bool) -> None:
    env = {
        **test_env,
        "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": "4000",
        "IOTLAKE_TEST_NO_TXN_IDS": "0" if exactly_once else "1",
    }
    crashed = run_ingest({**env, "IOTLAKE_TEST_CRASH": f"after_batch:{CRASH_BATCH}"})
    assert crashed.returncode == -signal.SIGKILL, explain(crashed)
    assert f"after_batch:{CRASH_BATCH}: killing the driver" in crashed.stderr
    # The batch's offsets were logged and its Delta commits made, but the checkpoint never committed it.
    checkpoint = Path(env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])
    assert (checkpoint / "offsets" / str(CRASH_BATCH)).exists()
    assert not (checkpoint / "commits" / str(CRASH_BATCH)).exists()
    assert (checkpoint / "commits" / str(CRASH_BATCH - 1)).exists()

    ingest(spark, env)  # the killed job's successor replays batch CRASH_BATCH


def test_crash_after_commit_then_replay_is_exactly_once(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    summary = simulate(settings, tmp_path, *FAULTS, count=8_000)
    crash_then_restart(spark, test_env, exactly_once=True)
    assert_tables_match(settings, stack_secrets, summary)

    # One transaction record per batch and table: the replayed batch committed nothing new.
    for table in ("readings", "device_state", "quarantine"):
        txns = delta_log_actions(settings, table, "txn")
        per_batch = Counter((t["appId"], t["version"]) for t in txns)
        assert per_batch, f"{table}: no transaction records"
        assert max(per_batch.values()) == 1, f"{table}: a batch committed twice: {per_batch}"
        versions = sorted(v for _, v in per_batch)
        assert CRASH_BATCH in versions, f"{table}: the crashed batch's commit is missing"
        assert len({app for app, _ in per_batch}) == 1, f"{table}: the app id changed across the restart"


def test_negative_control_without_transaction_ids_duplicates_the_replayed_batch(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    """The same crash without transaction ids must show a difference, or the test above proves nothing."""
    summary = simulate(settings, tmp_path, *FAULTS, count=8_000)
    crash_then_restart(spark, test_env, exactly_once=False)
    quarantine = read_table(settings, "quarantine", stack_secrets)
    coordinates = Counter((q["kafka_partition"], q["kafka_offset"]) for q in quarantine)
    assert len(quarantine) > summary["malformed_total"]
    assert max(coordinates.values()) == 2, "the replayed batch's quarantine rows should be there twice"
    assert {
        q["ingest_batch_id"] for q in quarantine if coordinates[(q["kafka_partition"], q["kafka_offset"])] == 2
    } == {CRASH_BATCH}


def test_device_states_folded_before_a_crash_are_caught_up_from_readings(
    spark: SparkSession,
    settings: Settings,
    test_env: dict[str, str],
    stack_secrets: dict[str, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """device_state upserted once an hour: batch 1's newest readings per device are only folded in the driver when
    the job is killed after batch 2. Batch 1 is committed and never replayed; its device states must come back
    from readings, or most devices keep batch 0's reading."""
    summary = combine_summaries(
        simulate(settings, tmp_path, *FAULTS, count=8_000), simulate(settings, tmp_path, count=3, seed=8)
    )
    env = {
        **test_env,
        "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": "4000",
        "IOTLAKE_INGEST__DEVICE_STATE_INTERVAL": "1 hour",
    }
    crashed = run_ingest({**env, "IOTLAKE_TEST_CRASH": "after_batch:2"})
    assert crashed.returncode == -signal.SIGKILL, explain(crashed)
    checkpoint = Path(env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])
    assert (checkpoint / "commits" / "1").exists() and not (checkpoint / "commits" / "2").exists()
    versions = [t["version"] for t in delta_log_actions(settings, "device_state", "txn")]
    assert versions == [0], "batches 1 and 2 should have been folded, not upserted"

    with caplog.at_level(logging.INFO, logger="iotlake.device_state"):
        ingest(spark, env)
    assert "device_state caught up with readings: batches 1 to 2" in caplog.text
    assert sorted(t["version"] for t in delta_log_actions(settings, "device_state", "txn")) == [0, 2]
    assert_tables_match(settings, stack_secrets, summary)
