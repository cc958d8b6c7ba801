"""The stack's public operations: install, up, down, status."""

from __future__ import annotations

import time
from typing import Any

from stack import kafka, logkeeper, logrotate, minio, proc, spark_cluster
from stack import prometheus as prom
from stack import secrets as sec
from stack.addresses import minio_console
from stack.install import Echo, Installed, find_java, install
from stack.layout import StackLayout
from streaming.core.config import Settings, resolve_path

__all__ = ["Installed", "down", "install", "status", "up"]


def _timed(echo: Echo | None, started: float, text: str) -> None:
    if echo is not None:
        echo(f"{text} ({time.monotonic() - started:.1f}s)")


def up(settings: Settings, layout: StackLayout | None = None, echo: Echo | None = print, cluster: bool = False) -> None:
    """Install what is missing, start Kafka, MinIO and Prometheus (reusing running ones), bootstrap MinIO, add
    the topic.

    With `cluster`, also a Spark standalone master and worker (stack.spark_cluster). Kafka runs one node
    per address in kafka.bootstrap_servers (one or two). Prints one line per step through `echo` (None: silent).
    """
    layout = layout or StackLayout.default()
    for address in (kafka.address, minio.address, prom.address):  # bad addresses fail before installing
        address(settings)
    inst = install(layout, echo)
    layout.make_dirs()
    secrets_path = resolve_path(settings.storage.secrets_file)
    sasl = kafka.sasl_listener(settings)
    extra = (*((sec.KAFKA_SASL_PASSWORD,) if sasl else ()), *((sec.SPARK_AUTH_SECRET,) if cluster else ()))
    secrets = sec.ensure_secrets_file(secrets_path, extra=extra)

    kafka.check_can_start(settings, layout)  # all checked before any starts
    minio.check_can_start(settings, layout)
    if cluster:
        spark_cluster.check_can_start(settings, layout)
    prom.check_can_start(settings, layout)
    started = time.monotonic()
    kafka_pid, kafka_reused = kafka.launch(settings, layout, inst, secrets.get(sec.KAFKA_SASL_PASSWORD))
    minio_started = time.monotonic()
    minio_pid, minio_reused = minio.launch(settings, layout, inst, secrets)
    prom_started = time.monotonic()
    prom_pid, prom_reused = prom.launch(settings, layout, inst)
    # MinIO first: it is ready sooner, so each line shows its own start-up time.
    minio.wait_ready(settings, layout, minio_pid)
    verb = "running already" if minio_reused else "started"
    _timed(echo, minio_started, f"minio: {verb}, pid {minio_pid}, {settings.storage.endpoint}, ready")
    prom.wait_ready(settings, layout, prom_pid)
    verb = "running already" if prom_reused else "started"
    _timed(echo, prom_started, f"prometheus: {verb}, pid {prom_pid}, {prom.url(settings)}, ready")
    kafka.wait_ready(settings, layout, kafka_pid)
    verb = "running already" if kafka_reused else "started"
    brokers = settings.kafka.bootstrap_servers
    _timed(echo, started, f"kafka: {verb}, pid {kafka_pid}, {brokers}, ready")
    if sasl is not None and echo is not None:
        echo(
            f"kafka: SASL_PLAINTEXT listener on {sasl} (mechanism PLAIN, user {kafka.SASL_USER!r}, password "
            f"{sec.KAFKA_SASL_PASSWORD} in {secrets_path})"
        )

    started = time.monotonic()
    minio.bootstrap(settings, secrets)
    _timed(echo, started, f"minio bootstrap: bucket {settings.storage.bucket!r} private, writer + reader users")
    started = time.monotonic()
    count = kafka.ensure_topic(settings)
    _timed(echo, started, f"topic {settings.kafka.topic!r}: {count} partitions, all with a leader")
    if cluster:
        started = time.monotonic()
        c = spark_cluster.start(settings, layout, find_java(), secrets[sec.SPARK_AUTH_SECRET])
        verb = "running already" if c.reused else "started"
        where = f"master pid {c.master_pid} {c.master_url} (UI {c.webui_url}), worker pid {c.worker_pid}"
        _timed(echo, started, f"spark: {verb}, {where}, ready")
        if echo is not None:
            job = " ".join(f"{k}={v}" for k, v in spark_cluster.job_env(settings).items())
            echo(f"spark: run the job on the cluster with: {job} iotlake ingest")
    keeper_pid, keeper_reused = logkeeper.launch(layout)
    if echo is not None:
        verb = "running already" if keeper_reused else "started"
        limit = logrotate.RotationPolicy()
        echo(f"logs: {layout.logs}, rotated at {limit.max_bytes // 2**20} MB, {limit.keep} kept (log keeper {verb}, "
             f"pid {keeper_pid})")  # fmt: skip
        echo(f"secrets: {secrets_path} (mode 0600)")


def down(layout: StackLayout | None = None, echo: Echo | None = print) -> None:
    """Stop the Spark cluster, Prometheus, MinIO and Kafka if this layout started them (SIGTERM, deadline,
    SIGKILL). Safe to call twice."""
    layout = layout or StackLayout.default()
    started = time.monotonic()
    worker_pid, master_pid = spark_cluster.stop(layout)
    if worker_pid or master_pid:
        _timed(echo, started, f"spark: stopped worker pid {worker_pid}, master pid {master_pid}")
    for name, stop in (
        ("prometheus", prom.stop),
        ("minio", minio.stop),
        ("kafka", kafka.stop),
        ("log keeper", logkeeper.stop),
    ):
        started = time.monotonic()
        pid = stop(layout)
        _timed(echo, started, f"{name}: stopped pid {pid}" if pid else f"{name}: not running")


def status(settings: Settings, layout: StackLayout | None = None) -> dict[str, Any]:
    """Each service: state (running | not answering | stopped), pid, address, log path."""
    layout = layout or StackLayout.default()
    kafka_addr = kafka.address(settings)
    minio_addr = minio.address(settings)
    kafka_pid = proc.read_pid(kafka.service(layout))
    minio_pid = proc.read_pid(minio.service(layout))
    prom_pid = proc.read_pid(prom.service(layout))
    keeper_pid = proc.read_pid(logkeeper.service(layout))
    prom_url = prom.url(settings)
    return {
        "kafka": {
            "state": _state(kafka_pid, lambda: kafka.answers(str(kafka_addr), timeout=2.0)),
            "pid": kafka_pid,
            "address": settings.kafka.bootstrap_servers,
            "sasl_address": str(sasl) if (sasl := kafka.sasl_listener(settings)) else None,
            "nodes": {str(node_id): pid for node_id, pid in kafka.running_nodes(layout).items()},
            "topic": settings.kafka.topic,
            "log": str(layout.log("kafka")),
        },
        "minio": {
            "state": _state(minio_pid, lambda: minio.answers(minio_addr, timeout=2.0)),
            "pid": minio_pid,
            "address": f"http://{minio_addr}",
            "console": f"http://{minio_console(minio_addr)}",
            "bucket": settings.storage.bucket,
            "log": str(layout.log("minio")),
        },
        "prometheus": {
            "state": _state(prom_pid, lambda: prom.answers(prom_url, timeout=2.0)),
            "pid": prom_pid,
            "address": prom_url,
            "config": str(prom.config_path(layout)),
            "log": str(layout.log("prometheus")),
        },
        **spark_cluster.status(settings, layout),
        "logkeeper": {
            "state": _state(keeper_pid, lambda: True),
            "pid": keeper_pid,
            "address": "-",
            "log": str(logkeeper.service(layout).log),
        },
        "home": str(layout.home),
        "cache": str(layout.cache),
        "secrets_file": str(resolve_path(settings.storage.secrets_file)),
    }


def _state(pid: int | None, probe: Any) -> str:
    if pid is None:
        return "stopped"
    return "running" if probe() else "not answering"
