"""The drivers map the class archive `make install` trained (streaming.core.class_archive)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from streaming.core.class_archive import archive_for
from streaming.core.config import load_settings

pytestmark = pytest.mark.integration


def test_the_driver_jvm_maps_the_class_archive_that_make_install_trained(
    spark: SparkSession, stack_env: dict[str, str]
) -> None:
    found = archive_for(load_settings(env={**os.environ, **stack_env}))
    assert found is not None, "the tests' drivers run a local master with the resolved jars: a fixed class path"
    archive = found[0]
    assert archive.is_file(), f"no class archive at {archive}: `make install` trains it"
    jvm = SparkContext._gateway.proc.pid  # pyspark's launch: spark-submit execs the driver's java
    maps = Path(f"/proc/{jvm}/maps").read_text()
    assert str(archive) in maps, f"the driver JVM (pid {jvm}) has not mapped {archive}"
