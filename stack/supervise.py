"""The supervisor of `make run`'s long-running children (the ingest job, the maintenance sidecar).

A child that dies is restarted after an exponential backoff; more than `max_restarts` deaths within
`window_s` and the supervisor gives up loudly (GaveUp, naming the child's log). Each child runs in its own
session: when it dies, what it left behind (the ingest's Spark JVM) is killed with it, and the restart waits
until that process group is gone, so two drivers never run on one checkpoint. The supervisor does not run by
itself: its owner calls `tick()` in its loop (no threads), and `tick()` also rotates the logs it was given.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stack import logrotate, proc
from streaming.core.errors import StackError

GROUP_EXIT_TIMEOUT_S = 30.0  # how long a dead child's leftovers may take to vanish after SIGKILL


@dataclass(frozen=True)
class RestartPolicy:
    """Restart after base_backoff_s, doubling per death within window_s up to max_backoff_s; give up when
    more than max_restarts deaths fall within window_s."""

    base_backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    max_restarts: int = 5
    window_s: float = 600.0

    def __post_init__(self) -> None:
        if self.base_backoff_s <= 0:
            raise StackError(f"Restart policy: base_backoff_s must be > 0, got {self.base_backoff_s:g}.")
        if self.max_backoff_s < self.base_backoff_s:
            raise StackError(
                f"Restart policy: max_backoff_s ({self.max_backoff_s:g}) must be >= base_backoff_s "
                f"({self.base_backoff_s:g})."
            )
        if self.max_restarts < 0:
            raise StackError(f"Restart policy: max_restarts (--max-restarts) must be >= 0, got {self.max_restarts}.")
        if self.window_s <= 0:
            raise StackError(f"Restart policy: window_s (--restart-window) must be > 0, got {self.window_s:g}.")

    def recent(self, deaths: Sequence[float], now: float) -> int:
        """How many of the death times fall within the window ending now."""
        return sum(1 for t in deaths if now - t < self.window_s)

    def decide(self, deaths: Sequence[float], now: float) -> float | None:
        """Seconds to wait before restarting, given every death time (the latest included); None: give up."""
        recent = self.recent(deaths, now)
        if recent > self.max_restarts:
            return None
        return float(min(self.base_backoff_s * 2 ** max(recent - 1, 0), self.max_backoff_s))


@dataclass(frozen=True)
class Death:
    at: float  # the supervisor's clock when the death was noticed
    pid: int
    code: int  # exit status; -N: killed by signal N


class GaveUp(StackError):
    """A child died more often than its restart policy allows."""


def exit_text(code: int | None) -> str:
    """'exit 3', 'killed by SIGKILL (-9)' or 'running'."""
    if code is None:
        return "running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name} ({code})"
        except ValueError:
            return f"killed by signal {-code} ({code})"
    return f"exit {code}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class SupervisedChild:
    """One long-running child: its command, environment, log file (appended, 0600) and its deaths."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        policy: RestartPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name, self.argv, self.env, self.log = name, list(argv), dict(env), log
        self.policy = policy or RestartPolicy()
        self.clock = clock
        self.process: subprocess.Popen[bytes] | None = None
        self.deaths: list[Death] = []
        self.restarts = 0
        self.started_at: float | None = None
        self.last_code: int | None = None
        self._restart_at: float | None = None
        self._dead_group: int | None = None

    @property
    def pid(self) -> int | None:
        """The running process's pid (None: not started, dead, or waiting for its restart)."""
        return self.process.pid if self.process is not None else None

    @property
    def restarting(self) -> bool:
        return self._restart_at is not None

    def start(self) -> None:
        """Start the child in a new session, output appended to its log, umask 077."""
        verb = "restarting" if self.deaths else "starting"
        self.process = proc.spawn(self.name, self.argv, self.log, self.env, verb=verb)
        self.started_at = self.clock()

    def check(self) -> str | None:
        """One supervision step: notice a death (kill its leftovers, schedule the restart) or do a due
        restart. Returns what happened, for the live view (None: nothing). Raises GaveUp."""
        now = self.clock()
        if self._restart_at is not None:
            return self._maybe_restart(now)
        if self.process is None:
            return None
        code = self.process.poll()
        if code is None:
            return None
        pid = self.process.pid
        self.process, self.last_code = None, code
        proc.kill_group(pid)  # the ingest's JVM must not outlive its driver
        self.deaths.append(Death(now, pid, code))
        delay = self.policy.decide([d.at for d in self.deaths], now)
        if delay is None:
            raise GaveUp(
                f"{self.name} died {self.policy.recent([d.at for d in self.deaths], now)} times within "
                f"{self.policy.window_s:.0f}s (last: {exit_text(code)}); giving up. Its log: {self.log}. "
                "Fix the cause shown there and run again (to allow more restarts: --max-restarts, "
                f"--restart-window).\n--- {self.log} (last lines)\n{proc.tail(self.log)}"
            )
        self._restart_at, self._dead_group = now + delay, pid
        number = self.policy.recent([d.at for d in self.deaths], now)
        return (
            f"{self.name} (pid {pid}) died: {exit_text(code)}; restarting in {delay:.0f}s "
            f"(restart {number} of at most {self.policy.max_restarts} within {self.policy.window_s:.0f}s; "
            f"log {self.log})"
        )

    def _maybe_restart(self, now: float) -> str | None:
        assert self._restart_at is not None
        if now < self._restart_at:
            return None
        if self._dead_group is not None and proc.group_alive(self._dead_group):
            if now - self._restart_at > GROUP_EXIT_TIMEOUT_S:
                raise StackError(
                    f"Processes of {self.name}'s dead process group {self._dead_group} survive SIGKILL; not "
                    f"restarting it beside them. Check `ps -g {self._dead_group}` by hand."
                )
            return None
        self._restart_at = self._dead_group = None
        self.restarts += 1
        self.start()
        return f"{self.name}: restarted, pid {self.pid} (restart {self.restarts}; log {self.log})"

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM the child alone (it stops cleanly, then its JVM), wait up to `timeout`, then SIGKILL its
        whole group. Returns its exit status (the last death's if it was waiting for a restart)."""
        self._restart_at = None
        process, self.process = self.process, None
        if process is None:
            return self.last_code
        self.last_code = proc.stop_child(process, timeout)
        return self.last_code

    def tail(self, lines: int = 15) -> str:
        return proc.tail(self.log, lines)


class Supervisor:
    """Checks its children each tick and rotates their logs (and any other logs it was given)."""

    def __init__(
        self,
        children: Sequence[SupervisedChild],
        rotation: logrotate.RotationPolicy | None = None,
        other_logs: Sequence[Path] = (),
    ) -> None:
        self.children = list(children)
        self.rotation = rotation or logrotate.RotationPolicy()
        self.other_logs = list(other_logs)

    def tick(self) -> list[str]:
        """One step for every child (see SupervisedChild.check) and a log rotation. Raises GaveUp."""
        events = [e for e in (c.check() for c in self.children) if e is not None]
        logrotate.rotate_all([*(c.log for c in self.children), *self.other_logs], self.rotation)
        return events

    def stop(self, timeout: float = 60.0) -> dict[str, int | None]:
        """Stop every child, the last started first."""
        return {c.name: c.stop(timeout) for c in reversed(self.children)}

    def deaths_text(self) -> str:
        """For the live view: '' while nothing died, else 'deaths ingest 1 (restarting)' and the like."""
        parts = []
        for c in self.children:
            if c.deaths:
                parts.append(f"{c.name} {len(c.deaths)}{' (restarting)' if c.restarting else ''}")
        return f"deaths {', '.join(parts)}" if parts else ""

    def summary(self) -> list[str]:
        """One line per child: deaths, restarts and the last death."""
        lines = []
        for c in self.children:
            text = f"{c.name}: {_plural(len(c.deaths), 'death')}, {_plural(c.restarts, 'restart')}"
            if c.deaths:
                text += f" (last: {exit_text(c.deaths[-1].code)}, pid {c.deaths[-1].pid}); log {c.log}"
            lines.append(text)
        return lines
