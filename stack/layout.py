"""Where the native stack keeps its runtime state (home) and its downloads (cache)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from streaming.core.config import PROJECT_ROOT, default_cache

HOME_ENV = "IOTLAKE_STACK_HOME"
PRIVATE_DIR_MODE = 0o700


@dataclass(frozen=True)
class StackLayout:
    """Runtime root (`home`: data, logs, pid files) and download cache (`cache`: jars, binaries)."""

    home: Path
    cache: Path

    @classmethod
    def default(cls, env: Mapping[str, str] | None = None) -> StackLayout:
        """home = $IOTLAKE_STACK_HOME or <project>/var; cache = $IOTLAKE_CACHE or ~/.cache/iotlake."""
        env = os.environ if env is None else env
        home = Path(env.get(HOME_ENV) or PROJECT_ROOT / "var").expanduser()
        return cls(home=home.resolve(), cache=default_cache(env).resolve())

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def kafka_home(self) -> Path:
        return self.home / "kafka"

    @property
    def kafka_data(self) -> Path:
        return self.kafka_home / "data"

    @property
    def spark_home(self) -> Path:
        """The Spark standalone cluster's state: its properties files, the worker's work dir."""
        return self.home / "spark"

    @property
    def minio_data(self) -> Path:
        return self.home / "minio" / "data"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def pidfile(self, name: str) -> Path:
        return self.run / f"{name}.pid"

    def make_dirs(self) -> None:
        """Create home and its folders private (0700, tightened if they exist): data, logs, pid files."""
        for d in (self.home, self.logs, self.run, self.kafka_home, self.kafka_data, self.minio_data.parent,
                  self.minio_data):  # fmt: skip
            d.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
            if stat.S_IMODE(d.stat().st_mode) != PRIVATE_DIR_MODE:
                d.chmod(PRIVATE_DIR_MODE)
