"""Detached service processes: start in a new session, pid files, readiness with deadlines, stop."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from stack import logrotate
from stack.addresses import HostPort, bind_host
from streaming.core.errors import StackError

PRIVATE_UMASK = 0o077  # what the stack's processes create (data, logs) is readable by its user only
EXEC_TIMEOUT_S = 5.0  # how long `start` waits for the kernel to load a child's program


@dataclass(frozen=True)
class Service:
    """A process of the stack: its name, pid file, log file and a marker found in its command line."""

    name: str
    pidfile: Path
    log: Path  # where its stdout and stderr go
    marker: str  # a string of its command line that proves a pid is still this service (pids get reused)
    extra_logs: tuple[Path, ...] = ()  # logs the service writes itself, shown too when it fails

    def log_tails(self, lines: int = 25) -> str:
        """The last lines of each non-empty log, each under its path."""
        parts = []
        for path in (*self.extra_logs, self.log):
            text = tail(path, lines)
            if text.strip():
                parts.append(f"--- {path} (last lines)\n{text}")
        return "\n".join(parts) or f"(no output in {self.log})"


def tail(path: Path, lines: int = 25) -> str:
    """The last lines of a log file ('' if missing)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _reap(pid: int) -> None:
    """Collect an exited child of this process, so it doesn't linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int) -> bool:
    """True if the process exists and is not a zombie."""
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def group_alive(pgid: int) -> bool:
    """True while a live (non-zombie) process is in the process group `pgid`."""
    try:
        entries = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
    except OSError:
        entries = []
    if not entries:  # no /proc: ask the kernel (zombies count as alive here)
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in entries:
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the group `pgid` (a child started in its own session leads one)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def cmdline(pid: int) -> str | None:
    """The command line of a process, arguments joined by spaces (None without /proc)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return None


def read_pid(service: Service) -> int | None:
    """The pid in the service's pid file if that process is alive and still is the service, else None."""
    try:
        pid = int(service.pidfile.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    if not pid_alive(pid):
        return None
    cmd = cmdline(pid)
    if cmd is not None and service.marker not in cmd:
        return None  # the pid was reused by an unrelated process
    return pid


def port_free(address: HostPort) -> bool:
    """True if nothing listens on the address (a bind would succeed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host(address), address.port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise StackError(f"Can't bind {address}: {e}. Is {address.host} an address of this machine?") from e
    return True


def require_free_ports(service: str, ports: Mapping[str, HostPort], setting: str) -> None:
    """Raise a StackError naming the port and the fix if any of `ports` is taken by another process."""
    for role, address in ports.items():
        if not port_free(address):
            raise StackError(
                f"Can't start {service}: its {role} port {address} is already in use by another process. "
                f"Find it with `ss -ltnp 'sport = :{address.port}'` and stop it, or choose other ports "
                f"with {setting}."
            )


def reuse_or_require_free(
    name: str, service: Service, marker: str, ports: Mapping[str, HostPort], setting: str
) -> int | None:
    """The pid of our running `service` if its command line has `marker` (the same ports), else a StackError;
    when it doesn't run, None after checking `ports` are free."""
    pid = read_pid(service)
    if pid is None:
        require_free_ports(name, ports, setting)
        return None
    line = cmdline(pid)
    if line is not None and marker not in line:
        raise StackError(
            f"{name} is already running (pid {pid}) with other ports than now. Stop it with "
            "`python -m stack down`, then run `python -m stack up` again."
        )
    return pid


def spawn(
    name: str,
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    verb: str = "starting",
    fresh_log: bool = False,
) -> subprocess.Popen[bytes]:
    """The one way our processes start children: stdin closed, stdout and stderr appended to `log` after a
    `=== <time> <verb> <name>` line (or a fresh log), umask 077, in a new session (so the child's own children,
    e.g. a JVM, are in its group and `stop_child` reaches them). A command that can't start is a StackError."""
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) if fresh_log else logrotate.open_log(log)
    try:
        os.write(fd, f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {verb} {name}\n".encode())
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            umask=PRIVATE_UMASK,
        )
    except OSError as e:
        raise StackError(f"Can't start {name} ({argv[0]}): {e}. Run `make install`.") from e
    finally:
        os.close(fd)


def stop_child(child: subprocess.Popen[bytes], timeout: float = 60.0) -> int | None:
    """SIGTERM a child `spawn` started, alone, wait up to `timeout`, then SIGKILL its group; a straggler of its
    group (an orphaned JVM) is killed either way. Safe to call twice. Returns its exit code.

    Not the group first: `iotlake ingest` and the sidecar stop their query through their JVM, which must still
    answer while they handle the signal.
    """
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(child.pid)
            child.wait(30)
    kill_group(child.pid)
    return child.returncode


def start(
    service: Service,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    rotation: logrotate.RotationPolicy | None = None,
) -> int:
    """Start argv detached (new session, stdin closed, umask 077, output appended to the log, which is
    rotated first if it grew large); write the pid file."""
    service.pidfile.parent.mkdir(parents=True, exist_ok=True)
    logrotate.rotate_if_large(service.log, rotation or logrotate.RotationPolicy())
    proc = spawn(service.name, argv, service.log, env, cwd)
    _wait_exec(proc.pid)
    tmp = service.pidfile.with_suffix(".pid.tmp")
    tmp.write_text(f"{proc.pid}\n")
    tmp.replace(service.pidfile)
    return proc.pid


def _wait_exec(pid: int, timeout: float = EXEC_TIMEOUT_S) -> None:
    """Wait until the kernel has loaded a child's program: for some milliseconds after `Popen` returns, its
    /proc/<pid>/cmdline is empty, and `read_pid` would take the pid for a reused one."""
    deadline = time.monotonic() + timeout
    while cmdline(pid) == "" and pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.001)


def wait_ready(
    service: Service,
    pid: int,
    probe: Callable[[], bool],
    timeout: float,
    what: str,
    interval: float = 0.2,
) -> float:
    """Poll `probe` until it answers True; fail fast if the process dies. Returns the seconds waited."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if not pid_alive(pid):
            service.pidfile.unlink(missing_ok=True)
            raise StackError(f"{service.name} (pid {pid}) exited during start-up.\n{service.log_tails()}")
        if probe():
            return time.monotonic() - started
        if time.monotonic() >= deadline:
            raise StackError(
                f"{service.name} (pid {pid}) did not become ready ({what}) within {timeout:.0f}s. It is left "
                f"running for inspection; stop it with `python -m stack down`.\n{service.log_tails()}"
            )
        time.sleep(interval)


def stop(service: Service, timeout: float = 30.0) -> int | None:
    """SIGTERM the service's process group, wait up to `timeout`, then SIGKILL. Returns the pid it stopped."""
    pid = read_pid(service)
    if pid is None:
        service.pidfile.unlink(missing_ok=True)
        return None
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        _signal_group(pid, signal.SIGKILL)
        kill_deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < kill_deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            raise StackError(f"{service.name} (pid {pid}) survived SIGKILL. Check `ps -p {pid}` by hand.")
    service.pidfile.unlink(missing_ok=True)
    return pid


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the session the service leads (it was started with a new session); fall back to the pid."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def run_checked(
    argv: Sequence[str],
    what: str,
    fix: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
    umask: int = -1,
) -> str:
    """Run a command to completion; on failure raise a StackError with its output's tail and the fix.

    With `log`, the output goes to that file (long builds, created 0600) instead of memory. `umask`: the
    command's (-1: this process's; PRIVATE_UMASK for commands that write the stack's data).
    """
    env_dict = dict(env) if env is not None else None
    try:
        if log is None:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                env=env_dict,
                cwd=cwd,
                umask=umask,
            )
            output, code = done.stdout + done.stderr, done.returncode
        else:
            log.parent.mkdir(parents=True, exist_ok=True)
            with os.fdopen(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, logrotate.LOG_MODE), "w") as f:
                code = subprocess.run(
                    list(argv),
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=timeout,
                    check=False,
                    env=env_dict,
                    cwd=cwd,
                    umask=umask,
                ).returncode
            output = tail(log)
    except subprocess.TimeoutExpired as e:
        raise StackError(f"{what} took more than {timeout:.0f}s and was stopped. {fix}") from e
    except OSError as e:
        raise StackError(f"{what} could not run ({argv[0]}: {e}). {fix}") from e
    if code != 0:
        out = "\n".join(output.splitlines()[-25:])
        where = f" (full output: {log})" if log else ""
        raise StackError(f"{what} failed (exit {code}){where}. {fix}\n{out}")
    return output
