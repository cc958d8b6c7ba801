"""Test hooks, read from the environment only (never from the config file): crash points and a shifted clock.

IOTLAKE_TEST_CRASH=<point>:<arg>     SIGKILL the driver at that point:
    after_batch:<batch id>           after the batch's three commits, before Spark commits its checkpoint
    after_readings:<batch id>        after the batch's readings commit, before its device_state commit
    after_create:<table name>        right after the job created that table (first start)
IOTLAKE_TEST_CLOCK_SHIFT=<duration>  the job's clock runs this far ahead of the wall clock (e.g. '8 days')
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from streaming.config import parse_duration
from streaming.errors import ConfigError

CRASH_ENV = "IOTLAKE_TEST_CRASH"
CLOCK_SHIFT_ENV = "IOTLAKE_TEST_CLOCK_SHIFT"
CRASH_POINTS = ("after_batch", "after_readings", "after_create")


@dataclass(frozen=True)
class Faults:
    """Where to crash (point, argument) and how far to shift the clock; the default does neither."""

    crash_point: str | None = None
    crash_arg: str | None = None
    clock_shift_s: float = 0.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Faults:
        env = os.environ if env is None else env
        point = arg = None
        crash = env.get(CRASH_ENV, "").strip()
        if crash:
            point, _, arg = crash.partition(":")
            if point not in CRASH_POINTS or not arg:
                raise ConfigError(
                    f"{CRASH_ENV}={crash!r}: expected <point>:<arg> with a point among {list(CRASH_POINTS)}, "
                    "e.g. after_batch:1 or after_create:device_state."
                )
        shift = env.get(CLOCK_SHIFT_ENV, "").strip()
        return cls(point, arg, parse_duration(shift, CLOCK_SHIFT_ENV) if shift else 0.0)

    def now(self) -> datetime:
        """The job's clock: UTC wall time, shifted for replay tests."""
        return datetime.now(UTC) + timedelta(seconds=self.clock_shift_s)

    def crash_if(self, point: str, arg: object) -> None:
        """SIGKILL this process (no cleanup, like a power cut) when the hook names this point and argument."""
        if self.crash_point == point and self.crash_arg == str(arg):
            print(f"iotlake: {CRASH_ENV}={point}:{arg}: killing the driver now (SIGKILL)", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
