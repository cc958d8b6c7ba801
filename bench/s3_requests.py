"""`python -m bench.s3_requests`: the S3 requests of each tiny batch and the time S3A measured for them.

Runs the job's batch writer (`streaming.pipeline.ingest.BatchWriter`) in this process on a private stack, one
available-now query per tiny batch, and reads the S3A file system's own IOStatistics before and after each batch.
On a local master the driver and the executors share that file system instance, so the difference is every
request the batch made to the tables' bucket, by kind, with the summed duration of each kind. Beside them, the
classes Spark compiled in the batch (its code generation cache's misses, from Spark's CodegenMetrics). Writes
bench/results/<date>-s3-requests.json and .md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from bench import report
from bench.profile import produce
from bench.stack import bench_stack
from streaming.core.config import load_settings
from streaming.core.session import build_session
from streaming.pipeline.ingest import BatchWriter, start_query
from streaming.pipeline.metrics import IngestMetrics
from streaming.pipeline.tables import LakeTables

RESULTS = Path(__file__).resolve().parent / "results"
# S3A's statistic for each kind of request: a counter, and a mean statistic "<name>.mean" of its durations in ms.
# Hadoop 3.5's S3A keeps no duration for the GETs of its analytics input stream, so GETs are counted only.
KINDS = {
    "HEAD": "action_http_head_request",
    "GET": "action_http_get_request",
    "LIST": "object_list_request",
    "PUT": "object_put_request",
    "DELETE": "object_delete_request",
}
UNTIMED = frozenset({"GET"})


def s3a_statistics(spark: SparkSession, uri: str) -> Counter[str]:
    """The S3A file system's counters for `uri`'s bucket, and each mean statistic's summed value as "<name>.mean"."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(uri), spark.sparkContext._jsc.hadoopConfiguration())
    stats = fs.getIOStatistics()
    counters, means = stats.counters(), stats.meanStatistics()
    values: Counter[str] = Counter({str(k): int(counters.get(k)) for k in counters.keySet()})
    values.update({str(k): int(means.get(k).getSum()) for k in means.keySet()})
    return values


def compilations(spark: SparkSession) -> int:
    """How many classes Spark's code generation has compiled in this JVM (each miss of its cache is one)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return int(jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount())


def batch_requests(
    batch_id: int, messages: int, seconds: float, delta: Counter[str], compiled: int = 0
) -> dict[str, Any]:
    """One batch's requests by kind: how many, and the milliseconds S3A measured for them (summed)."""
    kinds = {
        kind: {"requests": delta[name], "ms": None if kind in UNTIMED else delta[f"{name}.mean"]}
        for kind, name in KINDS.items()
    }
    return {
        "batch_id": batch_id,
        "messages": messages,
        "wall_s": round(seconds, 2),
        "requests": sum(k["requests"] for k in kinds.values()),
        "request_ms": sum(k["ms"] or 0 for k in kinds.values()),
        "by_kind": kinds,
        "classes_compiled": compiled,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"# S3 requests per tiny batch, {result['date']}",
        "",
        f"{report.run_line(result)} S3A's IOStatistics before and after each batch, in-process, on a private "
        "stack. The milliseconds are summed over requests, some of which ran at the same time; S3A times no GET.",
        "",
        "| batch | messages | wall s | requests | S3 ms (timed) | " + " | ".join(KINDS) + " | classes compiled |",
        "|---|---|---|---|---|" + "---|" * (len(KINDS) + 1),
    ]
    for b in result["batches"]:
        kinds = " | ".join(
            str(k["requests"]) if k["ms"] is None else f"{k['requests']} / {k['ms']} ms" for k in b["by_kind"].values()
        )
        given = [
            b["batch_id"],
            b["messages"],
            b["wall_s"],
            b["requests"],
            b["request_ms"],
            kinds,
            b["classes_compiled"],
        ]
        lines.append("| " + " | ".join(map(str, given)) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.s3_requests", description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=6, help="tiny batches, one query each (default 6)")
    p.add_argument("--messages", type=int, default=12, help="messages per batch (default 12)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    load = report.machine()["loadavg_at_start"]
    batches: list[dict[str, Any]] = []
    with bench_stack(echo=None) as stack, tempfile.TemporaryDirectory(prefix="iotlake-s3-requests-") as work:
        settings = load_settings(env=stack.workload("s3-requests", Path(work)))
        spark = build_session(settings, app_name="iotlake-s3-requests")
        try:
            tables = LakeTables(spark, settings)
            tables.ensure()
            writer = BatchWriter(spark, settings, tables, IngestMetrics())
            uri = settings.storage.table_uri("readings")

            def measured(raw: DataFrame, batch_id: int) -> None:
                before, compiled_before, started = s3a_statistics(spark, uri), compilations(spark), time.monotonic()
                writer(raw, batch_id)
                seconds, delta = time.monotonic() - started, s3a_statistics(spark, uri) - before
                compiled = compilations(spark) - compiled_before
                batches.append(batch_requests(batch_id, writer.reports[-1].input_rows, seconds, delta, compiled))

            for i in range(args.batches):
                produce(settings, args.messages, seed=10 + i)
                query = start_query(spark, settings, measured, available_now=True)
                query.awaitTermination(300)
                if query.exception() is not None:
                    raise RuntimeError(f"the query failed: {query.exception()}")
        finally:
            spark.stop()
    result = {**report.run_header("bench.s3_requests", argv, load), "batches": batches}
    report.write_text_report(result, render(result).splitlines(), args.out, f"{result['date']}-s3-requests")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
