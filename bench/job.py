"""The real processes the benchmark drives: `iotlake ingest` and `sensor-sim`, each in its own session."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.procs import ProcSampler
from bench.stats import parse_metrics, phases
from stack import proc
from stack.proc import tail
from streaming.cli.run import DEMO_FAULTS
from streaming.core.prometheus import fetch

# The fault mix `make run` uses: small, and every kind is present.
FAULTS: tuple[str, ...] = DEMO_FAULTS


class BenchError(RuntimeError):
    """A benchmark step failed; the message names what and where its log is."""


@dataclass
class Proc:
    """A child process started by the benchmark, with its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float  # time.monotonic() just before it was spawned

    @classmethod
    def spawn(cls, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path) -> Proc:
        started = time.monotonic()
        return cls(name, proc.spawn(name, argv, log, env, fresh_log=True), log, started)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float) -> int:
        """Its exit code; raises BenchError (after stopping it) when it runs longer than `timeout`."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise BenchError(f"{self.name} ran longer than {timeout:.0f} s; stopped. Log: {self.log}") from None

    def stop(self, timeout: float = 120.0) -> int | None:
        """SIGTERM the process (it stops its own JVM), wait up to `timeout`, then SIGKILL its group.

        Safe to call twice.
        """
        return proc.stop_child(self.popen, timeout)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 30) -> str:
        return tail(self.log, lines)


def ingest_argv(available_now: bool) -> list[str]:
    """`iotlake ingest [--available-now]`, run with this interpreter."""
    return [sys.executable, "-m", "streaming.cli", "ingest", *(["--available-now"] if available_now else [])]


def sim_argv(
    bootstrap: str,
    topic: str,
    summary: Path,
    *,
    rate: float,
    count: int | None = None,
    duration: float | None = None,
    backend: str = "confluent",
    extra: Sequence[str] = (),
) -> list[str]:
    """`sensor-sim` to a topic: a count or a duration, at a rate (0 = as fast as possible)."""
    amount = ["--count", str(count)] if count is not None else ["--duration", str(duration)]
    return [
        sys.executable, "-m", "producers",
        "--bootstrap-servers", bootstrap,
        "--topic", topic,
        "--backend", backend,
        "--rate", str(rate),
        *amount,
        "--summary-json", str(summary),
        "--progress-interval", "5",
        *extra,
    ]  # fmt: skip


def run_sim(
    argv: Sequence[str],
    env: Mapping[str, str],
    log: Path,
    summary: Path,
    timeout: float,
    sampler: ProcSampler | None = None,
) -> dict[str, Any]:
    """Run sensor-sim to completion (its tree tracked as 'simulator' by `sampler`); its --summary-json."""
    proc = Proc.spawn("sensor-sim", argv, env, log)
    if sampler is not None:
        sampler.track("simulator", proc.pid)
    try:
        code = proc.wait(timeout)
    finally:
        proc.stop()
    if code != 0 or not summary.exists():
        raise BenchError(f"sensor-sim exited {code}:\n{proc.tail()}")
    data: dict[str, Any] = json.loads(summary.read_text())
    return data


@dataclass
class MetricsPoller:
    """Polls the job's /metrics in a thread; keeps each distinct phase breakdown (one per progress report)."""

    url: str
    interval: float = 0.5
    max_reports: int = 10_000
    reports: list[dict[str, Any]] = field(default_factory=list)
    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> MetricsPoller:
        self._thread = threading.Thread(target=self._run, name="bench-metrics", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def value(self, name: str) -> float | None:
        values = [v for (n, _), v in self.last.items() if n == name]
        return sum(values) if values else None

    def _run(self) -> None:
        previous: dict[str, float] = {}
        while not self._stop.is_set() and len(self.reports) < self.max_reports:
            text = fetch(self.url)
            if text is not None:
                self.last = parse_metrics(text)
                current = phases(self.last)
                if current and current != previous:
                    batch = self.value("iot_ingest_last_batch_id")
                    self.reports.append(
                        {
                            "after_batch": int(batch) if batch is not None else None,
                            "phases_s": current,
                            "lag_messages": self.value("iot_ingest_kafka_lag_messages"),
                        }
                    )
                    previous = current
            self._stop.wait(self.interval)


def wait_until_up(job: Proc, poller: MetricsPoller, timeout: float) -> float:
    """Seconds until the job's query reports up on /metrics; BenchError if it exits or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not job.alive():
            raise BenchError(f"the streaming job exited with {job.popen.returncode}:\n{job.tail()}")
        if poller.value("iot_ingest_query_up") == 1.0:
            return time.monotonic() - job.started
        time.sleep(0.25)
    raise BenchError(f"the streaming job did not start within {timeout:.0f} s; log {job.log}")
