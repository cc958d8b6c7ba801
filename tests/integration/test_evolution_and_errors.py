"""Schema evolution on and off, and the clear errors people hit: bad config, services unreachable, bad keys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streaming.core.config import Settings
from streaming.core.errors import CheckpointError
from tests.helpers import free_port_pair
from tests.integration.lake import explain, ingest, read_table, simulate

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_new_field_is_quarantined_when_evolution_is_off(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    summary = simulate(settings, tmp_path, "--add-field", "wind_speed_ms", count=1500)
    ingest(spark, {**test_env, "IOTLAKE_SCHEMA_EVOLUTION__ADD_NEW_FIELDS": "false"})
    quarantine = read_table(settings, "quarantine", stack_secrets)
    assert len(quarantine) == summary["valid_distinct"] + summary["duplicates"]
    assert {q["reason"] for q in quarantine} == {"unexpected_field:wind_speed_ms"}
    assert read_table(settings, "readings", stack_secrets) == []


@pytest.mark.slow
def test_new_field_becomes_a_column_when_evolution_is_on(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    env = {**test_env, "IOTLAKE_SCHEMA_EVOLUTION__ADD_NEW_FIELDS": "true"}
    before = simulate(settings, tmp_path, count=1000, seed=1)
    ingest(spark, env)  # the tables exist without the field
    after = simulate(settings, tmp_path, "--add-field", "wind_speed_ms", count=1000, seed=2)
    ingest(spark, env)
    readings = read_table(settings, "readings", stack_secrets)
    assert len(readings) == before["valid_distinct"] + after["valid_distinct"]
    with_field = [r for r in readings if r.get("wind_speed_ms") is not None]
    assert len(with_field) == after["valid_distinct"]
    assert all(isinstance(r["wind_speed_ms"], float) for r in with_field)
    state = read_table(settings, "device_state", stack_secrets)
    assert "wind_speed_ms" in state[0]


def iotlake(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streaming.cli", *args], env=env, capture_output=True, text=True, timeout=120
    )


def assert_clear_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, explain(result)
    assert "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, result.stderr


def test_bad_config_names_the_key(test_env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("validation:\n  max_message_bytes: lots\n")
    result = iotlake(test_env, "--config", str(bad), "ingest")
    assert_clear_error(result, "validation.max_message_bytes", "whole number")


def test_unreachable_kafka_is_a_clear_error(test_env: dict[str, str]) -> None:
    closed = free_port_pair()
    env = {**test_env, "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{closed}"}
    assert_clear_error(iotlake(env, "ingest"), f"127.0.0.1:{closed}", "make up")


def test_missing_topic_is_a_clear_error(settings: Settings, test_env: dict[str, str]) -> None:
    env = {**test_env, "IOTLAKE_KAFKA__TOPIC": "no-such-topic-here"}
    assert_clear_error(iotlake(env, "ingest"), "no-such-topic-here", "does not exist")


def test_unreachable_minio_is_a_clear_error(settings: Settings, test_env: dict[str, str]) -> None:
    closed = free_port_pair()
    env = {**test_env, "IOTLAKE_STORAGE__ENDPOINT": f"http://127.0.0.1:{closed}"}
    assert_clear_error(iotlake(env, "ingest"), "unreachable", "make up")


def test_wrong_secret_key_is_a_clear_error(settings: Settings, test_env: dict[str, str]) -> None:
    env = {**test_env, "IOTLAKE_STORAGE__SECRET_KEY": "not-the-right-secret"}
    assert_clear_error(iotlake(env, "ingest"), "refused the writer's key")


def test_missing_credentials_are_a_clear_error(settings: Settings, test_env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in test_env.items() if k not in ("IOTLAKE_STORAGE__ACCESS_KEY", "IOTLAKE_STORAGE__SECRET_KEY")}
    env["IOTLAKE_STORAGE__SECRETS_FILE"] = str(tmp_path / "absent.env")
    assert_clear_error(iotlake(env, "ingest"), "No S3 credentials", "make up")


def test_other_bucket_is_refused_for_the_writer(settings: Settings, test_env: dict[str, str]) -> None:
    env = {**test_env, "IOTLAKE_STORAGE__BASE_URI": "s3a://some-other-bucket/lake"}
    assert_clear_error(iotlake(env, "ingest"), "some-other-bucket")


def test_missing_java_is_a_clear_error(settings: Settings, test_env: dict[str, str], tmp_path: Path) -> None:
    env = {**test_env, "JAVA_HOME": str(tmp_path / "no-java")}
    assert_clear_error(iotlake(env, "ingest"), "Java", "JAVA_HOME")


@pytest.mark.slow
def test_checkpoint_of_another_query_is_refused(
    spark: SparkSession, settings: Settings, test_env: dict[str, str]
) -> None:
    ingest(spark, test_env)
    other = {**test_env, "IOTLAKE_STORAGE__BASE_URI": test_env["IOTLAKE_STORAGE__BASE_URI"] + "-other"}
    with pytest.raises(CheckpointError, match="belongs to a different query") as refused:
        ingest(spark, other)
    assert "checkpoint_location" in str(refused.value)
