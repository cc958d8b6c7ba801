"""sensor-sim -> Kafka -> `iotlake ingest` -> Delta on MinIO: the tables hold exactly what was sent."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streaming.core.config import Settings
from tests.integration.lake import assert_tables_match, explain, ingest, read_table, simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAULTS = (
    "--duplicate-rate",
    "0.05",
    "--out-of-order-rate",
    "0.05",
    "--late-rate",
    "0.05",
    "--malformed-rate",
    "0.04",
)


def test_simulator_to_tables_exact_counts(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    summary = simulate(settings, tmp_path, *FAULTS)
    assert min(summary["duplicates"], summary["late"], summary["out_of_order"], summary["malformed_total"]) > 0
    env = {
        **test_env,
        "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": "6000",
    }  # several batches: dups cross batches
    # On the tests' shared session: `iotlake ingest --available-now` as its own process, faults and re-sends across
    # batches included, is run by the timezone, crash-and-replay, cluster and SASL tests.
    assert len(ingest(spark, env)) >= 2
    assert_tables_match(settings, stack_secrets, summary)

    # Kafka coordinates and ingest time travel with every row.
    row = read_table(settings, "readings", stack_secrets)[0]
    assert row["kafka_topic"] == settings.kafka.topic
    assert row["kafka_offset"] >= 0 and row["ingest_time"] is not None and row["event_date"] is not None

    # A second run with nothing new reads nothing and changes nothing.
    assert sum(r.input_rows for r in ingest(spark, env)) == 0
    assert_tables_match(settings, stack_secrets, summary)

    # `iotlake status` reports what the tables and the checkpoint hold, and no lag once caught up.
    status = subprocess.run(
        [sys.executable, "-m", "streaming.cli", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, explain(status)
    report = json.loads(status.stdout)
    tables = {t["name"]: t for t in report["tables"]}
    assert tables["readings"]["rows"] == summary["valid_distinct"]
    assert tables["quarantine"]["rows"] == summary["malformed_total"]
    assert tables["device_state"]["rows"] == len(summary["latest_by_device"])
    assert all(t["version"] >= 1 and t["files"] >= 1 and t["last_commit"] for t in tables.values())
    assert report["stream"]["total_lag"] == 0
    assert report["stream"]["last_batch_id"] >= 3
    assert sum(report["stream"]["committed_offsets"].values()) == summary["sent_total"]

    # A checkpoint reset re-reads the topic under a new query id: readings and device_state don't change (the
    # MERGEs deduplicate), and quarantine records each rejected message once more, as the README says.
    shutil.rmtree(env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])
    before = {t: read_table(settings, t, stack_secrets) for t in ("readings", "device_state")}
    assert len(ingest(spark, test_env)) == 1  # the whole topic in one batch, under the new query id
    for table, rows in before.items():
        assert sorted(map(repr, read_table(settings, table, stack_secrets))) == sorted(map(repr, rows)), table
    coordinates = Counter(
        (q["kafka_partition"], q["kafka_offset"]) for q in read_table(settings, "quarantine", stack_secrets)
    )
    assert len(coordinates) == summary["malformed_total"] and set(coordinates.values()) == {2}


def test_config_command_masks_secrets(test_env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "streaming.cli", "config", "--json"], env=test_env, capture_output=True, text=True
    )
    assert result.returncode == 0, explain(result)
    shown = json.loads(result.stdout)
    assert shown["storage"]["secret_key"] == "***"
    assert test_env["IOTLAKE_STORAGE__SECRET_KEY"] not in result.stdout
    assert shown["kafka"]["topic"] == test_env["IOTLAKE_KAFKA__TOPIC"]
