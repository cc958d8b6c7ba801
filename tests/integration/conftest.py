"""Integration fixtures: one Spark session for every test that runs the job or a table command in this process.

Tests where the process boundary is the point (a crash, a kill, two writers, the cluster, the CLI's exit
codes) still start `iotlake` as its own process (tests.integration.lake.run_ingest / start_ingest).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from streaming.core.config import load_settings
from streaming.core.session import build_session


@pytest.fixture(scope="session")
def spark(stack_env: dict[str, str]) -> Iterator[SparkSession]:
    """The session's one Spark session, built for the test stack (S3A on its MinIO, the log store)."""
    session = build_session(load_settings(env={**os.environ, **stack_env}), app_name="iotlake-integration-tests")
    try:
        yield session
    finally:
        session.stop()
