"""Test hooks, read from the environment only (never from the config file): crash points and a shifted clock.

IOTLAKE_TEST_CRASH=<point>:<arg>     SIGKILL the driver at that point:
    after_batch:<batch id>           after the batch's three commits, before Spark commits its checkpoint
    after_readings:<batch id>        after the batch's readings commit, before its device_state commit
    after_create:<table name>        right after the job created that table (first start)
IOTLAKE_TEST_CLOCK_SHIFT=<duration>  the job's clock runs this far ahead of the wall clock (e.g. '8 days')
IOTLAKE_TEST_NO_TXN_IDS=1            write without Delta transaction ids (the exactly-once test's negative control)
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from streaming.core.config import parse_duration
from streaming.core.errors import ConfigError

CRASH_ENV = "IOTLAKE_TEST_CRASH"
CLOCK_SHIFT_ENV = "IOTLAKE_TEST_CLOCK_SHIFT"
NO_TXN_IDS_ENV = "IOTLAKE_TEST_NO_TXN_IDS"
CRASH_POINTS = ("after_batch", "after_readings", "after_create")


@dataclass(frozen=True)
class Faults:
    """Where to crash (point, argument), how far to shift the clock, whether to drop the transaction ids;
    the default does none of them."""

    crash_point: str | None = None
    crash_arg: str | None = None
    clock_shift_s: float = 0.0
    no_txn_ids: bool = False

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
        no_txn = env.get(NO_TXN_IDS_ENV, "").strip()
        if no_txn not in ("", "0", "1"):
            raise ConfigError(f"{NO_TXN_IDS_ENV}={no_txn!r}: expected 1 (write without transaction ids) or 0.")
        return cls(point, arg, parse_duration(shift, CLOCK_SHIFT_ENV) if shift else 0.0, no_txn == "1")

    def now(self) -> datetime:
        """The job's clock: UTC wall time, shifted for replay tests."""
        return datetime.now(UTC) + timedelta(seconds=self.clock_shift_s)

    def crash_if(self, point: str, arg: object) -> None:
        """SIGKILL this process (no cleanup, like a power cut) when the hook names this point and argument."""
        if self.crash_point == point and self.crash_arg == str(arg):
            print(f"iotlake: {CRASH_ENV}={point}:{arg}: killing the driver now (SIGKILL)", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
