"""Size-based rotation of the logs the stack's processes write to by file descriptor (copy-truncate).

A child whose stdout is a file keeps that descriptor open, so the file can't be renamed under it. Instead the
content is copied to <log>.1 (older copies shift to .2 ... .keep, the oldest is dropped) and the log is
truncated in place. Every writer opens its log in append mode (O_APPEND), so its next write lands at the new
end, not at its old offset behind a hole. Lines written between the copy and the truncation are lost (a
millisecond's worth, as with logrotate's copytruncate). Kafka's own log4j files roll by themselves and are
not rotated here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from streaming.core.errors import StackError

DEFAULT_MAX_BYTES = 50 * 2**20
DEFAULT_KEEP = 3
LOG_MODE = 0o600


@dataclass(frozen=True)
class RotationPolicy:
    """Rotate a log once it reaches `max_bytes`; keep `keep` rotated copies."""

    max_bytes: int = DEFAULT_MAX_BYTES
    keep: int = DEFAULT_KEEP

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise StackError(f"Log rotation: max_bytes must be > 0, got {self.max_bytes}.")
        if self.keep < 1:
            raise StackError(f"Log rotation: keep must be >= 1 rotated copy, got {self.keep}.")


def rotated(path: Path, n: int) -> Path:
    """The n-th rotated copy of a log: <name>.<n> (1 is the newest)."""
    return path.with_name(f"{path.name}.{n}")


def open_log(path: Path) -> int:
    """Open (create 0600) a log for appending; returns the descriptor for a child's stdout."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, LOG_MODE)
    if os.fstat(fd).st_mode & 0o077:
        os.fchmod(fd, LOG_MODE)  # a log made before logs were private
    return fd


def rotate_if_large(path: Path, policy: RotationPolicy) -> bool:
    """Copy-truncate `path` if it reached policy.max_bytes. True if it was rotated (False: small, missing, or
    being rotated by another process: the rotation holds an exclusive flock on the log)."""
    try:
        if path.stat().st_size < policy.max_bytes:
            return False
        live = path.open("r+b")
    except FileNotFoundError:
        return False
    with live:
        try:
            fcntl.flock(live, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if os.fstat(live.fileno()).st_size < policy.max_bytes:
            return False  # rotated by another process between our stat and our lock
        with contextlib.suppress(FileNotFoundError):
            rotated(path, policy.keep).unlink()
        for n in range(policy.keep - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                rotated(path, n).replace(rotated(path, n + 1))
        fd = os.open(rotated(path, 1), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, LOG_MODE)
        with os.fdopen(fd, "wb") as copy:
            shutil.copyfileobj(live, copy, 1024 * 1024)  # up to the end, including what came during the copy
            live.truncate(0)  # lines written between the copy's end and this call are lost
    return True


def rotate_all(paths: Iterable[Path], policy: RotationPolicy) -> list[Path]:
    """Rotate every log of `paths` that reached the limit; returns the rotated ones."""
    return [p for p in paths if rotate_if_large(p, policy)]
