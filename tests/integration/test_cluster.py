"""The ingest job on a real Spark standalone cluster (master + worker on loopback, started by the stack):
the same exact counts as in local mode, and the tasks really ran in the worker's executor."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack import StackLayout, spark_cluster, status, up
from streaming.config import Settings, load_settings
from tests.helpers import free_port_pair
from tests.integration.lake import assert_tables_match, explain, run_ingest, simulate
from tests.integration.test_pipeline import FAULTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def cluster_env(test_env: dict[str, str], stack_layout: StackLayout) -> Iterator[tuple[dict[str, str], StackLayout]]:
    """`stack.up(cluster=True)` on the test stack (Kafka and MinIO run already and are reused) with the
    master on free ports; yields the test env pointing the job at the cluster. The cluster is stopped after."""
    master = free_port_pair()
    webui = free_port_pair({master, master + 1})
    env = {
        **test_env,
        "IOTLAKE_SPARK_CLUSTER__MASTER_PORT": str(master),
        "IOTLAKE_SPARK_CLUSTER__WEBUI_PORT": str(webui),
        "IOTLAKE_SPARK__APP_NAME": f"iotlake-cluster-test-{uuid.uuid4().hex[:8]}",
    }
    settings = load_settings(env=env)
    try:
        up(settings, stack_layout, echo=None, cluster=True)
        yield {**env, **spark_cluster.job_env(settings)}, stack_layout
    finally:
        spark_cluster.stop(stack_layout)
        # Each application's executor gets its own copy of the ~750 MB of jars; don't leave them in /tmp.
        shutil.rmtree(stack_layout.spark_home, ignore_errors=True)


def test_ingest_on_a_standalone_cluster_gives_the_exact_counts(
    settings: Settings,
    cluster_env: tuple[dict[str, str], StackLayout],
    stack_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    env, layout = cluster_env
    cluster_settings = load_settings(env=env)
    assert cluster_settings.spark.master == spark_cluster.master_url(cluster_settings)
    assert spark_cluster.alive_workers(cluster_settings) == 1
    before = status(cluster_settings, layout)
    assert before["spark-master"]["state"] == before["spark-worker"]["state"] == "running"

    summary = simulate(settings, tmp_path, *FAULTS, count=8_000)
    result = run_ingest({**env, "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": "4000"})
    assert result.returncode == 0, explain(result)
    assert_tables_match(settings, stack_secrets, summary)

    # The job ran as an application of this master, and finished.
    info = spark_cluster.master_json(cluster_settings)
    assert info is not None
    apps = [a for a in info["completedapps"] if a["name"] == cluster_settings.spark.app_name]
    assert len(apps) == 1, info["completedapps"]
    assert apps[0]["state"] == "FINISHED"
    assert not info["activeapps"]

    # Its tasks ran in the worker's executor: the executor's log, in the worker's work dir, shows them.
    app_dir = spark_cluster.work_dir(layout) / apps[0]["id"]
    executor_logs = sorted(app_dir.glob("*/stderr"))
    assert executor_logs, f"no executor logs under {app_dir}"
    text = "".join(p.read_text(errors="replace") for p in executor_logs)
    assert "Running task" in text and "Finished task" in text

    # Stopping takes the worker (and its executors) and the master down; the rest of the stack stays.
    worker_pid, master_pid = spark_cluster.stop(layout)
    assert (worker_pid, master_pid) == (before["spark-worker"]["pid"], before["spark-master"]["pid"])
    after = status(cluster_settings, layout)
    assert after["spark-master"]["state"] == after["spark-worker"]["state"] == "stopped"
    assert after["kafka"]["state"] == after["minio"]["state"] == "running"
