"""Small test helpers shared by unit and integration tests: `from tests.helpers import wait_for`."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

PORT_RANGE = (20000, 32000)  # below Linux's ephemeral range, so outgoing connections don't take them


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if nothing listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_pair(exclude: set[int] | None = None) -> int:
    """A loopback port p with p and p + 1 both free (the stack's services also listen on port + 1)."""
    exclude = exclude or set()
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(*PORT_RANGE)
        if not {port, port + 1} & exclude and port_free(port) and port_free(port + 1):
            return port
    raise RuntimeError(f"no two adjacent free loopback ports found in {PORT_RANGE}")


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
