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

Under pytest-xdist (`make test` runs two workers), the controller starts the one test stack and its workers share it:
each worker has its own Spark session, and a module runs whole on one worker (`--dist loadgroup`, one group per
module). The modules that change the stack itself (its Prometheus targets, a second `up`, a Spark cluster beside it)
share one group, so they run one after another.
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
SHARED_HOME = "iotlake_test_stack_home"  # xdist: the controller's stack home, handed to each worker
CONTROLLER_STACK = pytest.StashKey[StackLayout]()
# Modules that change the running stack (Prometheus' targets, `up` again, a Spark cluster) run on one xdist worker.
STACK_GROUP = "stack"
STACK_MODULES = frozenset({"test_live_scenario", "test_stack_services", "test_stack_hardening", "test_cluster"})


def pytest_configure(config: pytest.Config) -> None:
    sigterm_interrupts()  # a `kill` of pytest stops the stack and the jobs tests started, as Ctrl-C does


def _distributing(config: pytest.Config) -> bool:
    """True in an xdist controller that hands tests to workers (it runs none itself)."""
    return config.pluginmanager.hasplugin("dsession")


def pytest_sessionstart(session: pytest.Session) -> None:
    """An xdist controller starts the test stack its workers share (before xdist starts them: xdist's is trylast)."""
    config = session.config
    if _distributing(config):
        layout = _layout(config._tmp_path_factory)  # xdist itself derives the workers' basetemp from it
        _start_stack(layout)
        config.stash[CONTROLLER_STACK] = layout


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: tell each worker where the controller's stack lives."""
    layout = node.config.stash.get(CONTROLLER_STACK, None)
    if layout is not None:
        node.workerinput[SHARED_HOME] = str(layout.home)


def pytest_sessionfinish(session: pytest.Session) -> None:
    layout = session.config.stash.get(CONTROLLER_STACK, None)
    if layout is not None and os.environ.get(REUSE_ENV) != "1":
        down(layout)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One xdist group per module (module-scoped fixtures run once), one for the modules that change the stack."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            module = item.path.stem
            item.add_marker(pytest.mark.xdist_group(STACK_GROUP if module in STACK_MODULES else str(item.path)))


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


def _layout(tmp_path_factory: pytest.TempPathFactory) -> StackLayout:
    """Home of the test stack: a temp dir (or var/test-stack with IOTLAKE_TEST_REUSE_STACK=1)."""
    if os.environ.get(REUSE_ENV) == "1":
        REUSE_HOME.mkdir(parents=True, exist_ok=True)
        return StackLayout(home=REUSE_HOME, cache=default_cache())
    return StackLayout(home=tmp_path_factory.mktemp("stack"), cache=default_cache())


def _stack_overrides(layout: StackLayout, reuse: bool) -> dict[str, str]:
    """The IOTLAKE_* overrides that point at the stack in `layout` (the writer's keys once it has run)."""
    env = _overrides(layout.home, *_ports(layout, reuse))
    secrets_file = Path(env["IOTLAKE_STORAGE__SECRETS_FILE"])
    if secrets_file.exists():
        secrets = stack_secrets_mod.load(secrets_file)
        env["IOTLAKE_STORAGE__ACCESS_KEY"] = secrets[stack_secrets_mod.WRITER_ACCESS_KEY]
        env["IOTLAKE_STORAGE__SECRET_KEY"] = secrets[stack_secrets_mod.WRITER_SECRET_KEY]
    return env


def _start_stack(layout: StackLayout) -> None:
    """Start the test stack in `layout` (fresh ports, or the saved ones with IOTLAKE_TEST_REUSE_STACK=1)."""
    env = _stack_overrides(layout, os.environ.get(REUSE_ENV) == "1")
    try:
        up(load_settings(env={**os.environ, **env}), layout)
    except BaseException:
        down(layout, echo=None)
        raise


@pytest.fixture(scope="session")
def stack_layout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> StackLayout:
    """Home of the test stack: the xdist controller's, a temp dir, or var/test-stack (IOTLAKE_TEST_REUSE_STACK=1)."""
    shared = getattr(request.config, "workerinput", {}).get(SHARED_HOME)
    return StackLayout(home=Path(shared), cache=default_cache()) if shared else _layout(tmp_path_factory)


@pytest.fixture(scope="session")
def stack_env(request: pytest.FixtureRequest, stack_layout: StackLayout) -> Iterator[dict[str, str]]:
    """Start the test stack (unless an xdist controller did); yield the IOTLAKE_* overrides pointing at it."""
    if SHARED_HOME in getattr(request.config, "workerinput", {}):
        yield _stack_overrides(stack_layout, reuse=True)  # the saved ports of the controller's running stack
        return
    _start_stack(stack_layout)
    try:
        yield _stack_overrides(stack_layout, reuse=True)
    finally:
        if os.environ.get(REUSE_ENV) != "1":
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
