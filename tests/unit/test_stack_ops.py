"""Operations of the native stack: the `make run` supervisor, log rotation, private state, Prometheus' flags."""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import sys
import time
from pathlib import Path

import pytest

from stack import logkeeper, logrotate, proc
from stack import prometheus as prom
from stack.install import Installed
from stack.layout import StackLayout
from stack.supervise import GaveUp, RestartPolicy, SupervisedChild, Supervisor
from streaming.cli import main as iotlake_main
from streaming.cli import run as stack_run
from streaming.core.config import load_settings
from streaming.core.errors import StackError
from streaming.lake.health import Commit
from tests.helpers import wait_for

pytestmark = pytest.mark.unit

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- restart policy (pure) ------------------------------------------------------------------------------


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    policy = RestartPolicy(base_backoff_s=1.0, max_backoff_s=5.0, max_restarts=10, window_s=600.0)
    deaths: list[float] = []
    delays = []
    for i in range(5):
        deaths.append(100.0 + i)
        delays.append(policy.decide(deaths, now=100.0 + i))
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_gives_up_after_max_restarts_within_the_window() -> None:
    policy = RestartPolicy(base_backoff_s=1.0, max_backoff_s=60.0, max_restarts=3, window_s=60.0)
    assert policy.decide([0.0, 10.0, 20.0], now=20.0) == 4.0  # third restart
    assert policy.decide([0.0, 10.0, 20.0, 30.0], now=30.0) is None  # a fourth death within 60 s: give up


def test_deaths_outside_the_window_are_forgotten_and_the_backoff_resets() -> None:
    policy = RestartPolicy(base_backoff_s=2.0, max_backoff_s=60.0, max_restarts=3, window_s=60.0)
    # Three old deaths (more than 60 s ago) and one now: a fresh first restart, with the base backoff.
    assert policy.decide([0.0, 5.0, 10.0, 200.0], now=200.0) == 2.0


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"base_backoff_s": 0.0}, "base_backoff_s"),
        ({"base_backoff_s": 10.0, "max_backoff_s": 5.0}, "max_backoff_s"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"window_s": 0.0}, "window_s"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_setting(kwargs: dict[str, float], needle: str) -> None:
    with pytest.raises(StackError, match=needle):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]


# --- supervised child (real processes, injected clock) ------------------------------------------------------


def _child(tmp_path: Path, clock: FakeClock, policy: RestartPolicy, argv: list[str] | None = None) -> SupervisedChild:
    return SupervisedChild("dummy", argv or SLEEPER, dict(os.environ), tmp_path / "logs" / "dummy.log", policy, clock)


def test_a_dead_child_is_restarted_after_its_backoff(tmp_path: Path) -> None:
    clock = FakeClock()
    child = _child(tmp_path, clock, RestartPolicy(base_backoff_s=5.0, max_restarts=3, window_s=600.0))
    sup = Supervisor([child])
    child.start()
    try:
        first = child.pid
        assert first is not None and sup.tick() == []
        os.kill(first, signal.SIGKILL)
        events = wait_for(sup.tick, timeout=10, message="the death noticed")
        assert "dummy (pid" in events[0] and "-9" in events[0] and "in 5s" in events[0]
        assert child.pid is None and child.deaths[0].code == -signal.SIGKILL
        assert sup.tick() == []  # still within the backoff: nothing restarts
        clock.now += 5.0
        events = wait_for(sup.tick, timeout=10, message="the restart")
        assert "restarted" in events[0] and child.restarts == 1
        assert child.pid is not None and child.pid != first and proc.pid_alive(child.pid)
        assert "dummy: 1 death, 1 restart" in sup.summary()[0]
    finally:
        sup.stop(timeout=10)
    assert child.pid is None or not proc.pid_alive(child.pid)


def test_giving_up_names_the_log_file_and_the_last_exit(tmp_path: Path) -> None:
    clock = FakeClock()
    argv = [sys.executable, "-c", "import sys; print('boom: broken config', flush=True); sys.exit(3)"]
    child = _child(tmp_path, clock, RestartPolicy(base_backoff_s=1.0, max_restarts=2, window_s=600.0), argv)
    sup = Supervisor([child])
    child.start()
    try:
        with pytest.raises(GaveUp) as raised:
            for _ in range(3):  # death, restart, death, restart, death -> give up
                wait_for(sup.tick, timeout=10, message="a death")
                clock.now += 10.0
                wait_for(sup.tick, timeout=10, message="a restart")
        text = str(raised.value)
        assert str(child.log) in text and "exit 3" in text and "3 times within 600s" in text
        assert "boom: broken config" in text  # the log's tail
        assert "--max-restarts" in text  # the fix
    finally:
        sup.stop(timeout=10)


def test_a_dead_childs_orphans_are_killed_before_the_restart(tmp_path: Path) -> None:
    """The ingest's JVM is a child of the Python driver: it must not outlive it and run beside the new one."""
    clock = FakeClock()
    grandchild = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time, pathlib;"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
        f"pathlib.Path({str(grandchild)!r}).write_text(str(p.pid)); time.sleep(120)"
    )
    child = _child(tmp_path, clock, RestartPolicy(base_backoff_s=1.0), [sys.executable, "-c", code])
    sup = Supervisor([child])
    child.start()
    try:
        orphan = int(wait_for(lambda: grandchild.exists() and grandchild.read_text(), timeout=10))
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        wait_for(sup.tick, timeout=10, message="the death noticed")
        wait_for(lambda: not proc.pid_alive(orphan), timeout=10, message="the orphan killed")
    finally:
        sup.stop(timeout=10)


def test_stop_sends_sigterm_to_the_child_only_then_clears_its_group(tmp_path: Path) -> None:
    clock = FakeClock()
    marker = tmp_path / "got-sigterm"
    code = (
        "import signal, sys, time, pathlib;"
        f"signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path({str(marker)!r}).touch(), sys.exit(0)));"
        "time.sleep(120)"
    )
    child = _child(tmp_path, clock, RestartPolicy(), [sys.executable, "-c", code])
    child.start()
    wait_for(lambda: "signal" in (proc.cmdline(child.pid or 0) or ""), timeout=10)
    # Give the interpreter time to install its handler: poll the marker-free state through a second probe.
    wait_for(lambda: _handler_installed(child.pid or 0), timeout=10, message="the SIGTERM handler")
    assert child.stop(timeout=10) == 0
    assert marker.exists()


def _handler_installed(pid: int) -> bool:
    """True once the process catches SIGTERM (SigCgt in /proc/<pid>/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def test_children_logs_are_appended_private_and_rotated(tmp_path: Path) -> None:
    clock = FakeClock()
    # The first run writes 5 KB (rotated by the tick that notices its exit); the second writes 3 KB, below
    # max_bytes, so the tick that restarts it can't rotate its output away however fast it writes.
    ran = tmp_path / "ran-once"
    code = (
        f"import sys, pathlib; m = pathlib.Path({str(ran)!r}); n = 3000 if m.exists() else 5000; m.touch();"
        "sys.stdout.write('x' * n); sys.stdout.flush()"
    )
    child = _child(tmp_path, clock, RestartPolicy(base_backoff_s=1.0, max_restarts=5), [sys.executable, "-c", code])
    sup = Supervisor([child], rotation=logrotate.RotationPolicy(max_bytes=4096, keep=2))
    child.start()
    try:
        wait_for(sup.tick, timeout=10, message="the first exit")  # this tick also rotates the 5 KB log
        first = logrotate.rotated(child.log, 1)
        assert first.read_bytes().startswith(b"\n=== ") and first.stat().st_size > 5000  # header + output
        assert child.log.stat().st_size == 0
        assert stat.S_IMODE(child.log.stat().st_mode) == stat.S_IMODE(first.stat().st_mode) == 0o600
        clock.now += 10.0
        wait_for(sup.tick, timeout=10, message="the restart")
        wait_for(lambda: child.log.stat().st_size > 3000, timeout=10, message="the second run's output")
        second = child.log.read_bytes()
        assert second.startswith(b"\n=== ") and second.count(b"=== ") == 1  # appended to the truncated log
        assert second.count(b"x") == 3000 and logrotate.rotated(child.log, 1).read_bytes().count(b"x") == 5000
    finally:
        sup.stop(timeout=10)


# --- log rotation ---------------------------------------------------------------------------------------


def test_rotation_copies_and_truncates_keeping_a_few(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    policy = logrotate.RotationPolicy(max_bytes=100, keep=2)
    log.write_bytes(b"a" * 99)
    assert not logrotate.rotate_if_large(log, policy)
    with log.open("ab") as f:
        f.write(b"a")
    assert logrotate.rotate_if_large(log, policy)
    assert log.read_bytes() == b"" and logrotate.rotated(log, 1).read_bytes() == b"a" * 100
    log.write_bytes(b"b" * 150)
    assert logrotate.rotate_if_large(log, policy)
    log.write_bytes(b"c" * 200)
    assert logrotate.rotate_if_large(log, policy)
    assert logrotate.rotated(log, 1).read_bytes() == b"c" * 200
    assert logrotate.rotated(log, 2).read_bytes() == b"b" * 150
    assert not logrotate.rotated(log, 3).exists()  # keep=2: the oldest is dropped
    assert stat.S_IMODE(logrotate.rotated(log, 1).stat().st_mode) == 0o600
    assert not logrotate.rotate_if_large(tmp_path / "missing.log", policy)


def test_a_writer_in_append_mode_keeps_writing_at_the_start_after_a_rotation(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    policy = logrotate.RotationPolicy(max_bytes=10, keep=1)
    with log.open("ab") as writer:
        writer.write(b"0123456789-before")
        writer.flush()
        assert logrotate.rotate_if_large(log, policy)
        writer.write(b"after")
        writer.flush()
    assert log.read_bytes() == b"after"  # no hole of zeros where the old content was
    assert logrotate.rotated(log, 1).read_bytes() == b"0123456789-before"


@pytest.mark.parametrize(("kwargs", "needle"), [({"max_bytes": 0}, "max_bytes"), ({"keep": 0}, "keep")])
def test_a_bad_rotation_policy_is_refused(kwargs: dict[str, int], needle: str) -> None:
    with pytest.raises(StackError, match=needle):
        logrotate.RotationPolicy(**kwargs)


def test_service_start_rotates_its_large_log(tmp_path: Path) -> None:
    svc = proc.Service("dummy", tmp_path / "run" / "dummy.pid", tmp_path / "logs" / "dummy.log", "dummy-marker")
    svc.log.parent.mkdir(parents=True)
    svc.log.write_bytes(b"old " * (logrotate.DEFAULT_MAX_BYTES // 4 + 1))
    pid = proc.start(svc, [sys.executable, "-c", "import time; time.sleep(60)", "dummy-marker"])
    try:
        assert logrotate.rotated(svc.log, 1).stat().st_size > logrotate.DEFAULT_MAX_BYTES
        assert svc.log.stat().st_size < 1000
    finally:
        proc.stop(svc, timeout=10)
    assert pid


# --- private state --------------------------------------------------------------------------------------


def test_stack_home_and_its_folders_are_private(tmp_path: Path) -> None:
    home = tmp_path / "var"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    layout = StackLayout(home=home, cache=tmp_path / "cache")
    layout.make_dirs()
    for d in (home, layout.logs, layout.run, layout.kafka_data, layout.minio_data, layout.minio_data.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


def test_services_start_with_a_private_umask(tmp_path: Path) -> None:
    svc = proc.Service("dummy", tmp_path / "run" / "dummy.pid", tmp_path / "logs" / "dummy.log", "dummy-marker")
    made = tmp_path / "made-by-the-service"
    code = f"import pathlib, time; pathlib.Path({str(made)!r}).mkdir(); (pathlib.Path({str(made)!r}) / 'f').touch()"
    pid = proc.start(svc, [sys.executable, "-c", code + "; time.sleep(60)", "dummy-marker"])
    try:
        wait_for(lambda: (made / "f").exists(), timeout=10, message="the service's files")
        assert stat.S_IMODE(made.stat().st_mode) == 0o700
        assert stat.S_IMODE((made / "f").stat().st_mode) == 0o600
        assert stat.S_IMODE(svc.log.stat().st_mode) == 0o600
    finally:
        proc.stop(svc, timeout=10)
    assert pid


# --- Prometheus -----------------------------------------------------------------------------------------


def test_prometheus_runs_without_the_lifecycle_api(tmp_path: Path) -> None:
    layout = StackLayout(home=tmp_path, cache=tmp_path / "cache")
    inst = Installed(
        java=Path("/usr/bin/java"),
        kafka_libs=tmp_path,
        minio=Path("/bin/minio"),
        prometheus=Path("/usr/bin/prometheus"),
        promtool=Path("/usr/bin/promtool"),
    )
    argv = prom._argv(inst, layout, prom.address(load_settings(env={})))
    assert not any(a.startswith("--web.enable-lifecycle") for a in argv), argv
    assert not any(a.startswith("--web.enable-admin-api") for a in argv), argv


# --- make run's wiring ----------------------------------------------------------------------------------


def test_run_supervises_the_job_and_the_sidecar_and_rotates_every_service_log(tmp_path: Path) -> None:
    layout = StackLayout(home=tmp_path, cache=tmp_path / "cache")
    sup, ingest = stack_run.supervisor(load_settings(env={}), layout, {"A": "1"}, RestartPolicy(max_restarts=2))
    assert [c.name for c in sup.children] == ["ingest", "maintain"] and sup.children[0] is ingest
    assert ingest.argv[-2:] == ["streaming.cli", "ingest"] and sup.children[1].argv[-1] == "maintain"
    assert sup.children[1].env["IOTLAKE_MAINTENANCE__INTERVAL"] == stack_run.SIDECAR_INTERVAL
    assert all(c.policy.max_restarts == 2 and c.log.parent == layout.logs for c in sup.children)
    logs = {p.name for p in sup.other_logs}
    assert {"kafka.out", "minio.log", "prometheus.log", "spark-master.log", "sensor-sim.log"} <= logs
    assert "kafka.log" not in logs  # Kafka's log4j file rolls by itself
    off = load_settings(env={"IOTLAKE_MAINTENANCE__ENABLED": "false"})
    assert [c.name for c in stack_run.supervisor(off, layout, {})[0].children] == ["ingest"]


def test_first_readings_are_the_first_inserting_merge_after_the_simulator_started() -> None:
    start = 1_700_000_000_000
    commits = [  # newest first, as a table's history lists them
        Commit(9, start + 9_000, "MERGE", {"numTargetRowsInserted": 40}),
        Commit(8, start + 7_000, "OPTIMIZE", {"numAddedFiles": 1, "numRemovedFiles": 6}),
        Commit(7, start + 6_000, "MERGE", {"numTargetRowsInserted": 12}),
        Commit(6, start + 5_500, "MERGE", {"numTargetRowsInserted": 0}),  # a batch of duplicates only
        Commit(5, start - 1, "MERGE", {"numTargetRowsInserted": 100}),  # the previous run's last batch
    ]
    assert stack_run.first_insert_after(commits, start) == 6.0
    assert stack_run.first_insert_after([commits[1], commits[3], commits[4]], start) is None


def test_run_timing_gives_the_lag_in_trigger_intervals_and_says_what_never_happened() -> None:
    timeline = stack_run.Timeline(5_000, 1.0, sim_started_ms=1, first_readings_s=8.31, peak_lag=91_000, drain_s=21.04)
    first, lag, drain = timeline.lines()
    assert first == "first readings committed 8.3 s after the simulator started"
    assert lag.startswith("peak lag 91,000 messages (18.2 trigger intervals' worth at 5,000/s and 1 s;")
    assert drain.startswith("drained 21.0 s after the simulator stopped")
    never = stack_run.Timeline(5_000, 2.0, sim_started_ms=1).lines()
    assert never[0] == "no readings committed during this run"
    assert never[1].startswith("peak lag 0 messages (0.0 trigger intervals' worth at 5,000/s and 2 s;")
    assert never[2] == f"not drained within {stack_run.DRAIN_TIMEOUT_S:.0f} s of the simulator stopping"


def test_run_refuses_a_bad_restart_policy_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    assert iotlake_main(["run", "--max-restarts", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--max-restarts" in err and "Traceback" not in err


# --- the log keeper (rotation while only `make up` runs) ----------------------------------------------------


def test_a_log_another_rotator_holds_is_left_alone(tmp_path: Path) -> None:
    log = tmp_path / "svc.log"
    log.write_bytes(b"x" * 200)
    policy = logrotate.RotationPolicy(max_bytes=100, keep=2)
    with log.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert not logrotate.rotate_if_large(log, policy)
    assert logrotate.rotate_if_large(log, policy)


def test_the_log_keeper_rotates_the_stacks_logs_until_stopped(tmp_path: Path) -> None:
    layout = StackLayout(home=tmp_path / "home", cache=tmp_path / "cache")
    layout.make_dirs()
    minio_log, ingest_log = layout.log("minio"), layout.log("ingest")
    for log in (minio_log, ingest_log):
        log.write_bytes(b"y" * 5000)
    pid, reused = logkeeper.launch(layout, logrotate.RotationPolicy(max_bytes=4096, keep=2), interval_s=0.2)
    try:
        assert not reused and proc.read_pid(logkeeper.service(layout)) == pid
        assert logkeeper.launch(layout)[0] == pid  # a second `up` reuses it
        wait_for(lambda: logrotate.rotated(minio_log, 1).exists(), timeout=30, message="minio.log rotated")
        wait_for(lambda: logrotate.rotated(ingest_log, 1).exists(), timeout=30, message="ingest.log rotated")
        assert minio_log.stat().st_size == 0
    finally:
        assert logkeeper.stop(layout) == pid
    assert not proc.pid_alive(pid)
    assert minio_log in logkeeper.logs(layout) and layout.log("kafka") not in logkeeper.logs(layout)


def test_a_started_service_is_found_by_its_pid_file_at_once(tmp_path: Path) -> None:
    """`start` returns once the command runs. For some milliseconds after `Popen` returns, the kernel is still
    loading the new program and /proc/<pid>/cmdline is empty, so `read_pid` took the pid for a reused one and
    `stop` left the process running (the log keeper test failed that way beside a second pytest worker)."""
    for n in range(50):
        svc = proc.Service(f"sleeper{n}", tmp_path / f"s{n}.pid", tmp_path / f"s{n}.log", f"time.sleep({600 + n})")
        pid = proc.start(svc, [sys.executable, "-c", f"import time; time.sleep({600 + n})"])
        try:
            assert svc.marker in (proc.cmdline(pid) or ""), f"start {n}: {proc.cmdline(pid)!r}"
            assert proc.read_pid(svc) == pid
        finally:
            proc.kill_group(pid)


def test_spawn_logs_after_a_banner_and_stop_child_reaches_the_whole_group(tmp_path: Path) -> None:
    """The one child-process wrapper: output appended after `=== ... starting name`, private files, and a
    grandchild (like the ingest's JVM) in the child's group is gone after stop_child."""
    log = tmp_path / "logs" / "child.log"
    log.parent.mkdir()
    log.write_text("earlier run\n")
    script = (
        "import subprocess, time\np = subprocess.Popen(['sleep', '300'])\nprint(p.pid, flush=True)\ntime.sleep(300)\n"
    )
    child = proc.spawn("child", [sys.executable, "-c", script], log, env=dict(os.environ))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not log.read_text().split()[-1].isdigit():
        time.sleep(0.05)
    text = log.read_text()
    assert text.startswith("earlier run\n\n=== ") and " starting child\n" in text, text
    grandchild = int(text.split()[-1])
    assert os.getpgid(grandchild) == child.pid
    assert os.getsid(child.pid) == child.pid  # it leads its session: the sidecar then lowers its scheduling group
    assert proc.stop_child(child, timeout=10) == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.pid_alive(grandchild):
        time.sleep(0.05)
    assert not proc.pid_alive(grandchild)
    assert proc.stop_child(child) == -signal.SIGTERM  # twice is harmless


def test_stop_child_lets_the_child_stop_its_own_jvm_first(tmp_path: Path) -> None:
    """SIGTERM goes to the child alone: `iotlake ingest` stops its streaming query through its JVM, so the JVM (a
    grandchild in the same group) must still be alive while the child handles the signal. It is killed after."""
    log = tmp_path / "child.log"
    script = """
import signal, subprocess, sys, time
jvm = subprocess.Popen(['sleep', '300'])
def stop(*_):
    deadline = time.monotonic() + 2  # what query.stop() takes: the JVM has to answer meanwhile
    while time.monotonic() < deadline:
        if jvm.poll() is not None:
            print('the jvm died under the handler', flush=True)
            sys.exit(3)
        time.sleep(0.05)
    jvm.terminate()
    jvm.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print('ready', jvm.pid, flush=True)
time.sleep(300)
"""
    child = proc.spawn("child", [sys.executable, "-c", script], log, env=dict(os.environ))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "ready" not in log.read_text():
        time.sleep(0.05)
    jvm = int(log.read_text().split()[-1])
    assert proc.stop_child(child, timeout=30) == 0, log.read_text()
    assert not proc.pid_alive(jvm)


def test_spawn_names_a_command_that_cannot_start(tmp_path: Path) -> None:
    with pytest.raises(StackError, match=r"Can't start thing \(/no/such/binary\).*make install"):
        proc.spawn("thing", ["/no/such/binary"], tmp_path / "thing.log")
