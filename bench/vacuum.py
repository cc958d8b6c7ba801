"""`python -m bench.vacuum`: VACUUM of a small partitioned Delta table, at Spark's listing parallelism and at ours.

Delta's VACUUM lists the table in `spark.sql.sources.parallelPartitionDiscovery.parallelism` tasks per stage. On one
warm local session (local files, no services) the same table is vacuumed alternately with Spark's default (10,000)
and with the session's own setting (streaming.core.session.BASE_CONF), and each run's seconds and Spark tasks are
recorded. Writes bench/results/<date>-vacuum.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from bench import report
from streaming.core.config import load_settings
from streaming.core.session import BASE_CONF, build_session

RESULTS = Path(__file__).resolve().parent / "results"
LISTING = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
SPARK_DEFAULT = "10000"


def tasks_since(spark: SparkSession, job_id: int) -> int:
    """Tasks of every stage of the jobs started after `job_id`."""
    tracker = spark.sparkContext.statusTracker()
    jobs = [info for j in tracker.getJobIdsForGroup(None) if j > job_id and (info := tracker.getJobInfo(j))]
    return sum(s.numTasks for job in jobs for sid in job.stageIds if (s := tracker.getStageInfo(sid)) is not None)


def vacuum(spark: SparkSession, path: str, parallelism: str) -> tuple[float, int]:
    """(seconds, tasks) of one VACUUM at this listing parallelism."""
    spark.conf.set(LISTING, parallelism)
    last = max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1)
    began = time.monotonic()
    spark.sql(f"VACUUM delta.`{path}` RETAIN 168 HOURS")
    return round(time.monotonic() - began, 3), tasks_since(spark, last)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.vacuum", description=__doc__.splitlines()[0])
    p.add_argument("--commits", type=int, default=5, help="appends to the table (default 5)")
    p.add_argument("--repeats", type=int, default=3, help="VACUUMs per setting, alternating (default 3)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    load = report.machine()["loadavg_at_start"]
    ours = BASE_CONF[LISTING]
    runs: dict[str, list[tuple[float, int]]] = {SPARK_DEFAULT: [], ours: []}
    with tempfile.TemporaryDirectory(prefix="iotlake-bench-vacuum-") as work:
        settings = load_settings()
        settings = settings.on_local_files(work)
        spark = build_session(settings, app_name="iotlake-bench-vacuum")
        try:
            path = f"{work}/table"
            for i in range(args.commits):
                frame = spark.range(100).selectExpr("id", f"{i % 2} AS p")
                frame.write.format("delta").mode("append").partitionBy("p").save(path)
            for _ in range(args.repeats):
                for parallelism in runs:
                    runs[parallelism].append(vacuum(spark, path, parallelism))
        finally:
            spark.stop()
    result = {
        **report.run_header("bench.vacuum", argv, load),
        "commits": args.commits,
        "runs": {k: [{"seconds": s, "tasks": t} for s, t in v] for k, v in runs.items()},
        "median_s": {k: statistics.median(s for s, _ in v) for k, v in runs.items()},
    }
    ratio = result["median_s"][SPARK_DEFAULT] / result["median_s"][ours]
    lines = [
        f"# VACUUM of a small table, {result['date']}",
        "",
        f"Commit `{result['commit']['commit'][:12]}`; load average at start {load}; a table of {args.commits} "
        f"commits on local files, one warm session, the two settings alternating. Command: `{result['command']}`.",
        "",
        f"| `{LISTING}` | median s | runs (s / tasks) |",
        "|---|---|---|",
        *(
            f"| {k}{' (Spark default)' if k == SPARK_DEFAULT else ' (ours)'} | {result['median_s'][k]:.2f} | "
            + ", ".join(f"{r['seconds']:.2f} / {r['tasks']:,}" for r in v)
            + " |"
            for k, v in result["runs"].items()
        ),
        "",
        f"Spark's default takes {ratio:.1f}x as long.",
    ]
    report.write_text_report(result, lines, args.out, f"{result['date']}-vacuum")
    return 0


if __name__ == "__main__":
    sys.exit(main())
