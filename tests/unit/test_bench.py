"""The benchmark's pure helpers (percentiles, log and metrics parsing, breakdown, report) and its process sampler."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from typing import Any

import psutil
import pytest

from bench import report
from bench.__main__ import combine, failed, headline
from bench.device_state_merge import device_rows
from bench.device_state_merge import summarize as summarize_merges
from bench.floor import batches_of
from bench.floor import steady as floor_steady
from bench.job import BenchError
from bench.latency import tiny_figures
from bench.procs import ProcessLook, ProcSampler, cpu_seconds, descendants, shares_address_space
from bench.s3_requests import batch_requests
from bench.stats import (
    BatchLine,
    Commit,
    batch_breakdown,
    least_squares,
    median,
    parse_batch_lines,
    parse_commit,
    parse_metrics,
    percentile,
    phases,
    steady_rate,
    summarize,
)
from bench.suite_cpu import CpuOfTest, totals
from streaming.pipeline.schema import DEVICE_STATE_COLUMNS

pytestmark = pytest.mark.unit


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0
    assert median([3.0, 1.0, 2.0]) == 2.0


def test_percentile_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize() -> None:
    s = summarize([1.0, 2.0, 3.0])
    assert s["count"] == 3 and s["p50"] == 2.0 and s["max"] == 3.0 and s["mean"] == 2.0
    assert summarize([]) == {"count": 0}


def test_cpu_seconds_count_a_process_that_started_between_looks_from_zero() -> None:
    before = {1: ProcessLook(0, 10.0, 0)}
    now = {1: ProcessLook(0, 10.5, 0), 2: ProcessLook(1, 0.25, 0)}
    assert cpu_seconds(now, before, [1]) == 0.5
    assert cpu_seconds(now, before, [1, 2]) == 0.75


def test_the_sampler_sees_a_child_process_its_memory_and_its_cpu() -> None:
    """A real child that holds 64 MiB and spins: its tree's RSS and CPU show up in the samples."""
    script = 'import time\nb = b"x" * (64 << 20)\nt = time.time()\nwhile time.time() - t < 30: pass\n'
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        with ProcSampler(interval=0.2) as sampler:
            sampler.track("child", child.pid)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                seen = [s for s in sampler.samples[1:] if s.rss.get("child", 0) >= 64 << 20]
                if seen and max(s.cpu.get("child", 0.0) for s in seen) > 0.3:
                    break
                time.sleep(0.2)
        assert sampler.peak_gib("child") >= 64 / 1024
        assert sampler.mean_cpu("child") > 0.3, sampler.samples[-3:]
        peaks = sampler.summary()["rss_peak_gib"]
        assert isinstance(peaks, dict) and peaks["all"] >= sampler.peak_gib("child")
    finally:
        child.kill()
        child.wait()


# A process holding 256 MiB that makes a real child with CLONE_VM, as posix_spawn does before its exec, and prints its
# pid; the child waits in pause() on a stack of its own until killed.
CLONE_VM_CHILD = """
import ctypes, signal, time
ballast = b"x" * (256 << 20)
libc = ctypes.CDLL(None, use_errno=True)
libc.clone.restype = ctypes.c_int
libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
stack = ctypes.create_string_buffer(1 << 16)
top = ctypes.c_void_p(ctypes.addressof(stack) + (1 << 16) - 64)
pid = libc.clone(ctypes.cast(libc.pause, ctypes.c_void_p), top, 0x100 | signal.SIGCHLD, None)
print(pid if pid > 0 else f"clone failed: errno {ctypes.get_errno()}", flush=True)
time.sleep(60)
"""


def test_a_child_that_shares_its_parents_address_space_is_counted_once() -> None:
    """A JVM spawns each chmod through posix_spawn: until the exec, the child shares the JVM's address space and /proc
    shows it the JVM's RSS. Counted twice, a 2.8 GiB job read 5.6 GiB in a one-second sample that caught one."""
    parent = subprocess.Popen([sys.executable, "-c", CLONE_VM_CHILD], stdout=subprocess.PIPE, text=True)
    line = ""
    try:
        line = parent.stdout.readline().strip() if parent.stdout else ""
        assert line.isdigit(), line
        child = int(line)
        assert psutil.Process(child).ppid() == parent.pid
        assert psutil.Process(child).memory_info().rss >= 256 << 20  # what /proc says: the parent's pages
        assert shares_address_space(parent.pid, child)
        with ProcSampler(interval=0.1) as sampler:
            sampler.track("parent", parent.pid)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(sampler.samples) < 5:
                time.sleep(0.1)
        rss = psutil.Process(parent.pid).memory_info().rss
        assert len(sampler.samples) >= 5
        assert rss * 0.8 <= max(s.rss["parent"] for s in sampler.samples) <= rss * 1.25, (rss, sampler.samples[-1])
    finally:
        parent.kill()  # the child outlives it (it holds the address space): kill it by its own pid too
        if line.isdigit():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line), signal.SIGKILL)
        parent.wait()


def test_a_forked_child_has_an_address_space_of_its_own() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not shares_address_space(os.getpid(), child.pid)
        assert shares_address_space(os.getpid(), os.getpid())
        assert not shares_address_space(os.getpid(), 2**22 + 7)  # over Linux's largest pid_max: no such process
    finally:
        child.kill()
        child.wait()


def test_descendants_follow_the_tree_only() -> None:
    parent_of = {1: 0, 10: 1, 11: 10, 12: 11, 20: 1, 21: 20}
    assert descendants([10], parent_of) == {10, 11, 12}
    assert descendants([10, 20], parent_of) == {10, 11, 12, 20, 21}
    assert descendants([99], parent_of) == set()


LOG = """\
2026-11-30 12:08:20,049 INFO iotlake.ingest: streaming query 1a4d started (checkpoint /tmp/c)
2026-11-30 12:09:41,486 INFO iotlake.ingest: batch 0: 230000 messages {'ok': 229000, 'quarantine': 1000}, \
228000 readings inserted, 100 device states, 78.2 s
some other line
2026-11-30 12:10:01,486 INFO iotlake.ingest: batch 1: 250000 messages {'ok': 250000}, 249000 readings inserted, \
200 device states, 19.5 s
2026-11-30 12:10:21,486 INFO iotlake.ingest: batch 2: 250000 messages {'ok': 250000}, 250000 readings inserted, \
200 device states, 19.0 s
"""


def test_batch_lines_and_steady_rate() -> None:
    lines = parse_batch_lines(LOG)
    assert [b.batch_id for b in lines] == [0, 1, 2]
    assert lines[0].messages == 230000 and lines[0].inserted == 228000 and lines[0].seconds == 78.2
    assert lines[1].logged_at == datetime(2026, 11, 30, 12, 10, 1, 486000)
    # batches 1 and 2: 500k messages between 12:09:41.486 and 12:10:21.486
    assert steady_rate(lines) == pytest.approx(500000 / 40)
    assert steady_rate(lines[:1]) is None


def test_metrics_and_phases() -> None:
    text = (
        "# HELP iot_ingest_batch_phase_seconds x\n# TYPE iot_ingest_batch_phase_seconds gauge\n"
        'iot_ingest_batch_phase_seconds{phase="addBatch"} 12.5\n'
        'iot_ingest_batch_phase_seconds{phase="walCommit"} 0.1\n'
        "# HELP iot_ingest_query_up x\n# TYPE iot_ingest_query_up gauge\niot_ingest_query_up 1.0\n"
    )
    metrics = parse_metrics(text)
    assert metrics[("iot_ingest_query_up", ())] == 1.0
    assert phases(metrics) == {"addBatch": 12.5, "walCommit": 0.1}


def test_parse_commit() -> None:
    text = (
        '{"commitInfo":{"timestamp":1796040571344,"operation":"MERGE",'
        '"operationMetrics":{"executionTimeMs":"19520","numTargetRowsInserted":"230000"}}}\n'
        '{"txn":{"appId":"q-readings","version":7}}\n'
        '{"add":{"path":"x.parquet"}}\n'
    )
    c = parse_commit(3, text)
    assert (c.version, c.timestamp_ms, c.operation, c.txn_versions) == (3, 1796040571344, "MERGE", (7,))
    assert c.metrics["executionTimeMs"] == "19520"


def _commit(at_s: float, exec_ms: int = 0) -> Commit:
    return Commit(1, int(at_s * 1000), "MERGE", {"executionTimeMs": str(exec_ms)}, (0,))


def _line(end: datetime, seconds: float) -> BatchLine:
    return BatchLine(0, 100, 100, seconds, end)


def test_breakdown_sequential_writer_adds_up() -> None:
    end = datetime(2026, 11, 30, 12, 0, 20)
    t0 = end.timestamp() - 20.0
    parts = batch_breakdown(_line(end, 20.0), _commit(t0 + 8), _commit(t0 + 14, 4000), _commit(t0 + 19, 3000))
    assert parts["validate_count_quarantine_s"] == 8.0
    assert parts["readings_rows_span_s"] == 2.0
    assert parts["readings_merge_s"] == 4.0
    assert parts["between_merges_s"] == 2.0
    assert parts["device_state_merge_s"] == 3.0
    assert parts["after_merges_s"] == 1.0
    assert sum(v for k, v in parts.items() if k != "foreach_batch_s") == pytest.approx(20.0)


def test_breakdown_quarantine_beside_the_merges() -> None:
    end = datetime(2026, 11, 30, 12, 0, 20)
    t0 = end.timestamp() - 20.0
    parts = batch_breakdown(_line(end, 20.0), _commit(t0 + 12), _commit(t0 + 14, 4000), _commit(t0 + 19, 3000))
    assert parts["before_readings_merge_s"] == 10.0
    assert parts["quarantine_committed_at_s"] == 12.0
    assert "validate_count_quarantine_s" not in parts
    summed = sum(v for k, v in parts.items() if k not in ("foreach_batch_s", "quarantine_committed_at_s"))
    assert summed == pytest.approx(20.0)


def test_lookup_and_verdicts() -> None:
    data = {"simulator_msgs_per_s": {"confluent": 250000.0}, "latency_p99_s": 5.0}
    assert report.lookup(data, "simulator_msgs_per_s.confluent") == 250000.0
    assert report.lookup(data, "simulator_msgs_per_s.kafka-python") is None
    assert report.lookup(data, "missing") is None
    targets = {t.key: t for t in report.TARGETS}
    assert report.verdict(250000.0, targets["simulator_msgs_per_s.confluent"]) == "met"
    assert report.verdict(5.0, targets["latency_p99_s"]) == "**not met**"
    assert report.verdict(None, targets["latency_p99_s"]) == "-"
    assert report.fmt(1234567.0, "msgs/s") == "1,234,567 msgs/s"
    assert report.fmt(1.234, "x") == "1.23x"
    assert report.fmt(None, "s") == "not run"


def test_markdown_with_sections_missing() -> None:
    result = {
        "date": "2026-11-30",
        "git": {"commit": "abcdef1234567890", "dirty_paths": []},
        "machine": {"cores": 2, "memory_gib": 23.5, "loadavg_at_start": ["1.0", "2.0", "3.0"]},
        "command": "python -m bench --only simulator",
        "elapsed_s": 120.0,
        "params": {},
        "sections": {
            "simulator": {"msgs_per_s": {"confluent": 1.0}, "runs": {"confluent": [{"msgs_per_s": 1.0, "count": 10}]}}
        },
        "simulator_msgs_per_s": {"confluent": 210000.0, "kafka-python": 12000.0},
        "latency_p99_s": None,
    }
    text = report.markdown(result)
    assert "| simulator, confluent, through the broker | 210,000 msgs/s | >= 150,000 | met |" in text
    assert "| latency p99 at 5,000 events/s | not run | <= 4 | - |" in text


def test_a_tiny_batch_is_a_whole_trigger_of_at_most_100_messages_after_the_warm_up() -> None:
    def part(messages: int, trigger_s: float, upsert_s: float | None = None) -> dict[str, Any]:
        times = {} if upsert_s is None else {"device_state_merge_s": upsert_s}  # its device_state commit's MERGE
        return {"messages": messages, "foreach_batch_s": trigger_s - 0.5, "trigger_s": trigger_s, **times}

    warm_up = [part(40, 30.0, 1.0), part(60, 12.0, 1.0)]
    parts = [*warm_up, part(50, 7.0), part(101, 2.0), part(45, 9.0, 1.5), part(0, 1.0), part(55, 8.0)]
    parts.append({"messages": 20, "foreach_batch_s": 1.0})  # its commit never written: no whole trigger
    figures = tiny_figures(parts, max_messages=100, skip=2)
    assert figures["tiny_batch_s"] == 8.0  # median of 7, 9, 8: not the warm-up, the 101-message or the empty batch
    assert figures["tiny_batch_foreach_s"] == 7.5
    assert figures["tiny_batches"] == 3
    assert figures["tiny_batches_upserting_device_state"] == 1
    assert figures["tiny_trigger_s_upserting_device_state"]["p50"] == 9.0
    assert figures["tiny_trigger_s_folding_device_state"]["p50"] == 7.5
    with pytest.raises(BenchError, match=r"no batch of 1\.\.100 messages"):
        tiny_figures([*warm_up, part(500, 3.0)], max_messages=100, skip=2)


TINY_PARAMS = {"rate": 5, "duration_s": 120.0, "max_messages": 100, "skip": 2}


def _run_info() -> dict[str, Any]:
    """What a results file says of its run besides the figures: date, commit, machine, command, time."""
    return {
        "date": "2026-12-03",
        "git": {"commit": "abcdef1234567890", "dirty_paths": []},
        "machine": {"cores": 2, "memory_gib": 23.5, "loadavg_at_start": ["0.1", "0.2", "0.3"]},
        "command": "python -m bench --only tiny",
        "elapsed_s": 60.0,
    }


def test_a_repeated_section_reports_the_median_run_and_every_runs_figure() -> None:
    def run(seconds: float, detail: str) -> dict[str, Any]:
        return {
            "tiny_batch_s": seconds,
            "tiny_batch_foreach_s": seconds - 1,
            "tiny_batches": 3,
            "tiny_trigger_s": {"p50": seconds},
            "tiny_messages": {"p50": 50},
            "detail": detail,
        }

    runs = [run(9.0, "a"), {"error": "BenchError: the job exited"}, run(7.0, "b"), run(8.0, "c")]
    section = combine("tiny", runs)
    assert section["detail"] == "c"  # the run with the median figure, in full
    assert [r.get("tiny_batch_s") for r in section["repeats"]] == [9.0, None, 7.0, 8.0]
    assert failed(section)
    result = {"sections": {"tiny": section, "simulator": {"msgs_per_s": {"confluent": 1.0}}, "merge": {"error": "x"}}}
    figures = headline(result)
    assert figures["tiny_batch_s"] == 8.0
    assert figures["spread"]["tiny_batch_s"] == [7.0, 8.0, 9.0]
    assert figures["simulator_msgs_per_s"] == {"confluent": 1.0}  # a section run once passes through
    assert figures["merge_time_ratio_10m_over_1m"] is None
    assert figures["sustained_events_per_s"] is None
    assert combine("tiny", runs[:1]) is runs[0]
    # A figure named unlike the section's own key (sustained_events_per_s reads steady_events_per_s).
    sustained = combine("sustained", [{"steady_events_per_s": v, "sustained_over_floor": v / 1e5} for v in (3e4, 1e4)])
    assert headline({"sections": {"sustained": sustained}})["sustained_events_per_s"] == 2e4
    text_result = {
        **_run_info(),
        "params": {"tiny": TINY_PARAMS},
        "sections": {"tiny": section, "merge": {"error": "x"}},
        **figures,
    }
    text = report.markdown(text_result)
    assert "| 8.00 s (median of 7.00, 8.00, 9.00) | <= 1.0 | **not met** |" in text
    assert "1 of its runs failed" in text


def test_render_redoes_the_figures_and_markdown_of_a_results_file(tmp_path: Any) -> None:
    from bench.__main__ import main

    runs = [{"tiny_batch_s": v, "tiny_batch_foreach_s": v, "tiny_batches": 3, "tiny_trigger_s": {},
             "tiny_messages": {"p50": 50}} for v in (9.0, 7.0, 8.0)]  # fmt: skip
    sections = {"tiny": combine("tiny", runs)}
    stale = {**_run_info(), "sections": sections, "params": {"tiny": TINY_PARAMS}, "tiny_batch_s": None, "spread": {}}
    path = tmp_path / "2026-12-03-tiny.json"
    path.write_text(json.dumps(stale))
    assert main(["--render", str(path)]) == 0
    redone = json.loads(path.read_text())
    assert (redone["tiny_batch_s"], redone["spread"]["tiny_batch_s"]) == (8.0, [7.0, 8.0, 9.0])
    assert redone["sections"] == sections
    assert "| 8.00 s (median of 7.00, 8.00, 9.00) |" in (tmp_path / "2026-12-03-tiny.md").read_text()
    assert main(["--render", str(tmp_path / "missing.json")]) == 2


def test_window_rate_counts_the_batches_that_ran_during_the_window() -> None:
    from datetime import datetime, timedelta

    from bench.compaction import window_rate
    from bench.stats import BatchLine

    t0 = datetime(2026, 11, 30, 12, 0, 0)
    batches = [BatchLine(i, 1000 * (i + 1), 0, 1.0, t0 + timedelta(seconds=10 * i)) for i in range(6)]

    def at(seconds: int) -> datetime:
        return t0 + timedelta(seconds=seconds)

    # batch i runs from t0+10(i-1)s to t0+10i s; [15 s, 35 s] overlaps batches 2, 3 and 4 (t0+10s -> t0+40s)
    assert window_rate(batches, at(15), at(35)) == (3000 + 4000 + 5000) / 30
    assert window_rate(batches, at(22), at(25)) == 4000 / 10  # inside one batch: that batch's rate
    assert window_rate(batches, at(61), at(70)) is None  # after the last batch
    assert window_rate(batches[:1], at(0), at(5)) is None  # only batch 0: its start is unknown


def test_the_compaction_window_comes_from_the_sidecars_optimize_lines() -> None:
    """Only readings' OPTIMIZE lines count, each from its end minus its duration; other tables, VACUUM and a
    conflict's retry line don't. The lines come from the sidecar's own format strings, so a change there fails here."""
    import logging
    from datetime import datetime

    from bench.compaction import optimize_windows
    from streaming.cli import LOG_FORMAT
    from streaming.lake.maintenance import OPTIMIZE_LOG

    formatter = logging.Formatter(LOG_FORMAT)

    def line(at: datetime, level: int, message: str, *args: Any) -> str:
        record = logging.LogRecord("streaming.lake.maintenance", level, __file__, 0, message, args, None)
        record.created, record.msecs = at.timestamp(), at.microsecond / 1000
        return formatter.format(record)

    t0 = datetime(2026, 12, 3, 15, 10, 30, 500000)
    log = "\n".join(
        [
            line(t0, logging.INFO, OPTIMIZE_LOG, "readings", "event_date=2026-12-01", 1000, 1, 1000, 95.4, 20.5, "x"),
            line(t0, logging.INFO, OPTIMIZE_LOG, "quarantine", "(table)", 12, 1, 12, 0.1, 1.0, "4 small files"),
            line(t0, logging.WARNING, "optimize %s %s: write conflict, retry in %.0fs: %s", "readings", "p", 30, "e"),
            line(t0, logging.INFO, "vacuum %s: deleted %d files (%.1f MiB) in %.1fs", "readings", 0, 0.0, 2.0),
        ]
    )
    assert optimize_windows(log) == [(datetime(2026, 12, 3, 15, 10, 10), t0)]


def _job_events(job_id: int, start: int, end: int, props: dict[str, str], tasks: int = 2) -> list[str]:
    stages = [{"Stage Name": "collect at NativeMethodAccessorImpl.java:0", "Number of Tasks": tasks}]
    begin = {"Event": "SparkListenerJobStart", "Job ID": job_id, "Submission Time": start, "Stage Infos": stages,
             "Properties": props}  # fmt: skip
    return [json.dumps(begin), json.dumps({"Event": "SparkListenerJobEnd", "Job ID": job_id, "Completion Time": end})]


STREAM_WRITE = "Delta: iotlake_ingest\nid = 8f0c\nrunId = 3a1b\nbatch = 0: Writing"  # what the stream prefixes


def test_the_profile_groups_each_batchs_spark_jobs_and_counts_overlaps_once() -> None:
    from bench.profile import batch_profile, busy_seconds, parse_event_log
    from streaming.pipeline.ingest import BatchReport

    lines = [
        '{"Event": "SparkListenerApplicationStart"}',
        *_job_events(0, 1_000, 3_000, {"streaming.sql.batchId": "0", "callSite.short": "collect at batch.py:9"}),
        *_job_events(1, 2_000, 4_000, {"streaming.sql.batchId": "0", "spark.job.description": "Delta: Writing"}),
        *_job_events(2, 6_000, 7_000, {"streaming.sql.batchId": "0", "spark.job.description": STREAM_WRITE}),
        *_job_events(3, 9_000, 9_500, {}),  # outside any batch (e.g. table creation)
        *_job_events(4, 10_000, 10_100, {"streaming.sql.batchId": "1", "callSite.short": "x"})[:1],  # never ended
    ]
    jobs = parse_event_log(lines)
    assert [(j.job_id, j.batch_id, j.what) for j in jobs] == [
        (0, 0, "collect at batch.py:9"),
        (1, 0, "Delta: Writing @ collect at NativeMethodAccessorImpl.java:0"),
        (2, 0, "Delta: Writing @ collect at NativeMethodAccessorImpl.java:0"),
        (3, None, "collect at NativeMethodAccessorImpl.java:0"),
    ]
    assert busy_seconds(jobs[:3]) == 4.0  # 1-4 s and 6-7 s: the overlap of jobs 0 and 1 counts once
    profile = batch_profile(BatchReport(0, 10, {}, {}, 8, 2, 6.5, {"validate": 1.0}), jobs)
    assert profile["spark_jobs"] == 3 and profile["spark_jobs_busy_s"] == 4.0 and profile["outside_jobs_s"] == 2.5
    assert profile["jobs_by_purpose"] == [
        {"what": "Delta: Writing @ collect at NativeMethodAccessorImpl.java:0", "jobs": 2, "seconds": 3.0, "tasks": 4},
        {"what": "collect at batch.py:9", "jobs": 1, "seconds": 2.0, "tasks": 2},
    ]


def test_the_floor_reads_batches_from_progress_and_rates_them_like_the_job() -> None:
    def progress(batch_id: int, rows: int, at: str, ms: int) -> dict[str, Any]:
        return {"batchId": batch_id, "numInputRows": rows, "timestamp": at, "durationMs": {"triggerExecution": ms}}

    batches = batches_of(
        [
            progress(0, 250_000, "2026-12-02T05:00:00.000Z", 20_000),
            progress(1, 250_000, "2026-12-02T05:00:20.000Z", 10_000),
            progress(2, 0, "2026-12-02T05:00:30.000Z", 50),  # an empty trigger is no batch
            progress(3, 100_000, "2026-12-02T05:00:30.500Z", 4_500),
        ]
    )
    assert [b["batch_id"] for b in batches] == [0, 1, 3]
    assert batches[0]["end_s"] == datetime.fromisoformat("2026-12-02T05:00:20+00:00").timestamp()
    # Steady = batches after the first over the time from the end of batch 0 to the end of the last: 350k in 15 s.
    assert floor_steady(batches) == pytest.approx(350_000 / 15)
    assert floor_steady(batches[:1]) is None


def test_the_soak_report_spans_the_producing_samples_and_flags_inexact_tables(tmp_path: Any) -> None:
    from bench import soak

    def look(t: float, lag: float | None, rss: float) -> dict[str, Any]:
        return {
            "t_s": t, "lag_messages": lag, "input_rows_per_s": 100.0, "readings_files": 10,
            "optimize_runs": 1.0, "files_compacted": 5.0, "rss_mib": dict.fromkeys(soak.SERVICES, rss),
            "restarts": dict.fromkeys(soak.SERVICES, 0),
        }  # fmt: skip

    counts = {"readings_rows": 9, "readings_distinct_event_ids": 9, "quarantine_rows": 1}
    result = {
        "date": "2026-12-02", "commit": {"commit": "abc" * 14}, "load_average_at_start": ["0.10", "0.20", "0.30"],
        "command": "python -m bench.soak", "sent": {"sent_total": 11}, "produced_s": 30.0, "drain_s": 5.0,
        "counts": counts, "exact": False,
        "samples": [look(0, None, 100), look(15, 40, 300), look(30, 20, 200), look(45, 9999, 250)],
    }  # fmt: skip
    soak.write(result, tmp_path)
    md = (tmp_path / "2026-12-02-soak.md").read_text()
    assert "| Kafka lag, messages | 20 / 40 / 20 |" in md  # the drain's sample is not 'while producing'
    assert "| RSS ingest, MiB | 100 / 300 / 250 |" in md
    assert "Tables exact: **False**" in md
    assert json.loads((tmp_path / "2026-12-02-soak.json").read_text())["exact"] is False


def test_each_sustained_run_has_a_floor_checkpoint_of_its_own(tmp_path: Any) -> None:
    """A second run's floor resumed the first run's checkpoint, whose topic was gone, and failed (--repeats)."""
    from bench.ingest import floor_checkpoint

    def env(uid: str) -> dict[str, str]:
        return {"IOTLAKE_INGEST__CHECKPOINT_LOCATION": str(tmp_path / f"checkpoint-sustained-{uid}")}

    first, second = floor_checkpoint(env("a1")), floor_checkpoint(env("b2"))
    assert first != second
    assert str(env("a1")["IOTLAKE_INGEST__CHECKPOINT_LOCATION"]) not in (str(first), str(second))


def test_a_batchs_s3_requests_are_counted_and_timed_by_kind_from_s3as_statistics() -> None:
    delta = Counter(
        {
            "action_http_head_request": 24,
            "action_http_head_request.mean": 97,
            "object_list_request": 11,
            "object_list_request.mean": 55,
            "object_put_request": 5,
            "object_put_request.mean": 36,
            "stream_read_bytes": 36_212,  # not a request
        }
    )
    row = batch_requests(1, 12, 5.689, delta, compiled=4)
    assert row["by_kind"]["HEAD"] == {"requests": 24, "ms": 97}
    assert row["by_kind"]["GET"] == {"requests": 0, "ms": None}  # S3A keeps no duration for GETs
    assert (row["requests"], row["request_ms"], row["wall_s"], row["classes_compiled"]) == (40, 188, 5.69, 4)


def test_device_state_merges_are_summed_up_after_the_warm_rounds_against_the_first_table() -> None:
    seconds = {"as created": [9.0, 2.0, 1.0, 3.0], "cdf off": [8.0, 1.0, 1.5, 1.5], "dv on": [7.0, 4.0, 3.0, 2.0]}
    arms = summarize_merges(seconds, warm=1)
    assert arms["as created"] == {"median_s": 2.0, "min_s": 1.0, "max_s": 3.0, "merges": 3, "over_first": 1.0}
    assert (arms["cdf off"]["median_s"], arms["cdf off"]["over_first"]) == (1.5, 0.75)
    assert (arms["dv on"]["median_s"], arms["dv on"]["over_first"]) == (3.0, 1.5)
    with pytest.raises(ValueError, match="no MERGE after the 4 warm-up rounds"):
        summarize_merges(seconds, warm=4)


def test_device_state_merge_rows_are_one_per_device_in_the_tables_columns_and_newer_each_round() -> None:
    first, second = device_rows(3, 0), device_rows(3, 1)
    assert [len(r) for r in first] == [len(DEVICE_STATE_COLUMNS)] * 3
    names = [c.name for c in DEVICE_STATE_COLUMNS]
    device, time_, seq = names.index("device_id"), names.index("event_time"), names.index("seq")
    assert [r[device] for r in first] == [r[device] for r in second] == ["dev-00000", "dev-00001", "dev-00002"]
    assert all(b[time_] > a[time_] and b[seq] > a[seq] for a, b in zip(first, second, strict=True))


def test_the_suites_cpu_totals_add_up_by_test_path() -> None:
    records = [
        CpuOfTest("tests/unit/test_a.py::t", wall_s=10.0, busy_core_s=12.0, idle_core_s=8.0),
        CpuOfTest("tests/integration/test_b.py::t", wall_s=5.0, busy_core_s=9.0, idle_core_s=1.0),
    ]
    assert totals(records, "tests/unit/") == (10.0, 12.0, 8.0, 0.6)
    assert totals(records) == (15.0, 21.0, 9.0, 0.7)
    assert totals(records, "tests/deploy/") == (0.0, 0, 0, 0.0)


def test_the_latency_run_has_a_plain_append_floor_quoted_as_ratios() -> None:
    from bench.__main__ import build_parser, params_from
    from bench.latency import floor_figures

    params = params_from(build_parser().parse_args([]))
    assert params["latency"].floor and not params["latency_20k"].floor  # the 5k run only: the 20k one falls behind
    assert not params_from(build_parser().parse_args(["--no-latency-floor"]))["latency"].floor
    job = {"latency_p50_s": 6.4, "latency_p99_s": 13.8}
    floor = {"latency_p50_s": 1.6, "latency_p99_s": 3.0}
    figures = floor_figures(job, floor)
    assert figures["floor"] is floor
    assert (figures["latency_p50_over_floor"], figures["latency_p99_over_floor"]) == (4.0, 4.6)
    runs = [{**job, **figures}, {**job, "latency_p50_s": 8.0, **floor_figures({**job, "latency_p50_s": 8.0}, floor)}]
    out = headline({"sections": {"latency": combine("latency", runs)}})
    assert (out["floor_latency_p50_s"], out["floor_latency_p99_s"]) == (1.6, 3.0)
    assert out["spread"]["latency_p50_over_floor"] == [4.0, 5.0]


def test_the_floors_tiny_batch_is_taken_like_the_jobs() -> None:
    from bench.latency import floor_tiny_batch_s

    batches = [[40, 9.0], [60, 5.0], [50, 0.9], [101, 2.0], [45, 0.7], [55, 0.8]]  # [rows, seconds], with rows
    assert floor_tiny_batch_s(batches, max_messages=100, skip=2) == 0.8  # not the warm-up or the 101-row batch
    assert floor_tiny_batch_s(batches[:2], max_messages=100, skip=2) is None


def test_least_squares_recovers_a_plane_and_refuses_what_it_cannot_fit() -> None:
    xs = [[1.0, a, b] for a, b in [(0, 1), (1, 0), (2, 3), (3, 1), (4, 4), (5, 2)]]
    ys = [0.5 + 2.0 * r[1] - 0.25 * r[2] for r in xs]
    coef, r2 = least_squares(xs, ys)
    assert [round(c, 9) for c in coef] == [0.5, 2.0, -0.25] and round(r2, 9) == 1.0
    noisy = [y + (0.3 if i % 2 else -0.3) for i, y in enumerate(ys)]
    assert 0.9 < least_squares(xs, noisy)[1] < 1.0
    with pytest.raises(ValueError, match="collinear"):
        least_squares([[1.0, a, 2 * a] for a in range(5)], [1.0] * 5)
    with pytest.raises(ValueError, match="at least 3 rows"):
        least_squares(xs[:2], ys[:2])


def test_the_readings_merge_growth_is_fitted_on_the_rows_the_table_held_before_each_batch() -> None:
    from bench.latency import merge_growth

    parts, rows = [], 0
    for i, messages in enumerate([4000, 30000, 28000, 35000, 26000, 41000, 33000, 52000, 29000, 47000]):
        merge_s = 0.4 + 0.97 * rows / 1e6 + 0.36 * messages / 1e4
        parts.append({"batch_id": i, "messages": messages, "inserted": messages - 1000,
                      "readings_merge_s": merge_s + (20.0 if i < 3 else 0.0)})  # fmt: skip
        rows += messages - 1000
    growth = merge_growth(parts, skip=3)  # the warm-up's 20 s is left out, not fitted
    assert growth is not None
    assert (growth["s_per_million_table_rows"], growth["s_per_10k_batch_messages"], growth["intercept_s"]) == (
        0.97,
        0.36,
        0.4,
    )
    assert (growth["r2"], growth["batches"], growth["table_rows_at_end"]) == (1.0, 7, rows)
    assert merge_growth(parts[:7], skip=3) is None  # 4 batches after the warm-up: too few to fit
    without_merge = [{**p, "readings_merge_s": None} for p in parts]  # batches that kept no reading
    assert merge_growth(without_merge) is None
