"""A kill during the first start (while the job creates the tables) leaves a lake the next start completes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streaming.core.config import Settings
from streaming.core.preflight import minio_client
from streaming.pipeline.tables import has_commit
from tests.helpers import wait_for
from tests.integration.lake import assert_tables_match, explain, ingest, kill_job, run_ingest, simulate, start_ingest
from tests.integration.test_pipeline import FAULTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def log_objects(settings: Settings, table: str) -> list[str]:
    """The object names under a table's _delta_log/ on MinIO."""
    s = settings.storage
    prefix = s.base_uri.removeprefix(f"s3a://{s.bucket}/").rstrip("/")
    objects = minio_client(settings).list_objects(s.bucket, prefix=f"{prefix}/{table}/_delta_log/", recursive=True)
    return [o.object_name.rsplit("/_delta_log/", 1)[1] for o in objects]


def test_a_kill_at_any_point_of_the_first_start_is_completed_by_the_next_start(
    spark: SparkSession, settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    summary = simulate(settings, tmp_path, *FAULTS, count=3_000)

    # 1. A kill the moment the first object of readings' log appears: its first commit is being written.
    log = tmp_path / "killed.log"
    job = start_ingest(test_env, log, "--available-now")
    try:
        seen = wait_for(
            lambda: job.poll() is not None or log_objects(settings, "readings"),
            300,
            interval=0.02,
            message="the first object of readings/_delta_log",
        )
    finally:
        kill_job(job)
    assert seen is not True, f"the job exited before creating readings:\n{log.read_text()[-3000:]}"
    left = log_objects(settings, "readings")
    # The state this step is about: a log with no commit in it (what Delta leaves mid-commit, e.g. a staged one).
    assert left and not has_commit([name.split("/")[0] for name in left]), (
        f"the kill came after readings' first commit ({left}); poll faster or kill earlier"
    )

    # 2. Kills between the tables (the hook SIGKILLs right after each creation).
    for table in ("readings", "device_state"):
        killed = run_ingest({**test_env, "IOTLAKE_TEST_CRASH": f"after_create:{table}"})
        assert killed.returncode == -signal.SIGKILL, explain(killed)
        assert f"after_create:{table}: killing the driver" in killed.stderr, explain(killed)

    ingest(spark, test_env)  # the last killed job's successor
    assert_tables_match(settings, stack_secrets, summary)
