"""No secret on any command line: `ps` and /proc/<pid>/cmdline are readable by every local user.

A running `iotlake ingest` (its Python process and the JVM it launched) and every service of the test stack
are scanned for each value of the stack's secrets file and the ingest's own writer key. Environments are
fine: only the process's owner can read /proc/<pid>/environ.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from stack import StackLayout
from stack import proc as stack_proc
from streaming.core.config import PROJECT_ROOT, Settings
from tests.helpers import wait_for
from tests.integration.lake import stop_job

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 120.0


def _argv(pid: int) -> list[str] | None:
    """The arguments of a process (None once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (from /proc/<pid>/stat)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            out[int(stat.parent.name)] = int(fields[1])
    return out


def _descendants(root: int) -> set[int]:
    parents = _parents()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - found
        found |= frontier
    return found


def _stack_pids(layout: StackLayout) -> dict[str, int]:
    """service name -> pid of every live service of the test stack (its pid files), with their children."""
    out = {}
    for pidfile in sorted(layout.run.glob("*.pid")):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip())
            if stack_proc.pid_alive(pid):
                out[pidfile.stem] = pid
                for child in _descendants(pid):
                    out[f"{pidfile.stem} child {child}"] = child
    return out


def _leaks(pids: dict[str, int], secrets: dict[str, str]) -> list[str]:
    """One line per (process, secret) found in its arguments, the value itself replaced by ***."""
    found = []
    for what, pid in pids.items():
        argv = _argv(pid)
        if argv is None:
            continue
        for name, value in secrets.items():
            hits = [a.replace(value, "***") for a in argv if value in a]
            if hits:
                found.append(f"{what} (pid {pid}, {Path(argv[0]).name}): {name} in {hits}")
    return found


def test_no_secret_on_the_command_line_of_ingest_its_jvm_or_the_stack(
    settings: Settings,
    test_env: dict[str, str],
    stack_layout: StackLayout,
    stack_secrets: dict[str, str],
    tmp_path: Path,
) -> None:
    secrets = {
        **stack_secrets,
        "IOTLAKE_STORAGE__ACCESS_KEY": test_env["IOTLAKE_STORAGE__ACCESS_KEY"],
        "IOTLAKE_STORAGE__SECRET_KEY": test_env["IOTLAKE_STORAGE__SECRET_KEY"],
    }
    assert all(secrets.values())
    checkpoint_metadata = Path(test_env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"]) / "metadata"
    log = tmp_path / "ingest.log"
    with log.open("wb") as handle:
        ingest = subprocess.Popen(
            [sys.executable, "-m", "streaming.cli", "ingest"],
            env=test_env,
            cwd=PROJECT_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its JVM joins the group: killpg reaches both
        )
    try:
        # The query is up once Spark wrote the checkpoint's metadata; by then the JVM has touched S3A.
        wait_for(
            lambda: ingest.poll() is not None or checkpoint_metadata.exists(),
            START_TIMEOUT_S,
            interval=0.5,
            message=f"the streaming query to start ({checkpoint_metadata})",
        )
        assert ingest.poll() is None, f"ingest exited with {ingest.returncode}:\n{stack_proc.tail(log, 40)}"
        children = _descendants(ingest.pid)
        javas = [pid for pid in children if (argv := _argv(pid)) and Path(argv[0]).name == "java"]
        assert javas, f"no java process under ingest (pid {ingest.pid}); children: {sorted(children)}"

        services = _stack_pids(stack_layout)
        names = {name for name in services if " child " not in name}
        assert {"minio", "prometheus"} <= names and any(n.startswith("kafka") for n in names), names
        pids = {"ingest": ingest.pid, **{f"ingest child {pid}": pid for pid in children}, **services}

        leaks = _leaks(pids, secrets)
        assert not leaks, "secrets on command lines (readable by every local user):\n" + "\n".join(leaks)
    finally:
        stop_job(ingest, STOP_TIMEOUT_S)
