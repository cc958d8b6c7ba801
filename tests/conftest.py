"""Fixtures for tests against real services: a separate Kafka + MinIO test stack on free loopback ports.

- `stack_env` (session): starts the test stack with `stack.up()` in a temporary home and yields the env
  overrides (IOTLAKE_*) that point at it; merged over os.environ they load settings for it and can be
  passed to subprocesses. Torn down with `stack.down()` at the end (kept with IOTLAKE_TEST_REUSE_STACK=1).
- `stack_layout`, `stack_secrets` (session): the test stack's StackLayout and its secrets file values (the
  SASL listener's password, IOTLAKE_KAFKA_SASL_PASSWORD, included).
- `test_env` (function): os.environ + stack_env + a unique base_uri, topic and checkpoint for one test.
- `settings` (function): `load_settings(env=test_env)`, its topic created with 6 partitions.
- `spark_sessions` (session): the process's one Spark session, rebuilt (a new JVM) when a test needs the other
  kind; the unit and integration `spark` fixtures ask it for theirs.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from pyspark.sql import SparkSession

from stack import StackLayout, down, ensure_topic, up
from stack import kafka as stack_kafka
from stack import proc as stack_proc
from stack import secrets as stack_secrets_mod
from stack.addresses import free_port
from stack.addresses import loopback_port_free as port_free
from stack.layout import HOME_ENV, default_cache
from streaming.core.config import PROJECT_ROOT, Settings, load_settings, read_secrets_file
from streaming.core.session import stop_session
from tests.helpers import free_port_pair
from tests.interrupt import install as sigterm_interrupts

REUSE_ENV = "IOTLAKE_TEST_REUSE_STACK"
REUSE_HOME = PROJECT_ROOT / "var" / "test-stack"


def pytest_configure(config: pytest.Config) -> None:
    sigterm_interrupts()  # a `kill` of pytest stops the stack and the jobs tests started, as Ctrl-C does


# Integration modules that run on the unit tests' worker, after them: without them that worker idled for two
# thirds of the run while the other ran the integration tests alone. Each worker starts its own test stack, so the two
# share no broker, bucket or Prometheus.
BESIDE_UNIT = frozenset(
    f"tests/integration/{name}.py"
    for name in (
        "test_replay_determinism",
        "test_exactly_once",
        "test_table_ops",
        "test_evolution_and_errors",
        "test_pipeline",
        "test_first_start",
    )
)


def worker_scope(nodeid: str) -> str:
    """Which of `make test`'s two workers runs a test: "unit" (the unit tests, then BESIDE_UNIT) or "stack"."""
    if nodeid.startswith("tests/unit/") or nodeid.split("::")[0] in BESIDE_UNIT:
        return "unit"
    return "stack"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` (pytest-xdist, `-n 2`): two scopes, each whole on one worker in file order (`worker_scope`).
    (xdist's own `--dist loadgroup` can't do it with pytest 9.2: it renames `item._nodeid`, which pytest no longer
    reads. Handing the integration tests out one by one was tried and was slower: docs/test-suite-log.md.)"""
    from xdist.scheduler import LoadScopeScheduling

    class TwoScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_scope(nodeid)

    return TwoScopes(config, log)


def _ports(layout: StackLayout, reuse: bool) -> tuple[int, int, int, int]:
    """Fresh free ports (kafka, minio, prometheus, kafka's SASL listener); with reuse, the saved ones if the stack
    still runs or they are still free."""
    saved = layout.home / "ports.json"
    if reuse and saved.exists():
        data = json.loads(saved.read_text())
        kafka, minio = int(data["kafka"]), int(data["minio"])
        prometheus, sasl = int(data.get("prometheus", 0)), int(data.get("kafka_sasl", 0))
        running = stack_proc.read_pid(stack_kafka.service(layout)) is not None
        ports = (kafka, kafka + 1, minio, minio + 1, prometheus, sasl)
        if prometheus and sasl and (running or all(port_free(p) for p in ports)):
            return kafka, minio, prometheus, sasl
    kafka = free_port_pair()
    minio = free_port_pair({kafka, kafka + 1})
    prometheus = free_port({kafka, kafka + 1, minio, minio + 1})
    sasl = free_port({kafka, kafka + 1, minio, minio + 1, prometheus})
    saved.write_text(json.dumps({"kafka": kafka, "minio": minio, "prometheus": prometheus, "kafka_sasl": sasl}))
    return kafka, minio, prometheus, sasl


def _overrides(home: Path, kafka_port: int, minio_port: int, prometheus_port: int, sasl_port: int) -> dict[str, str]:
    return {
        HOME_ENV: str(home),
        "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka_port}",
        "IOTLAKE_KAFKA__SASL_LISTENER_PORT": str(sasl_port),  # the test stack's broker also offers SASL/PLAIN
        "IOTLAKE_STORAGE__ENDPOINT": f"http://127.0.0.1:{minio_port}",
        "IOTLAKE_STORAGE__SECRETS_FILE": str(home / "secrets.env"),
        "IOTLAKE_MONITORING__PROMETHEUS_PORT": str(prometheus_port),
    }


@pytest.fixture(scope="session")
def stack_layout(tmp_path_factory: pytest.TempPathFactory) -> StackLayout:
    """Home of this worker's test stack: a temp dir (with IOTLAKE_TEST_REUSE_STACK=1, var/test-stack, -gw1 after it
    for the second xdist worker)."""
    if os.environ.get(REUSE_ENV) == "1":
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # each xdist worker has a stack of its own
        home = REUSE_HOME if worker == "gw0" else REUSE_HOME.with_name(f"{REUSE_HOME.name}-{worker}")
        home.mkdir(parents=True, exist_ok=True)
        return StackLayout(home=home, cache=default_cache())
    return StackLayout(home=tmp_path_factory.mktemp("stack"), cache=default_cache())


@pytest.fixture(scope="session")
def stack_env(stack_layout: StackLayout) -> Iterator[dict[str, str]]:
    """Start the test stack; yield the IOTLAKE_* overrides pointing at it (writer keys included)."""
    reuse = os.environ.get(REUSE_ENV) == "1"
    env = _overrides(stack_layout.home, *_ports(stack_layout, reuse))
    settings = load_settings(env={**os.environ, **env})
    try:
        up(settings, stack_layout)
    except BaseException:
        down(stack_layout, echo=None)
        raise
    secrets = stack_secrets_mod.load(Path(env["IOTLAKE_STORAGE__SECRETS_FILE"]))
    env["IOTLAKE_STORAGE__ACCESS_KEY"] = secrets[stack_secrets_mod.WRITER_ACCESS_KEY]
    env["IOTLAKE_STORAGE__SECRET_KEY"] = secrets[stack_secrets_mod.WRITER_SECRET_KEY]
    try:
        yield env
    finally:
        if not reuse:
            down(stack_layout)


@pytest.fixture(scope="session")
def stack_secrets(stack_env: dict[str, str]) -> dict[str, str]:
    """All values of the test stack's secrets file (root, writer and reader keys, the Kafka SASL password)."""
    path = Path(stack_env["IOTLAKE_STORAGE__SECRETS_FILE"])
    password = read_secrets_file(path)[stack_secrets_mod.KAFKA_SASL_PASSWORD]
    return {**stack_secrets_mod.load(path), stack_secrets_mod.KAFKA_SASL_PASSWORD: password}


@pytest.fixture
def test_env(stack_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The full environment of one test: os.environ + stack_env + unique base_uri, topic, checkpoint."""
    base = {**os.environ, **stack_env}
    bucket = load_settings(env=base).storage.bucket
    uid = uuid.uuid4().hex[:12]
    return {
        **base,
        "IOTLAKE_STORAGE__BASE_URI": f"s3a://{bucket}/tests/{uid}",
        "IOTLAKE_KAFKA__TOPIC": f"test-{uid}",
        "IOTLAKE_KAFKA__PARTITIONS": "6",
        "IOTLAKE_INGEST__CHECKPOINT_LOCATION": str(tmp_path / "checkpoint"),
        "IOTLAKE_INGEST__METRICS_PORT": "0",
        # The warm-up batch (about 17 s of both cores before a continuous query starts) has its own tests
        # (tests/unit/test_warmup.py) and runs in the live scenario, which starts its job as `make run` does.
        "IOTLAKE_INGEST__WARM_UP": "false",
        # The jobs tests start live for seconds to a minute: HotSpot's second JIT tier (C2) spent about a third of
        # their CPU compiling code they barely ran again. Semantics are the JVM's either way; the tests' shared
        # session, the live scenario's job and `make run` keep both tiers.
        # C1 alone also shrinks the JIT's code cache to 48 MB (the tiered default is 240 MB); a long job filled it,
        # and a JVM that can't place a new call adapter exits. So the size is the tiered one.
        "IOTLAKE_SPARK__CONF__spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m",
    }


@pytest.fixture
def settings(test_env: dict[str, str]) -> Iterator[Settings]:
    """Settings for one test against the test stack; its topic exists with 6 partitions, all led."""
    s = load_settings(env=test_env)
    ensure_topic(s)
    yield s
    _delete_topic(s)


def _delete_topic(s: Settings) -> None:
    """Best effort: keeps a reused test stack from piling up topics."""
    admin = stack_kafka.admin_client(s.kafka.bootstrap_servers)
    with contextlib.suppress(KafkaException, TimeoutError, RuntimeError):
        admin.delete_topics([s.kafka.topic], operation_timeout=5)[s.kafka.topic].result(timeout=10)


class SparkSessions:
    """One Spark session at a time, by kind ("unit": local files; "integration": the test stack).

    A JVM keeps the jars and S3 settings it was launched with, and getOrCreate hands back a running session
    whatever it is asked for; so a test that needs the other kind gets a new JVM, not the running one.
    """

    def __init__(self) -> None:
        self.kind: str | None = None
        self.session: SparkSession | None = None

    def get(self, kind: str, build: Callable[[], SparkSession]) -> SparkSession:
        if self.kind != kind or self.session is None:
            self.close()
            self.session, self.kind = build(), kind
        return self.session

    def close(self) -> None:
        if self.session is not None:
            stop_session(self.session)
        self.session = self.kind = None


@pytest.fixture(scope="session")
def spark_sessions() -> Iterator[SparkSessions]:
    sessions = SparkSessions()
    try:
        yield sessions
    finally:
        sessions.close()
