"""A SIGTERM to pytest (a CI runner's cancel, a developer's `kill`) tears the fixtures down, as Ctrl-C does.

Tests start services and jobs in sessions of their own, out of reach of the terminal's signals; only a fixture's
teardown stops them. A child run of pytest on a one-test file starts such a process from a fixture, is sent SIGTERM
mid-test, and the process must be gone once pytest has exited. Without tests/interrupt.py (the negative control)
the process outlives pytest, which is what a `kill` of the live scenario left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stack.proc import pid_alive, tail
from streaming.core.config import PROJECT_ROOT
from tests.helpers import wait_for

pytestmark = pytest.mark.unit

CHILD_TEST = '''
import subprocess, sys, time
from pathlib import Path
import pytest

@pytest.fixture
def background():
    """A process in a session of its own, as the live scenario's ingest, sidecar and simulator."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    Path("background.pid").write_text(str(process.pid))
    yield process
    process.terminate()
    process.wait(10)

def test_waits(background):
    Path("started").touch()
    time.sleep(300)
'''


def run_and_terminate(tmp_path: Path, plugins: list[str]) -> int:
    """The background process's pid, after SIGTERM to a pytest running CHILD_TEST and pytest's exit."""
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugins, "test_child.py"]
    log = tmp_path / "pytest.log"
    with log.open("w") as out:
        pytest_run = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        try:
            wait_for(lambda: (tmp_path / "started").exists(), timeout=60, message="the child test to start")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{tail(log, 30)}") from None
        pytest_run.send_signal(signal.SIGTERM)
        pytest_run.wait(60)
    finally:
        if pytest_run.poll() is None:
            pytest_run.kill()
            pytest_run.wait(10)
    return int((tmp_path / "background.pid").read_text())


def test_sigterm_to_pytest_tears_the_fixtures_down(tmp_path: Path) -> None:
    pid = run_and_terminate(tmp_path, ["-p", "tests.interrupt"])
    wait_for(lambda: not pid_alive(pid), timeout=10, message="the fixture's process to be stopped")


def test_negative_control_without_the_plugin_the_process_outlives_pytest(tmp_path: Path) -> None:
    pid = run_and_terminate(tmp_path, [])
    try:
        assert pid_alive(pid), "without tests/interrupt.py a SIGTERM leaves the fixture's process running"
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
