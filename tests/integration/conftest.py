"""Integration fixtures: one Spark session for every test that runs the job or a table command in this process.

Tests where the process boundary is the point (a crash, a kill, two writers, the cluster, the CLI's exit
codes) still start `iotlake` as its own process (tests.integration.lake.run_ingest / start_ingest).
"""

from __future__ import annotations

import os

import pytest
from pyspark.sql import SparkSession

from streaming.core.config import load_settings
from streaming.core.session import build_session
from tests.conftest import SparkSessions


@pytest.fixture(scope="module")  # a module uses one kind; module-scoped fixtures take it
def spark(spark_sessions: SparkSessions, stack_env: dict[str, str]) -> SparkSession:
    """The Spark session for the test stack (S3A on its MinIO, the log store), shared by the integration tests."""
    settings = load_settings(env={**os.environ, **stack_env})
    return spark_sessions.get("integration", lambda: build_session(settings, app_name="iotlake-integration-tests"))
