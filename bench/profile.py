"""`python -m bench.profile`: where one micro-batch's time goes, from Spark's own event log.

Runs the real job (`streaming.pipeline.ingest.run`, in this process) on a private stack over a preloaded topic, with
`spark.eventLog.enabled`, then a tiny batch on the same warm JVM, and reads the event log back: per batch,
every Spark job with what it is for (its description or PySpark call site) and how long it ran, and the
driver's time outside any job (planning, Delta log listing and commits, S3 requests). Writes
bench/results/<date>-profile.json and .md.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import report
from bench.job import FAULTS
from bench.stack import bench_stack
from producers.cli import main as sensor_sim
from streaming.core.config import load_settings
from streaming.core.session import build_session
from streaming.pipeline.ingest import BatchReport, run

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Job:
    """One Spark job of the event log."""

    job_id: int
    batch_id: int | None  # the streaming batch it ran in (local property streaming.sql.batchId)
    what: str  # its description (Delta names its jobs) or the PySpark call site
    start_ms: int
    end_ms: int
    tasks: int

    @property
    def seconds(self) -> float:
        return (self.end_ms - self.start_ms) / 1000


# The streaming query's own part of every job description in a batch: "<name> id = … runId = … batch = N".
_STREAM_PREFIX = re.compile(r"\S+ id = \S+ runId = \S+ batch = \d+(:| -)?\s*")


def _what(props: dict[str, Any], stage_names: list[str]) -> str:
    """What a job is for: its description without the stream's prefix (Delta names its jobs), and its call site."""
    description = _STREAM_PREFIX.sub("", " ".join(str(props.get("spark.job.description") or "").split()))
    site = str(props.get("callSite.short") or (stage_names[0] if stage_names else "")).strip()
    return " @ ".join(part for part in (description[:90], site) if part) or "?"


def parse_event_log(lines: Iterable[str]) -> list[Job]:
    """Jobs from the lines of a Spark event log (JSON per line), in start order."""
    started: dict[int, dict[str, Any]] = {}
    jobs: list[Job] = []
    for line in lines:
        event = json.loads(line)
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            started[event["Job ID"]] = event
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in started:
            begin = started.pop(event["Job ID"])
            props = begin.get("Properties") or {}
            stages = begin.get("Stage Infos") or []
            batch = props.get("streaming.sql.batchId")
            jobs.append(
                Job(
                    job_id=event["Job ID"],
                    batch_id=int(batch) if batch not in (None, "") else None,
                    what=_what(props, [s.get("Stage Name", "") for s in stages]),
                    start_ms=int(begin["Submission Time"]),
                    end_ms=int(event["Completion Time"]),
                    tasks=sum(int(s.get("Number of Tasks", 0)) for s in stages),
                )
            )
    return sorted(jobs, key=lambda j: j.start_ms)


def busy_seconds(jobs: Sequence[Job]) -> float:
    """Wall seconds during which at least one of the jobs ran (overlapping jobs counted once)."""
    total, end = 0, None
    for job in sorted(jobs, key=lambda j: j.start_ms):
        if end is None or job.start_ms > end:
            total += job.end_ms - job.start_ms
            end = job.end_ms
        elif job.end_ms > end:
            total += job.end_ms - end
            end = job.end_ms
    return total / 1000


def batch_profile(report_: BatchReport, jobs: Sequence[Job]) -> dict[str, Any]:
    """One batch: its wall time and steps (from the job), its Spark jobs grouped by purpose, the rest."""
    mine = [j for j in jobs if j.batch_id == report_.batch_id]
    groups: dict[str, list[Job]] = defaultdict(list)
    for job in mine:
        groups[job.what].append(job)
    ordered = sorted(groups.items(), key=lambda item: -sum(j.seconds for j in item[1]))
    rows = [
        {
            "what": what,
            "jobs": len(js),
            "seconds": round(sum(j.seconds for j in js), 2),
            "tasks": sum(j.tasks for j in js),
        }
        for what, js in ordered
    ]
    busy = busy_seconds(mine)
    return {
        "batch_id": report_.batch_id,
        "messages": report_.input_rows,
        "wall_s": round(report_.seconds, 2),
        "steps_s": {k: round(v, 2) for k, v in report_.steps.items()},
        "spark_jobs": len(mine),
        "spark_jobs_busy_s": round(busy, 2),
        "outside_jobs_s": round(max(report_.seconds - busy, 0.0), 2),
        "jobs_by_purpose": rows,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"# Profile of one micro-batch, {result['date']}",
        "",
        f"{report.run_line(result)} Spark's event log of the real job, in-process, on a private stack.",
        "",
    ]
    for b in result["batches"]:
        lines += [
            f"## Batch {b['batch_id']}: {b['messages']:,} messages, {b['wall_s']} s",
            "",
            f"{b['spark_jobs']} Spark jobs, busy {b['spark_jobs_busy_s']} s; driver time outside any job "
            f"{b['outside_jobs_s']} s. Steps: {b['steps_s']}",
            "",
            "| what (job description or call site) | jobs | seconds | tasks |",
            "|---|---|---|---|",
            *(f"| {r['what']} | {r['jobs']} | {r['seconds']} | {r['tasks']} |" for r in b["jobs_by_purpose"]),
            "",
        ]
    return "\n".join(lines)


def produce(settings: Any, count: int, seed: int) -> None:
    argv = ["--bootstrap-servers", settings.kafka.bootstrap_servers, "--topic", settings.kafka.topic,
            "--count", str(count), "--rate", "0", "--seed", str(seed), "--quiet", *FAULTS]  # fmt: skip
    if sensor_sim(argv) != 0:
        raise RuntimeError("sensor-sim failed")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=60_000, help="preloaded messages (default 60000)")
    p.add_argument("--per-trigger", type=int, default=20_000, help="maxOffsetsPerTrigger (default 20000)")
    p.add_argument("--tiny", type=int, default=12, help="messages of the tiny batch after them (default 12)")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    load = report.machine()["loadavg_at_start"]
    started = time.monotonic()
    with bench_stack(echo=None) as stack, tempfile.TemporaryDirectory(prefix="iotlake-profile-") as work:
        events = Path(work) / "events"
        events.mkdir()
        env = stack.workload("profile", Path(work), IOTLAKE_KAFKA__MAX_OFFSETS_PER_TRIGGER=str(args.per_trigger))
        settings = load_settings(env=env)
        conf = {
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": events.as_uri(),
            "spark.eventLog.compress": "false",
            "spark.eventLog.rolling.enabled": "false",
        }  # one plain file
        spark = build_session(settings, app_name="iotlake-profile", extra_conf=conf)
        try:
            produce(settings, args.messages, seed=1)
            reports = run(settings, available_now=True, spark=spark)
            produce(settings, args.tiny, seed=2)
            reports += run(settings, available_now=True, spark=spark)
        finally:
            spark.stop()  # flushes the event log
        logs = [f for f in events.rglob("*") if f.is_file()]
        if len(logs) != 1:
            raise RuntimeError(f"expected one event log under {events}, found {logs}")
        jobs = parse_event_log(logs[0].read_text().splitlines())
    result = {
        **report.run_header("bench.profile", argv, load),
        "seconds": round(time.monotonic() - started, 1),
        "batches": [batch_profile(r, jobs) for r in reports],
    }
    report.write_text_report(result, render(result).splitlines(), args.out, f"{result['date']}-profile")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
