"""Unit-test fixtures: a small local Spark session (no services) and settings that point at local files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streaming.core.config import Settings, load_settings
from streaming.core.session import build_session
from tests.conftest import SparkSessions


@pytest.fixture(scope="session")
def local_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    root = tmp_path_factory.mktemp("lake")
    return load_settings(
        env={
            "IOTLAKE_STORAGE__BASE_URI": f"file:{root}",
            "IOTLAKE_STORAGE__SECRETS_FILE": str(root / "no-secrets.env"),
            "IOTLAKE_SPARK__CONF__spark.sql.shuffle.partitions": "2",
        }
    )


@pytest.fixture(scope="module")  # a module uses one kind; module-scoped fixtures take it
def spark(spark_sessions: SparkSessions, local_settings: Settings) -> SparkSession:
    """A small local Spark session, shared by the unit tests (see tests.conftest.SparkSessions)."""
    return spark_sessions.get("unit", lambda: build_session(local_settings, app_name="iotlake-unit-tests"))


@pytest.fixture
def lake_root(tmp_path: Path) -> Path:
    return tmp_path
