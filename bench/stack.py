"""A private Kafka + MinIO stack for the benchmark: temp home, free loopback ports, `stack.api.up/down`."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from stack import api, ensure_topic
from stack import kafka as stack_kafka
from stack import minio as stack_minio
from stack import proc as stack_proc
from stack import secrets as stack_secrets
from stack.addresses import free_port
from stack.install import Echo
from stack.layout import HOME_ENV, StackLayout, default_cache
from streaming.core.config import Settings, load_settings


@dataclass(frozen=True)
class BenchStack:
    """A running private stack: its layout and the IOTLAKE_* overrides (writer keys included) that reach it."""

    layout: StackLayout
    overrides: Mapping[str, str]

    @property
    def secrets_file(self) -> Path:
        return Path(self.overrides["IOTLAKE_STORAGE__SECRETS_FILE"])

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ + the stack's overrides + `extra` (IOTLAKE_* keys), for subprocesses and settings."""
        return {**os.environ, **self.overrides, **extra}

    def settings(self, **extra: str) -> Settings:
        return load_settings(env=self.env(**extra))

    def workload(self, name: str, workdir: Path, topic: bool = True, **extra: str) -> dict[str, str]:
        """Env for one workload: its own topic (created), base_uri and checkpoint, plus `extra`."""
        uid = f"{name}-{uuid.uuid4().hex[:8]}"
        bucket = self.settings().storage.bucket
        defaults = {
            "IOTLAKE_KAFKA__TOPIC": f"bench-{uid}",
            "IOTLAKE_STORAGE__BASE_URI": f"s3a://{bucket}/bench/{uid}",
            "IOTLAKE_INGEST__CHECKPOINT_LOCATION": str(workdir / f"checkpoint-{uid}"),
            "IOTLAKE_INGEST__METRICS_PORT": "0",
        }
        env = self.env(**{**defaults, **extra})
        if topic:
            ensure_topic(load_settings(env=env))
        return env

    def service_pids(self) -> dict[str, int]:
        """Pids of the running Kafka and MinIO of this stack."""
        pids: dict[str, int] = {}
        for name, module in (("kafka", stack_kafka), ("minio", stack_minio)):
            pid = stack_proc.read_pid(module.service(self.layout))
            if pid is not None:
                pids[name] = pid
        return pids


@contextlib.contextmanager
def bench_stack(keep_home: bool = False, echo: Echo | None = print) -> Iterator[BenchStack]:
    """Start a private stack in a temp home on free ports; always stop it (and remove the home) afterwards."""
    home = Path(tempfile.mkdtemp(prefix="iotlake-bench-"))
    layout = StackLayout(home=home, cache=default_cache())
    kafka_port = free_port(pair=True)
    minio_port = free_port({kafka_port, kafka_port + 1}, pair=True)
    prometheus_port = free_port({kafka_port, kafka_port + 1, minio_port, minio_port + 1})
    overrides = {
        HOME_ENV: str(home),
        "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka_port}",
        "IOTLAKE_STORAGE__ENDPOINT": f"http://127.0.0.1:{minio_port}",
        "IOTLAKE_STORAGE__SECRETS_FILE": str(home / "secrets.env"),
        "IOTLAKE_MONITORING__PROMETHEUS_PORT": str(prometheus_port),
    }
    try:
        api.up(load_settings(env={**os.environ, **overrides}), layout, echo=echo)
        values = stack_secrets.load(home / "secrets.env")
        overrides["IOTLAKE_STORAGE__ACCESS_KEY"] = values[stack_secrets.WRITER_ACCESS_KEY]
        overrides["IOTLAKE_STORAGE__SECRET_KEY"] = values[stack_secrets.WRITER_SECRET_KEY]
        yield BenchStack(layout, overrides)
    finally:
        api.down(layout, echo=echo)
        if not keep_home:
            shutil.rmtree(home, ignore_errors=True)
