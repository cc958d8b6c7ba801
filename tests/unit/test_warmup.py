"""The warm-up batch: the job's real BatchWriter on synthetic messages, into scratch tables it removes after."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from streaming.core.config import Settings
from streaming.pipeline.ingest import BatchWriter
from streaming.pipeline.metrics import IngestMetrics
from streaming.pipeline.tables import LakeTables
from streaming.pipeline.warmup import (
    DEVICES,
    MESSAGES,
    QUERY_ID_PROPERTY,
    BatchBody,
    messages,
    scratch_settings,
    wants_warm_up,
    warm_up,
)

pytestmark = pytest.mark.unit


def test_the_messages_are_valid_readings_plus_one_resend_and_one_malformed() -> None:
    now = datetime(2026, 12, 4, tzinfo=UTC)
    rows = messages(now, schema_version=3)
    values = [value for _, value, *_ in rows]
    assert len(rows) == MESSAGES
    assert values[-2] == values[0]  # a re-send: the dedup path
    with pytest.raises(json.JSONDecodeError):
        json.loads(values[-1])  # malformed: the quarantine path
    events = [json.loads(v) for v in values[:-2]]
    assert len({e["event_id"] for e in events}) == MESSAGES - 2
    assert len({e["device_id"] for e in events}) == DEVICES
    assert {e["schema_version"] for e in events} == {3}  # the first version the config accepts
    # Within seconds before now: inside any lateness window, never in the future.
    assert 0 < now.timestamp() * 1000 - min(e["event_time"] for e in events) <= MESSAGES


def test_only_a_continuous_query_on_a_local_master_warms_up(local_settings: Settings) -> None:
    assert wants_warm_up(local_settings, available_now=False)
    assert not wants_warm_up(local_settings, available_now=True)
    off = replace(local_settings, ingest=replace(local_settings.ingest, warm_up=False))
    assert not wants_warm_up(off, available_now=False)
    cluster = replace(local_settings, spark=replace(local_settings.spark, master="spark://127.0.0.1:7077"))
    assert not wants_warm_up(cluster, available_now=False)


def test_scratch_settings_move_only_the_lake_and_the_checkpoint(local_settings: Settings, tmp_path: Path) -> None:
    scratch = scratch_settings(local_settings, tmp_path)
    assert scratch.storage.base_uri == f"file:{tmp_path / 'lake'}"
    assert scratch.ingest.checkpoint_uri == str(tmp_path / "checkpoint")
    assert replace(scratch, storage=local_settings.storage, ingest=local_settings.ingest) == local_settings


def test_warm_up_runs_the_writer_into_scratch_tables_and_leaves_nothing_behind(
    spark: SparkSession, local_settings: Settings, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    settings = local_settings.on_local_files(lake)
    seen: dict[str, object] = {}

    def writer(scratch: Settings, tables: LakeTables) -> BatchBody:
        real = BatchWriter(spark, scratch, tables, IngestMetrics(), label="warm-up")

        def body(raw: DataFrame, batch_id: int) -> None:
            real(raw, batch_id)
            seen["root"] = Path(scratch.storage.base_uri.removeprefix("file:")).parent
            seen["query id"] = spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
            seen["counts"] = {
                name: spark.read.format("delta").load(uri).count()
                for name, uri in (
                    ("readings", tables.readings_uri),
                    ("device_state", tables.device_state_uri),
                    ("quarantine", tables.quarantine_uri),
                )
            }

        return body

    seconds = warm_up(spark, settings, writer)

    assert seconds is not None and seconds > 0
    # Every path of a batch ran: inserts (the re-send once), one state per device, the malformed one quarantined.
    assert seen["counts"] == {"readings": MESSAGES - 2, "device_state": DEVICES, "quarantine": 1}
    assert str(seen["query id"]).startswith("warmup-")
    root = seen["root"]
    assert isinstance(root, Path) and not root.exists(), "the scratch tables and checkpoint are removed"
    assert spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY) is None
    assert not lake.exists(), "nothing is written to the job's own lake"


def test_a_failed_warm_up_is_logged_and_the_job_starts_without_it(
    spark: SparkSession, local_settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A rule with action `fail` matching the warm-up's malformed message fails its batch, as it would a real one.
    settings = replace(
        local_settings.on_local_files(tmp_path / "lake"),
        validation=replace(local_settings.validation, actions={"malformed_json": "fail"}),
    )
    with caplog.at_level(logging.WARNING, logger="iotlake.warmup"):
        result = warm_up(spark, settings, lambda scratch, tables: BatchWriter(spark, scratch, tables, IngestMetrics()))
    assert result is None
    assert "warm-up batch failed, starting without it" in caplog.text and "malformed_json" in caplog.text
    assert spark.sparkContext.getLocalProperty(QUERY_ID_PROPERTY) is None
    assert not (tmp_path / "lake").exists()
