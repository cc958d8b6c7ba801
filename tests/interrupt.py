"""SIGTERM ends a test run the way Ctrl-C does: pytest tears its fixtures down.

Tests start the test stack, Spark and the jobs under test in sessions of their own, out of reach of the terminal's
signals, and only a fixture's teardown stops them. Python's default SIGTERM ends pytest at once, so a CI runner's
cancel or a developer's `kill` left them running (the live scenario's ingest, sidecar and simulator, for one).
tests/conftest.py installs it; it is also a plugin of its own (`-p tests.interrupt`) for tests/unit/test_interrupt.py.
"""

from __future__ import annotations

import signal
from types import FrameType

import pytest


def install() -> None:
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}: stopping, fixtures torn down")


def pytest_configure(config: pytest.Config) -> None:
    install()
