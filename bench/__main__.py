"""`python -m bench`: run the benchmark on a private native stack; write bench/results/<date>.json and .md."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import report
from bench.compaction import CompactionParams, run_compaction
from bench.compaction import quick as quick_compaction
from bench.ingest import SustainedParams, run_sustained
from bench.latency import LatencyParams, TinyParams, run_latency, run_tiny
from bench.merge import MergeParams, run_merge
from bench.simulator import SimulatorParams, run_simulator
from bench.stack import BenchStack, bench_stack
from bench.stats import median

SECTIONS = ("simulator", "sustained", "latency", "latency_20k", "tiny", "merge", "merge_open", "compaction")
# Run --repeats times, the median reported with the spread; the others repeat inside (simulator, merges, compaction).
REPEATED = ("sustained", "latency", "latency_20k", "tiny")
RESULTS = Path(__file__).resolve().parent / "results"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the pipeline on a private Kafka + MinIO stack (temp home, free loopback ports).",
    )
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of sections (default: all of {SECTIONS})")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke check (a few minutes)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: bench/results)")
    p.add_argument("--keep-workdir", action="store_true", help="keep logs and checkpoints (path is printed)")
    p.add_argument("--render", type=Path, metavar="JSON", help="measure nothing: redo a results file's figures and .md")
    p.add_argument("--repeats", type=int, help=f"runs of each of {REPEATED}, median reported (default 3; 1 --quick)")
    p.add_argument("--no-faults", action="store_true", help="no duplicates/late/malformed messages from sensor-sim")
    p.add_argument("--sim-confluent-count", type=int, help="messages per confluent run (default 500000)")
    p.add_argument("--sim-kafka-python-count", type=int, help="messages per kafka-python run (default 100000)")
    p.add_argument("--sim-repeats", type=int, help="runs per backend, median reported (default 3)")
    p.add_argument("--sustained-events", type=int, help="messages preloaded for the sustained run (default 2000000)")
    p.add_argument("--max-offsets-per-trigger", type=int, help="sustained run's batch cap (default 250000)")
    p.add_argument("--latency-rate", type=int, help="events/s for the latency run (default 5000)")
    p.add_argument("--latency-duration", type=float, help="seconds of traffic for the latency runs (default 180)")
    p.add_argument("--latency-high-rate", type=int, help="events/s for the latency_20k run (default 20000)")
    p.add_argument("--latency-warmup", type=float, help="seconds of first rows left out (default 10)")
    p.add_argument("--trigger-interval", help="latency run's trigger interval (default: ingest.trigger_interval)")
    p.add_argument("--no-latency-floor", action="store_true", help="skip the latency and tiny runs' plain-append floor")
    p.add_argument("--merge-sizes", help="table sizes, comma list (default 1000000,10000000)")
    p.add_argument("--merge-batch", type=int, help="rows per MERGE batch (default 250000)")
    p.add_argument("--merge-runs", type=int, help="timed runs per size and kind, median reported (default 3)")
    p.add_argument(
        "--merge-ids", choices=("sent", "random"), default="sent",
        help="merge sections' event ids: the simulator's, in send order (default), or random (hashed)",
    )  # fmt: skip
    return p


def params_from(args: argparse.Namespace) -> dict[str, Any]:
    """Every section's parameters: defaults, --quick, then explicit flags."""
    sim, sus, lat, mer, tiny = SimulatorParams(), SustainedParams(), LatencyParams(), MergeParams(), TinyParams()
    com = quick_compaction(CompactionParams()) if args.quick else CompactionParams()
    if args.quick:
        sim = replace(sim, counts={"confluent": 50_000, "kafka-python": 10_000}, repeats=1)
        sus = replace(sus, events=100_000, max_offsets_per_trigger=25_000)
        lat = replace(lat, rate=1000, duration_s=20.0, warmup_s=5.0)
        tiny = replace(tiny, duration_s=40.0)
        mer = replace(mer, sizes=(100_000, 1_000_000), batch_rows=25_000, runs=1, rows_per_file=25_000,
                      warmup_rounds=1)  # fmt: skip
    tiny = replace(tiny, floor=not args.no_latency_floor)
    counts = dict(sim.counts)
    if args.sim_confluent_count:
        counts["confluent"] = args.sim_confluent_count
    if args.sim_kafka_python_count:
        counts["kafka-python"] = args.sim_kafka_python_count
    sim = replace(sim, counts=counts, repeats=args.sim_repeats or sim.repeats)
    sus = replace(
        sus,
        events=args.sustained_events or sus.events,
        max_offsets_per_trigger=args.max_offsets_per_trigger or sus.max_offsets_per_trigger,
        faults=not args.no_faults,
    )
    lat = replace(
        lat,
        rate=args.latency_rate or lat.rate,
        duration_s=args.latency_duration or lat.duration_s,
        warmup_s=args.latency_warmup if args.latency_warmup is not None else lat.warmup_s,
        trigger_interval=args.trigger_interval or lat.trigger_interval,
        faults=not args.no_faults,
        floor=not args.no_latency_floor,
    )
    if args.merge_sizes:
        mer = replace(mer, sizes=tuple(int(x) for x in args.merge_sizes.split(",")))
    mer = replace(
        mer, batch_rows=args.merge_batch or mer.batch_rows, runs=args.merge_runs or mer.runs, ids=args.merge_ids
    )
    high = replace(
        lat, name="latency_20k", rate=args.latency_high_rate or (2000 if args.quick else 20_000), floor=False
    )
    return {
        "simulator": sim,
        "sustained": sus,
        "latency": lat,
        "latency_20k": high,
        "tiny": tiny,
        "merge": mer,
        "merge_open": replace(mer, rate=5000.0),
        "compaction": com,
    }


def echo_from(started: float) -> Callable[[str], None]:
    def echo(text: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {text}", flush=True)

    return echo


def _get(key: str, *sub: str) -> Callable[[dict[str, Any]], Any]:
    def get(run: dict[str, Any]) -> Any:
        value: Any = run.get(key)
        for k in sub:
            value = value.get(k) if isinstance(value, dict) else None
        return value

    return get


# The top-level figures: name -> (section, how to read it from one run of the section).
FIGURES: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = {
    "simulator_msgs_per_s": ("simulator", _get("msgs_per_s")),
    "sustained_events_per_s": ("sustained", _get("steady_events_per_s")),
    "sustained_total_events_per_s": ("sustained", _get("total_events_per_s")),
    "floor_append_events_per_s": ("sustained", _get("floor_append_events_per_s")),
    "sustained_over_floor": ("sustained", _get("sustained_over_floor")),
    "latency_p50_s": ("latency", _get("latency_p50_s")),
    "latency_p99_s": ("latency", _get("latency_p99_s")),
    "floor_latency_p50_s": ("latency", _get("floor_latency_p50_s")),
    "floor_latency_p99_s": ("latency", _get("floor_latency_p99_s")),
    "latency_p50_over_floor": ("latency", _get("latency_p50_over_floor")),
    "latency_p99_over_floor": ("latency", _get("latency_p99_over_floor")),
    "readings_merge_s_per_million_rows": ("latency", _get("readings_merge_growth", "s_per_million_table_rows")),
    "latency_p99_s_at_20k": ("latency_20k", _get("latency_p99_s")),
    "tiny_batch_s": ("tiny", _get("tiny_batch_s")),
    "floor_tiny_batch_s": ("tiny", _get("floor_tiny_batch_s")),
    "tiny_batch_over_floor": ("tiny", _get("tiny_batch_over_floor")),
    "merge_time_ratio_10m_over_1m": ("merge", _get("literal_ratio")),
    "merge_time_ratio_10m_over_1m_seed": ("merge", _get("seed_ratio")),
    "merge_time_ratio_10m_over_1m_open": ("merge_open", _get("literal_ratio")),
    "compaction_query_speedup": ("compaction", _get("query", "speedup")),
    "compaction_files_read_ratio": ("compaction", _get("query", "files_ratio")),
    "ingest_drop_during_compaction_pct": ("compaction", _get("ingest", "drop_pct")),
    "job_rss_peak_gib": ("latency", _get("job_rss_peak_gib")),
    "stack_rss_peak_gib": ("latency", _get("stack_rss_peak_gib")),
}


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The top-level figures from the sections that ran (None where one did not run or failed): the median of a
    repeated section's runs, with every run's value under `spread`."""
    out: dict[str, Any] = {}
    spread: dict[str, list[Any]] = {}
    for figure, (section, get) in FIGURES.items():
        data = result["sections"].get(section)
        if not isinstance(data, dict):
            values = []
        elif "repeats" in data:  # every run's figures, by figure name (`combine`)
            values = [r.get(figure) for r in data["repeats"] if "error" not in r]
        else:
            values = [] if "error" in data else [get(data)]
        values = [v for v in values if v is not None]
        if not values:
            out[figure] = None
        elif len(values) == 1 or not all(isinstance(v, int | float) for v in values):
            out[figure] = values[0]
        else:
            out[figure] = round(median(values), 3)
            spread[figure] = sorted(values)
    return {**out, "spread": spread}


def combine(section: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One section's result from its runs: the run with the median key figure in full, plus every run's figures."""
    if len(runs) == 1:
        return runs[0]
    figures = {f: get for f, (s, get) in FIGURES.items() if s == section}
    repeats = [r if "error" in r else {f: get(r) for f, get in figures.items()} for r in runs]
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {**runs[0], "repeats": repeats}
    key = next(iter(figures.values()))
    ordered = sorted(ok, key=lambda r: key(r) if key(r) is not None else float("inf"))
    return {**ordered[(len(ordered) - 1) // 2], "repeats": repeats}


def run_sections(
    stack: BenchStack, workdir: Path, names: Sequence[str], params: dict[str, Any], repeats: int, echo: Any
) -> dict:
    runners: dict[str, Callable[..., dict[str, Any]]] = {
        "simulator": run_simulator,
        "sustained": run_sustained,
        "latency": run_latency,
        "latency_20k": run_latency,
        "tiny": run_tiny,
        "merge": run_merge,
        "merge_open": run_merge,
        "compaction": run_compaction,
    }
    sections: dict[str, Any] = {}
    for name in names:
        started = time.monotonic()
        runs: list[dict[str, Any]] = []
        count = repeats if name in REPEATED else 1
        for run in range(count):
            echo(f"== {name}" + (f" (run {run + 1} of {count})" if count > 1 else ""))
            try:
                runs.append(runners[name](stack, workdir, params[name], echo=echo))
            except Exception as e:  # one failed section must not lose the others' figures
                traceback.print_exc()
                runs.append({"error": f"{type(e).__name__}: {e}"})
        sections[name] = combine(name, runs)
        sections[name]["section_s"] = round(time.monotonic() - started, 1)
    return sections


def render(path: Path) -> int:
    """Recompute the figures of a results file from its sections, and its markdown (after a report change)."""
    try:
        measured = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"bench: can't read {path} as a results file: {e}", file=sys.stderr)
        return 2
    kept = {k: v for k, v in measured.items() if k not in FIGURES and k != "spread"}
    json_path, md_path = report.write({**headline(kept), **kept}, path.parent, path.stem)
    print(f"wrote {json_path} and {md_path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.render:
        return render(args.render)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        print(f"bench: unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    repeats = args.repeats if args.repeats is not None else 1 if args.quick else 3
    if repeats < 1:
        print(f"bench: --repeats must be 1 or more, got {repeats}", file=sys.stderr)
        return 2
    params = params_from(args)
    started = time.monotonic()
    echo = echo_from(started)
    today = datetime.now(UTC).date().isoformat()
    result: dict[str, Any] = {
        "date": today,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])]),
        "machine": report.machine(),
        "git": report.git_commit(),
        "params": {name: asdict(p) for name, p in params.items()},
        "repeats": {name: repeats if name in REPEATED else 1 for name in names},
    }
    workdir = Path(tempfile.mkdtemp(prefix="iotlake-bench-work-"))
    echo(f"workdir {workdir}; sections {names}")
    try:
        with bench_stack(echo=echo) as stack:
            result["sections"] = run_sections(stack, workdir, names, params, repeats, echo)
    finally:
        if args.keep_workdir:
            echo(f"logs and checkpoints kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result = {**headline(result), **result}
    stem = (
        today if not args.quick and names == list(SECTIONS) else f"{today}-{'quick' if args.quick else '-'.join(names)}"
    )
    json_path, md_path = report.write(result, args.out, stem)
    print()
    print(report.markdown(result))
    print(f"wrote {json_path} and {md_path}")
    return 1 if any(failed(s) for s in result["sections"].values()) else 0


def failed(section: dict[str, Any]) -> bool:
    """The section, or one of its repeated runs, raised."""
    return "error" in section or any("error" in r for r in section.get("repeats", []))


if __name__ == "__main__":
    sys.exit(main())
