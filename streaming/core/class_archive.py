"""Train the drivers' class-data archive (Java's AppCDS): `python -m streaming.core.class_archive`, by `make install`.

A JVM started with `-XX:ArchiveClassesAtExit` writes every class it loaded into an archive when it exits; a later JVM
with the same JDK and class path maps them from it (session.with_class_archive). This module starts such a JVM with
the class path the config's jobs run with, has it do on local files what the job and the sidecar do with Spark and
Delta (JSON parsing, a partitioned table with deletion vectors, MERGE, a streaming query, OPTIMIZE ZORDER BY, VACUUM),
and stops it. The S3A client and the Kafka source are not in the workload: their classes load from the jars as
before. About 50 s, once per virtualenv, JDK and set of jars; nothing is trained when the drivers ship their jars
(spark.preinstalled_jars false, or auto with a cluster master).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from pyspark.sql import SparkSession

from streaming.core.config import Settings, load_settings
from streaming.core.errors import IotLakeError, SessionError
from streaming.core.logstore import jar_path, needs_jar
from streaming.core.session import (
    CLASSPATH_KEYS,
    DRIVER_OPTIONS,
    JIT_OPTIONS,
    build_session,
    check_java,
    class_archive,
    preinstalled_classpath,
    stop_session,
    uses_preinstalled_jars,
)

DUMP_TIMEOUT_S = 300  # writing ~200 MB on a busy 2-core machine took 12 s


def archive_for(settings: Settings) -> tuple[Path, str] | None:
    """(the archive, the class path) for this config's drivers; None when they have no fixed class path."""
    if not uses_preinstalled_jars(settings):
        return None
    classpath = preinstalled_classpath(settings, jar_path() if needs_jar(settings) else None)[CLASSPATH_KEYS[0]]
    return class_archive(check_java(), classpath), classpath


def train(settings: Settings) -> tuple[Path | None, bool]:
    """(the archive, True when trained now); (None, False) when this config's drivers have no fixed class path."""
    found = archive_for(settings)
    if found is None:
        return None, False
    archive, classpath = found
    if archive.is_file():
        return archive, False
    folder = archive.parent
    if " " in str(folder):
        raise SessionError(f"no class archive in {folder}: the JVM options can't carry a path with a space")
    if not os.access(folder, os.W_OK):
        raise SessionError(f"no class archive: {folder} (pyspark's folder in the virtualenv) is not writable")
    partial = folder / f".{archive.name}.{os.getpid()}.partial"  # the JVM writes here; renamed once it has exited
    try:
        with tempfile.TemporaryDirectory(prefix="iotlake-classes-") as work:
            local = replace(settings.on_local_files(f"{work}/lake"), spark=replace(settings.spark, master="local[2]"))
            extra = {
                **dict.fromkeys(CLASSPATH_KEYS, classpath),  # the jobs' class path, log store included
                # -Xlog: only errors of the dump, not a line per class it leaves out (signed jars, generated classes)
                DRIVER_OPTIONS: f"{JIT_OPTIONS} -XX:ArchiveClassesAtExit={partial} -Xlog:cds*=error",
            }
            spark = build_session(local, app_name="iotlake-class-archive", extra_conf=extra)
            spark.sparkContext.setLogLevel("ERROR")  # the workload's warnings are about its own throwaway table
            try:
                _workload(spark, Path(work))
            finally:
                code = stop_session(spark, timeout=DUMP_TIMEOUT_S)  # the JVM writes the archive on its way out
        if code != 0 or not partial.is_file():
            raise SessionError(f"the training JVM exited {code} and wrote no complete class archive to {partial}")
        os.replace(partial, archive)
    finally:
        partial.unlink(missing_ok=True)
    for stale in folder.glob("iotlake-classes-*.jsa"):
        if stale != archive:
            stale.unlink(missing_ok=True)  # for another JDK or jar set: ~200 MB each
    return archive, True


def _workload(spark: SparkSession, work: Path) -> None:
    """What the job and the sidecar run, on a small table: the classes they load come from the archive later."""
    table = f"delta.`{work}/readings`"
    spark.sql(
        f"CREATE TABLE {table} (event_id STRING, device_id STRING, event_time TIMESTAMP, value DOUBLE, "
        "event_date DATE) USING delta PARTITIONED BY (event_date) "
        "TBLPROPERTIES (delta.enableDeletionVectors = true, delta.checkpointInterval = 2)"
    )
    source = spark.sql(
        "SELECT from_json(json, 'event_id STRING, device_id STRING, event_time TIMESTAMP, value DOUBLE') AS r "
        "FROM (SELECT to_json(named_struct('event_id', cast(id AS STRING), 'device_id', concat('d', id % 20), "
        "'event_time', timestamp_millis(1700000000000 + id * 1000), 'value', id / 3.0)) AS json FROM range(2000))"
    ).selectExpr("r.*", "to_date(r.event_time) AS event_date")
    source.createOrReplaceTempView("source")
    for _ in range(2):  # the second MERGE updates what the first inserted, and its commit writes a checkpoint
        spark.sql(
            f"MERGE INTO {table} t USING source s ON t.event_id = s.event_id AND t.event_date = s.event_date "
            "WHEN MATCHED THEN UPDATE SET value = s.value + 1 WHEN NOT MATCHED THEN INSERT *"
        )
    stream = (
        spark.readStream.format("delta")
        .load(f"{work}/readings")
        .writeStream.format("delta")
        .option("checkpointLocation", f"{work}/checkpoint")
        .trigger(availableNow=True)
        .start(f"{work}/copy")
    )
    stream.awaitTermination()
    spark.sql(f"OPTIMIZE {table} ZORDER BY (device_id)")
    spark.sql(f"VACUUM {table}")


def main() -> int:
    started = time.monotonic()
    try:
        archive, trained = train(load_settings())
    except Exception as e:  # an optimisation: any failure is one clear line, and the install goes on
        print(f"class archive: not trained ({type(e).__name__}: {e}); the jobs run without it", file=sys.stderr)
        return e.exit_code if isinstance(e, IotLakeError) else 1
    if archive is None:
        print("class archive: none (the drivers ship their jars: a cluster master, or spark.preinstalled_jars off)")
    else:
        print(f"class archive: {'trained' if trained else 'cached'} {archive} ({time.monotonic() - started:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
