"""The ingest job on a real Spark standalone cluster (master + worker on loopback, started by the stack):
the same exact counts as in local mode, the tasks really ran in the worker's executor, and a driver without
the cluster's spark.authenticate secret is refused."""

from __future__ import annotations

import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack import StackLayout, proc, spark_cluster, status, up
from stack import secrets as sec
from streaming.core.config import Settings, load_settings, read_secrets_file
from tests.helpers import free_port_pair, wait_for
from tests.integration.lake import assert_tables_match, explain, run_ingest, simulate, trigger_cap
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
    result = run_ingest({**env, "IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER": trigger_cap(settings, 8_000, batches=2)})
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

    # The executor loaded the Delta, Kafka-source and S3A jars from the worker's own copy (the same Ivy cache
    # as the driver's, spark.preinstalled_jars): none of the ~750 MB was copied into the application's dir.
    copied = {p.name: p.stat().st_size for p in app_dir.rglob("*.jar")}
    assert not copied, f"{sum(copied.values()) / 2**20:.0f} MB of jars copied into {app_dir}: {sorted(copied)[:5]}"

    # The cluster authenticates every connection; its secret is in 0600 files, on no command line.
    secret = read_secrets_file(Path(env["IOTLAKE_STORAGE__SECRETS_FILE"]))[sec.SPARK_AUTH_SECRET]
    assert cluster_settings.spark.auth_secret == secret
    for role in ("master", "worker"):
        conf = layout.spark_home / f"{role}.conf"
        assert stat.S_IMODE(conf.stat().st_mode) == 0o600, role
        assert f"spark.authenticate.secret {secret}" in conf.read_text().splitlines(), role
    for pid in (before["spark-master"]["pid"], before["spark-worker"]["pid"]):
        assert secret not in (proc.cmdline(pid) or ""), pid
    assert_refused_without_the_secret(cluster_settings, layout)

    # Stopping takes the worker (and its executors) and the master down; the rest of the stack stays.
    worker_pid, master_pid = spark_cluster.stop(layout)
    assert (worker_pid, master_pid) == (before["spark-worker"]["pid"], before["spark-master"]["pid"])
    after = status(cluster_settings, layout)
    assert after["spark-master"]["state"] == after["spark-worker"]["state"] == "stopped"
    assert after["kafka"]["state"] == after["minio"]["state"] == "running"


INTRUDER = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master({master!r}).appName("intruder").config("spark.driver.host", "127.0.0.1")
print(spark.config("spark.driver.bindAddress", "127.0.0.1").getOrCreate().range(10).count())
"""


def assert_refused_without_the_secret(settings: Settings, layout: StackLayout) -> None:
    """A plain PySpark driver (any local user's code) without the secret: the master fails its auth challenge
    and never runs it as an application."""
    log = spark_cluster.master_service(layout).log
    challenges_before = log.read_text(errors="replace").count("doAuthChallenge")
    code = INTRUDER.format(master=spark_cluster.master_url(settings))
    intruder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: log.read_text(errors="replace").count("doAuthChallenge") > challenges_before,
            120,
            message="the master to fail the unauthenticated driver's auth challenge",
        )
        info = spark_cluster.master_json(settings)
        assert info is not None
        assert not [a for a in info["activeapps"] + info["completedapps"] if a["name"] == "intruder"], info
        assert intruder.poll() in (None, 1), "the driver without the secret must not get to run"
    finally:
        intruder.kill()
        intruder.wait(30)
