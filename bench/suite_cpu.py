"""A pytest plugin: how busy each test keeps the machine's cores (psutil's CPU times around it).

    .venv/bin/python -m pytest -p bench.suite_cpu [pytest args]

Each test's wall time (setup, call and teardown) and the machine's busy and idle core-seconds over it (idle includes
I/O wait) go to `IOTLAKE_SUITE_CPU_OUT` (default var/suite-cpu.json); the end of the run prints the totals and the
tests that left the most cores idle. It measures the whole machine: run it with nothing else beside the suite.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.procs import machine_busy_and_total
from streaming.core.config import PROJECT_ROOT

OUT_ENV = "IOTLAKE_SUITE_CPU_OUT"


@dataclass(frozen=True)
class CpuOfTest:
    test: str
    wall_s: float
    busy_core_s: float
    idle_core_s: float


def totals(records: list[CpuOfTest], prefix: str = "") -> tuple[float, float, float, float]:
    """(wall s, busy core-s, idle core-s, busy share) of the tests whose id starts with `prefix`."""
    rows = [r for r in records if r.test.startswith(prefix)]
    wall, busy, idle = (sum(getattr(r, k) for r in rows) for k in ("wall_s", "busy_core_s", "idle_core_s"))
    return wall, busy, idle, busy / (busy + idle) if busy + idle else 0.0


_records: list[CpuOfTest] = []


def _now() -> tuple[float, float, float]:
    busy, total = machine_busy_and_total()
    return time.monotonic(), busy, total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    wall0, busy0, total0 = _now()
    yield
    wall1, busy1, total1 = _now()
    busy = busy1 - busy0
    _records.append(CpuOfTest(item.nodeid, wall1 - wall0, busy, (total1 - total0) - busy))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _records:
        return
    out = Path(os.environ.get(OUT_ENV, PROJECT_ROOT / "var" / "suite-cpu.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(r) for r in _records], indent=1) + "\n")
    write = terminalreporter.write_line
    write(f"suite CPU (whole machine, {os.cpu_count()} cores), per test in {out}:")
    for prefix in ("tests/unit/", "tests/integration/", ""):
        wall, busy, idle, share = totals(_records, prefix)
        write(f"  {prefix or 'all':20} {wall:7.0f} s wall  {busy:7.0f} busy  {idle:6.0f} idle core-s {share:4.0%} busy")
    for r in sorted(_records, key=lambda r: -r.idle_core_s)[:10]:
        write(f"  {r.idle_core_s:6.1f} idle core-s in {r.wall_s:6.1f} s  {r.test}")
