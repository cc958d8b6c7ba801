"""Pure logic of the scale-out stack: the two-node Kafka layout, the Spark cluster's command lines and
config, and the errors for bad values (no services started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack import cli, kafka, spark_cluster
from stack.addresses import HostPort, kafka_listeners
from stack.layout import StackLayout
from streaming.core.config import load_settings
from streaming.core.errors import ConfigError, StackError

pytestmark = pytest.mark.unit


def _props(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {k: v for k, v in pairs}


# --- Kafka: one node per bootstrap address --------------------------------------------------------------


def test_kafka_listeners_one_per_bootstrap_address() -> None:
    assert kafka_listeners("127.0.0.1:9092") == [HostPort("127.0.0.1", 9092)]
    assert kafka_listeners("127.0.0.1:9092, localhost:9094") == [
        HostPort("127.0.0.1", 9092),
        HostPort("localhost", 9094),
    ]


@pytest.mark.parametrize(
    ("servers", "needle"),
    [
        ("127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096", "at most 2"),
        ("127.0.0.1:9092,127.0.0.1:9093", "uses a port twice"),
        ("127.0.0.1:9092,127.0.0.1:9092", "uses a port twice"),
        ("127.0.0.1:9092,10.0.0.5:9092", "not loopback"),
    ],
)
def test_bad_broker_lists_are_explained(servers: str, needle: str) -> None:
    with pytest.raises(StackError, match=needle):
        kafka_listeners(servers)


def test_two_nodes_one_controller_and_one_broker(tmp_path: Path) -> None:
    settings = load_settings(env={"IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:19092,127.0.0.1:19094"})
    layout = StackLayout(home=tmp_path, cache=tmp_path / "cache")
    first, second = kafka.nodes(settings, layout)
    assert (first.name, first.home) == ("kafka", tmp_path / "kafka")
    assert (second.name, second.home) == ("kafka-2", tmp_path / "kafka-2")

    p1 = _props(kafka.server_properties(settings, layout, 1))
    assert p1["process.roles"] == "broker,controller"
    assert p1["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"

    p2 = _props(kafka.server_properties(settings, layout, 2))
    assert p2["process.roles"] == "broker"
    assert p2["node.id"] == "2"
    assert p2["listeners"] == "PLAINTEXT://127.0.0.1:19094"  # no controller listener
    assert p2["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19094"
    assert p2["controller.quorum.voters"] == p1["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert p2["log.dirs"] == str(tmp_path / "kafka-2" / "data")
    for p in (p1, p2):  # internal topics on both nodes, so losing node 2 loses none of them
        assert p["offsets.topic.replication.factor"] == p["transaction.state.log.replication.factor"] == "2"
        assert p["transaction.state.log.min.isr"] == "1"


def test_each_node_has_its_own_pid_file_and_logs(tmp_path: Path) -> None:
    layout = StackLayout(home=tmp_path, cache=tmp_path / "cache")
    one, two = kafka.node_service(layout, 1), kafka.node_service(layout, 2)
    assert one == kafka.service(layout)
    assert (one.pidfile.name, two.pidfile.name) == ("kafka.pid", "kafka-2.pid")
    assert two.marker == str(tmp_path / "kafka-2" / "server.properties")
    assert two.extra_logs == (tmp_path / "logs" / "kafka-2.log",)


# --- Spark standalone cluster ------------------------------------------------------------------------


def test_cluster_defaults_and_the_job_env(tmp_path: Path) -> None:
    settings = load_settings(env={})
    c = settings.spark_cluster
    assert (c.master_port, c.webui_port, c.worker_cores, c.worker_memory) == (7077, 8080, 1, "2g")
    assert spark_cluster.master_url(settings) == "spark://127.0.0.1:7077"
    env = spark_cluster.job_env(settings)
    assert env["IOTLAKE_SPARK__MASTER"] == "spark://127.0.0.1:7077"
    assert env["IOTLAKE_SPARK__CONF__spark.driver.host"] == "127.0.0.1"
    # The job picks these up through the ordinary overrides.
    job = load_settings(env=env)
    assert job.spark.master == "spark://127.0.0.1:7077"
    assert job.spark.conf["spark.driver.bindAddress"] == "127.0.0.1"


def test_cluster_command_lines_bind_loopback(tmp_path: Path) -> None:
    settings = load_settings(
        env={
            "IOTLAKE_SPARK_CLUSTER__MASTER_PORT": "27077",
            "IOTLAKE_SPARK_CLUSTER__WEBUI_PORT": "28080",
            "IOTLAKE_SPARK_CLUSTER__WORKER_MEMORY": "1536m",
        }
    )
    layout = StackLayout(home=tmp_path, cache=tmp_path / "cache")
    master = spark_cluster.master_argv(settings, layout)
    assert master[0].endswith("/pyspark/bin/spark-class")
    conf = str(tmp_path / "spark" / "master.conf")
    expected = [spark_cluster.MASTER_CLASS, "--host", "127.0.0.1", "--port", "27077", "--webui-port", "28080"]
    assert master[1:] == [*expected, "--properties-file", conf]
    worker = spark_cluster.worker_argv(settings, layout)
    assert worker[-1] == "spark://127.0.0.1:27077"
    assert worker[worker.index("--memory") + 1] == "1536m"
    assert worker[worker.index("--work-dir") + 1] == str(tmp_path / "spark" / "work")
    env = spark_cluster.daemon_env(layout, Path("/usr/lib/jvm/java-17/bin/java"))
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert env["SPARK_DAEMON_MEMORY"] == spark_cluster.DAEMON_MEMORY
    assert spark_cluster.MASTER_PROPERTIES["spark.master.rest.enabled"] == "false"


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("MASTER_PORT", "0", "spark_cluster.master_port must be 1..65535"),
        ("WEBUI_PORT", "7077", "must differ"),
        ("WORKER_CORES", "0", "worker_cores must be >= 1"),
        ("WORKER_MEMORY", "lots", "must be a size"),
    ],
)
def test_bad_cluster_settings_are_explained(key: str, value: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_settings(env={f"IOTLAKE_SPARK_CLUSTER__{key}": value})


def test_status_shows_the_spark_lines_only_once_started() -> None:
    def svc(state: str, pid: int | None) -> dict[str, object]:
        return {"state": state, "pid": pid, "address": "spark://127.0.0.1:7077", "log": "/v/logs/x.log"}

    info: dict[str, object] = {
        "kafka": {"state": "running", "pid": 10, "address": "127.0.0.1:9092", "log": "/v/logs/kafka.log"},
        "minio": {"state": "running", "pid": 11, "address": "http://127.0.0.1:9000", "log": "/v/logs/minio.log"},
        "spark-master": svc("stopped", None),
        "spark-worker": svc("stopped", None),
        "home": "/v",
        "cache": "/c",
    }
    assert [line.split()[0] for line in cli.format_status(info).splitlines()] == ["kafka", "minio", "home"]
    info["spark-master"], info["spark-worker"] = svc("running", 12), svc("not answering", 13)
    lines = cli.format_status(info).splitlines()
    assert [line.split()[:2] for line in lines[2:4]] == [["spark-master", "running"], ["spark-worker", "not"]]
