"""Resident memory and CPU of process trees (psutil), sampled once a second."""

from __future__ import annotations

import ctypes
import platform
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import psutil

GIB = 1024**3


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


@dataclass(frozen=True)
class ProcessLook:
    """One look at a process: its parent, CPU seconds so far (user + system) and resident memory."""

    ppid: int
    cpu_s: float
    rss: int


_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())  # the kcmp(2) syscall's number; Linux only
_KCMP_VM = 1
_libc = ctypes.CDLL(None, use_errno=True) if _KCMP is not None and sys.platform.startswith("linux") else None


def shares_address_space(a: int, b: int) -> bool:
    """Whether two processes use one address space (kcmp KCMP_VM).

    A child between posix_spawn (or vfork) and its exec does: the JVM spawns each Hadoop `chmod` that way, and /proc
    shows that child the JVM's whole RSS. False where kcmp is missing or refused.
    """
    if _libc is None:
        return False
    return bool(_libc.syscall(_KCMP, a, b, _KCMP_VM, 0, 0) == 0)


def resident_bytes(looks: Mapping[int, ProcessLook], pids: Iterable[int]) -> int:
    """The RSS of a set of processes, each address space once: a child sharing its parent's is not added."""
    members = set(pids)
    return sum(
        looks[pid].rss
        for pid in members
        if not (looks[pid].ppid in members and shares_address_space(pid, looks[pid].ppid))
    )


def snapshot() -> dict[int, ProcessLook]:
    """Every process visible now; one that exits while being read is left out."""
    looks: dict[int, ProcessLook] = {}
    for proc in psutil.process_iter(["ppid", "cpu_times", "memory_info"]):
        info = proc.info
        times, memory = info.get("cpu_times"), info.get("memory_info")
        if info.get("ppid") is None or times is None or memory is None:
            continue  # gone, or not ours to read
        looks[proc.pid] = ProcessLook(info["ppid"], times.user + times.system, memory.rss)
    return looks


def cpu_seconds(now: Mapping[int, ProcessLook], before: Mapping[int, ProcessLook], pids: Iterable[int]) -> float:
    """CPU seconds the processes used between two looks; one that started in between counts from 0."""
    return sum(now[p].cpu_s - (before[p].cpu_s if p in before else 0.0) for p in pids)


def machine_busy_and_total() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot; idle and iowait are not busy."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest is counted in user
    return total - idle, total


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
        last: dict[int, ProcessLook] | None = None
        last_cpu = machine_busy_and_total()
        last_t = time.monotonic()
        while not self._stop.is_set() and len(self.samples) < self.max_samples:
            looks = snapshot()
            now = time.monotonic()
            cpu_now = machine_busy_and_total()
            with self._lock:
                roots = {g: set(p) for g, p in self._roots.items()}
            parent_of = {pid: look.ppid for pid, look in looks.items()}
            groups = {g: descendants(r, parent_of) for g, r in roots.items()}
            groups["all"] = set().union(*groups.values()) if groups else set()
            dt = max(now - last_t, 1e-6)
            previous = last if last is not None else looks

            cpu = {g: cpu_seconds(looks, previous, pids) / dt for g, pids in groups.items()}
            busy = (cpu_now[0] - last_cpu[0]) / max(cpu_now[1] - last_cpu[1], 1e-6) * psutil.cpu_count()
            rss = {g: resident_bytes(looks, pids) for g, pids in groups.items()}
            self.samples.append(Sample(now - self._started, rss, cpu, busy))
            last, last_cpu, last_t = looks, cpu_now, now
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
