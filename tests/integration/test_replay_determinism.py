"""What a batch decides must not depend on the host's timezone or on when it is replayed."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from streaming.core.config import Settings, load_settings
from tests.integration.lake import (
    assert_tables_match,
    batch_ids,
    explain,
    ingest,
    read_table,
    run_ingest,
    simulate,
    trigger_cap,
)
from tests.integration.test_pipeline import FAULTS
from tests.unit.test_batch import EXTREME_TIMES, encode, event

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata"])
def test_cross_batch_duplicates_are_stored_once_in_any_timezone(
    zone: str, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    """The job under a non-UTC TZ (the session stays UTC): re-sent events in later batches are still found."""
    summary = simulate(settings, tmp_path, "--duplicate-rate", "0.1", count=6_000)
    assert summary["duplicates"] > 400
    cap = trigger_cap(settings, 6_000, batches=3)
    result = run_ingest({**test_env, "TZ": zone, "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": cap})
    assert result.returncode == 0, explain(result)
    assert batch_ids(Path(test_env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])) == [0, 1, 2]
    assert_tables_match(settings, stack_secrets, summary)


def _content(settings: Settings, table: str, secrets: dict[str, str], drop: set[str]) -> list[tuple]:
    rows = read_table(settings, table, secrets)
    return sorted(tuple(sorted((k, repr(v)) for k, v in r.items() if k not in drop)) for r in rows)


def test_a_batch_replayed_days_later_decides_as_its_first_attempt(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    """Crash between the readings and device_state commits; replay with the clock 8 days on (past max_lateness)."""
    summary = simulate(settings, tmp_path, *FAULTS, count=6_000)
    env = {**test_env, "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": "100000"}  # one batch: batch 0
    crashed = run_ingest({**env, "IOTLAKE_TEST_CRASH": "after_readings:0"})
    assert crashed.returncode == -signal.SIGKILL, explain(crashed)
    assert read_table(settings, "readings", stack_secrets), "the crash came before the readings commit"
    assert not read_table(settings, "device_state", stack_secrets), "the crash came after the device_state commit"
    assert not read_table(settings, "quarantine", stack_secrets), "the quarantine append began before readings' commit"

    ingest(spark, {**env, "IOTLAKE_TEST_CLOCK_SHIFT": "8 days"})  # the killed job's successor
    assert_tables_match(settings, stack_secrets, summary)

    # The same topic through a run that never crashed: the three tables are equal, ingest_time included.
    clean_env = {
        **env,
        "IOTLAKE_STORAGE__BASE_URI": f"{settings.storage.base_uri}-clean",
        "IOTLAKE_INGEST__CHECKPOINT_LOCATION": str(tmp_path / "clean-checkpoint"),
    }
    ingest(spark, clean_env)
    clean_settings = load_settings(env=clean_env)
    for table in ("readings", "device_state", "quarantine"):
        clock = {"ingest_time", "ingest_date"}  # the two runs started at different times
        assert _content(settings, table, stack_secrets, clock) == _content(clean_settings, table, stack_secrets, clock)
    # Every row of the replayed batch carries the first attempt's clock, in all three tables.
    times = {
        r["ingest_time"]
        for t in ("readings", "device_state", "quarantine")
        for r in read_table(settings, t, stack_secrets)
    }
    assert len(times) == 1, times


def test_extreme_event_times_under_warn_never_stop_the_stream(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    """With the time rules at `warn`, unstorable times are still quarantined and the stream keeps running."""
    now_ms = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "enable.idempotence": True})
    for i, (_, value, _) in enumerate(EXTREME_TIMES):
        producer.produce(
            settings.kafka.topic, encode(event(event_id=f"x{i}", device_id=f"d{i}", seq=i, event_time=value))
        )
    producer.produce(settings.kafka.topic, encode(event(event_id="fine", event_time=now_ms)))
    assert producer.flush(30) == 0
    env = {
        **test_env,
        "IOTLAKE_VALIDATION__ACTIONS": "{event_time_in_future: warn, event_time_too_old: warn}",
    }
    ingest(spark, env)
    readings = {r["event_id"] for r in read_table(settings, "readings", stack_secrets)}
    quarantine = sorted(q["reason"] for q in read_table(settings, "quarantine", stack_secrets))
    warned = {f"x{i}" for i, (_, _, rule) in enumerate(EXTREME_TIMES) if rule == "event_time_too_old"}
    assert readings == {"fine", *warned}
    assert quarantine == sorted(rule for _, _, rule in EXTREME_TIMES if rule != "event_time_too_old")
