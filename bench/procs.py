"""Resident memory and CPU of process trees, read from /proc (no psutil), sampled once a second."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")
GIB = 1024**3
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_vmrss_bytes(status_text: str) -> int | None:
    """VmRSS of a /proc/<pid>/status text, in bytes (None for kernel threads and zombies)."""
    for line in status_text.splitlines():
        if line.startswith("VmRSS:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                unit = parts[2].lower() if len(parts) > 2 else "kb"
                return int(parts[1]) * (1024 if unit == "kb" else 1)
    return None


def parse_stat(stat_text: str) -> tuple[int, int]:
    """(ppid, utime + stime in clock ticks) of a /proc/<pid>/stat text; comm may hold spaces and ')'."""
    rest = stat_text[stat_text.rindex(")") + 2 :].split()
    # rest[0] is the state (field 3), so field n is rest[n - 3]: ppid = 4, utime = 14, stime = 15.
    return int(rest[1]), int(rest[11]) + int(rest[12])


def parse_cpu_line(stat_text: str) -> tuple[int, int]:
    """(busy, total) jiffies of the machine, from the first line of /proc/stat."""
    values = [int(v) for v in stat_text.splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return total - idle, total


def descendants(roots: Iterable[int], parent_of: Mapping[int, int]) -> set[int]:
    """The roots and every process below them, given each pid's parent."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = [r for r in roots if r in parent_of]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # the process exited
        return None


def snapshot() -> tuple[dict[int, int], dict[int, int]]:
    """(parent of each pid, CPU ticks of each pid) for every process visible in /proc."""
    parent_of: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        text = _read(entry / "stat")
        if text is None:
            continue
        pid = int(entry.name)
        parent_of[pid], ticks[pid] = parse_stat(text)
    return parent_of, ticks


def rss_bytes(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        text = _read(PROC / str(pid) / "status")
        total += (parse_vmrss_bytes(text) or 0) if text else 0
    return total


@dataclass
class Sample:
    """One look at every group: seconds since start, RSS bytes and CPU cores used since the previous look."""

    t: float
    rss: dict[str, int]
    cpu: dict[str, float]
    machine_busy_cores: float


@dataclass
class ProcSampler:
    """Samples named process trees (plus their union, 'all') every `interval` seconds in a thread.

    Roots can be added while it runs (`track`), e.g. when a simulator starts after the job.
    """

    interval: float = 1.0
    max_samples: int = 7200  # a bound on memory: two hours at one sample a second
    samples: list[Sample] = field(default_factory=list)
    _roots: dict[str, set[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _started: float = 0.0

    def track(self, group: str, *pids: int) -> None:
        with self._lock:
            self._roots.setdefault(group, set()).update(pids)

    def start(self) -> ProcSampler:
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="bench-proc-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> ProcSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        last_ticks: dict[int, int] | None = None
        last_cpu = parse_cpu_line((PROC / "stat").read_text())
        last_t = time.monotonic()
        while not self._stop.is_set() and len(self.samples) < self.max_samples:
            parent_of, ticks = snapshot()
            now = time.monotonic()
            cpu_now = parse_cpu_line((PROC / "stat").read_text())
            with self._lock:
                roots = {g: set(p) for g, p in self._roots.items()}
            groups = {g: descendants(r, parent_of) for g, r in roots.items()}
            groups["all"] = set().union(*groups.values()) if groups else set()
            dt = max(now - last_t, 1e-6)
            # A process that appeared since the last look counts from 0 ticks (it started in between).
            previous = last_ticks if last_ticks is not None else ticks
            cpu = {g: sum(ticks[p] - previous.get(p, 0) for p in pids) / CLK_TCK / dt for g, pids in groups.items()}
            busy = (cpu_now[0] - last_cpu[0]) / max(cpu_now[1] - last_cpu[1], 1) * (os.cpu_count() or 1)
            rss = {g: rss_bytes(pids) for g, pids in groups.items()}
            self.samples.append(Sample(now - self._started, rss, cpu, busy))
            last_ticks, last_cpu, last_t = ticks, cpu_now, now
            self._stop.wait(self.interval)

    def peak_gib(self, group: str) -> float:
        return round(max((s.rss.get(group, 0) for s in self.samples), default=0) / GIB, 3)

    def mean_cpu(self, group: str, start: float = 0.0, end: float = float("inf")) -> float:
        """Mean CPU cores a group used over [start, end] seconds since the sampler started."""
        values = [s.cpu.get(group, 0.0) for s in self.samples[1:] if start <= s.t <= end]
        return round(sum(values) / len(values), 2) if values else 0.0

    def mean_machine_busy(self, start: float = 0.0, end: float = float("inf")) -> float:
        values = [s.machine_busy_cores for s in self.samples[1:] if start <= s.t <= end]
        return round(sum(values) / len(values), 2) if values else 0.0

    def summary(self, start: float = 0.0, end: float = float("inf")) -> dict[str, object]:
        groups = sorted({g for s in self.samples for g in s.rss})
        return {
            "samples": len(self.samples),
            "rss_peak_gib": {g: self.peak_gib(g) for g in groups},
            "cpu_cores_mean": {g: self.mean_cpu(g, start, end) for g in groups},
            "machine_busy_cores_mean": self.mean_machine_busy(start, end),
        }
