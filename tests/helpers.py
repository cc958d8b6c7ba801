"""Small test helpers shared by unit and integration tests: `from tests.helpers import wait_for`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from stack.addresses import free_port

T = TypeVar("T")


def free_port_pair(exclude: set[int] | None = None) -> int:
    """A loopback port p with p and p + 1 both free (the stack's services also listen on port + 1)."""
    return free_port(exclude, pair=True)


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.2,
    message: str = "condition",
) -> T:
    """Poll `predicate` until it returns a truthy value, and return that value.

    Raises AssertionError naming `message` (and the last value) when `timeout` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {message} (last value: {value!r})")
        time.sleep(interval)
