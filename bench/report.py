"""The results file (JSON) and its short markdown table, with the targets compared honestly."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from bench.stats import BREAKDOWN_KEYS
from streaming.core.config import PROJECT_ROOT


@dataclass(frozen=True)
class Target:
    key: str
    label: str
    unit: str
    goal: str
    met: Callable[[float], bool]


TARGETS: tuple[Target, ...] = (
    Target("simulator_msgs_per_s.confluent", "simulator, confluent, through the broker", "msgs/s", ">= 150,000",
           lambda v: v >= 150_000),
    Target("simulator_msgs_per_s.confluent-workers-2", "simulator, confluent, `--workers 2`", "msgs/s", "(none)",
           lambda v: True),
    Target("simulator_msgs_per_s.kafka-python", "simulator, kafka-python", "msgs/s", "(none)", lambda v: True),
    Target("sustained_events_per_s", "sustained ingest, steady state", "events/s", ">= 50,000", lambda v: v >= 50_000),
    Target("sustained_total_events_per_s", "sustained ingest, incl. start-up", "events/s", "(none)", lambda v: True),
    Target("floor_append_events_per_s", "plain Kafka -> Delta append of the same topic, steady", "events/s", "(none)",
           lambda v: True),
    Target("sustained_over_floor", "sustained ingest / plain append, same run", "x", ">= 0.8", lambda v: v >= 0.8),
    Target("latency_p50_s", "latency p50 at 5,000 events/s", "s", "<= 1.5", lambda v: v <= 1.5),
    Target("latency_p99_s", "latency p99 at 5,000 events/s", "s", "<= 4", lambda v: v <= 4),
    Target("floor_latency_p50_s", "latency p50 of a plain append, same traffic, same run", "s", "(none)",
           lambda v: True),
    Target("floor_latency_p99_s", "latency p99 of a plain append, same traffic, same run", "s", "(none)",
           lambda v: True),
    Target("latency_p50_over_floor", "latency p50, job / plain append", "x", "(none)", lambda v: True),
    Target("latency_p99_over_floor", "latency p99, job / plain append", "x", "(none)", lambda v: True),
    Target("readings_merge_s_per_million_rows", "readings MERGE, seconds more per million rows in the table",
           "s", "(none)", lambda v: True),
    Target("latency_p99_s_at_20k", "latency p99 at 20,000 events/s", "s", "<= 10", lambda v: v <= 10),
    Target("tiny_batch_s", "a batch of <= 100 messages, whole trigger, three tables", "s", "<= 1.0",
           lambda v: v <= 1.0),
    Target("floor_tiny_batch_s", "a batch of <= 100 messages of a plain append, same trickle, same run", "s",
           "(none)", lambda v: True),
    Target("tiny_batch_over_floor", "tiny batch, job / plain append", "x", "(none)", lambda v: True),
    Target("merge_time_ratio_10m_over_1m", "MERGE time 10M / 1M (job's literal MERGE)", "x", "<= 1.2",
           lambda v: v <= 1.2),
    Target("merge_time_ratio_10m_over_1m_seed", "MERGE time 10M / 1M (seed-style, no literals)", "x", "(none)",
           lambda v: True),
    Target("merge_time_ratio_10m_over_1m_open", "MERGE time 10M / 1M rows in the open partition (5,000 rows/s)",
           "x", "<= 1.2", lambda v: v <= 1.2),
    Target("compaction_query_speedup", "one-device-one-day query, before / after compaction", "x", ">= 10",
           lambda v: v >= 10),
    Target("compaction_files_read_ratio", "files read after / before compaction", "x", "<= 0.05",
           lambda v: v <= 0.05),
    Target("ingest_drop_during_compaction_pct", "ingest throughput drop while compacting", "%", "<= 30",
           lambda v: v <= 30),
    Target("job_rss_peak_gib", "streaming job RSS peak (python + JVM)", "GiB", "<= 4", lambda v: v <= 4),
    Target("stack_rss_peak_gib", "whole stack RSS peak", "GiB", "(none)", lambda v: True),
)  # fmt: skip


def lookup(data: Mapping[str, Any], dotted: str) -> Any:
    """data['a']['b'] for 'a.b'; None when any part is missing."""
    node: Any = data
    head, _, rest = dotted.partition(".")
    node = node.get(head) if isinstance(node, Mapping) else None
    if rest and isinstance(node, Mapping):
        return node.get(rest)
    return None if rest else node


def machine() -> dict[str, Any]:
    """Cores, memory, CPU model and load average of this machine."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return {
        "cores": psutil.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "cpu_model": model,
        "loadavg_at_start": [f"{load:.2f}" for load in os.getloadavg()],
    }


def git_commit(root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """HEAD's commit and whether the working tree has changes (other people edit it while we run)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        return done.stdout if done.returncode == 0 else ""

    # Porcelain lines are "XY path": the leading status column may be a space, so no strip() here.
    dirty = [line[3:] for line in git("status", "--porcelain").splitlines() if len(line) > 3]
    return {"commit": git("rev-parse", "HEAD").strip(), "dirty_paths": dirty}


def fmt(value: Any, unit: str) -> str:
    if value is None:
        return "not run"
    if isinstance(value, float | int):
        if unit in ("msgs/s", "events/s"):
            return f"{value:,.0f} {unit}"
        return f"{value:.2f} {unit}" if unit != "x" else f"{value:.3g}x"
    return str(value)


def verdict(value: Any, target: Target) -> str:
    if value is None:
        return "-"
    if target.goal == "(none)":
        return "(reported)"
    return "met" if target.met(float(value)) else "**not met**"


def _device_state_split(tiny: dict[str, Any]) -> str:
    """The tiny batches that upserted device_state and those that only folded theirs (results before the fold: "")."""
    upserting = tiny.get("tiny_trigger_s_upserting_device_state")
    folding = tiny.get("tiny_trigger_s_folding_device_state")
    if not upserting or not folding or not folding.get("count"):
        return ""
    return (
        f" {upserting.get('count', 0)} of them upserted device_state ({upserting.get('p50', 0):.2f} s, median), "
        f"{folding['count']} only folded theirs ({folding.get('p50', 0):.2f} s)."
    )


def markdown(result: Mapping[str, Any]) -> str:
    """A short report: the figures against the targets, then what bounds them."""
    m = result["machine"]
    lines = [
        f"# iotlake benchmark, {result['date']}",
        "",
        f"Commit `{result['git']['commit'][:12]}`"
        + (f" plus uncommitted changes by others in {_dirty(result)}" if _dirty(result) else "")
        + f"; {m['cores']} cores, {m['memory_gib']} GiB, load average at start {' '.join(m['loadavg_at_start'])}; "
        f"command `{result['command']}`; {result['elapsed_s'] / 60:.0f} min. Other work shared the machine: "
        "compare figures within this run, not across runs.",
        "",
        "| figure | value | target | verdict |",
        "|---|---|---|---|",
    ]
    for t in TARGETS:
        value = lookup(result, t.key)
        lines.append(f"| {t.label} | {fmt(value, t.unit)}{_spread(result, t)} | {t.goal} | {verdict(value, t)} |")
    lines += ["", *notes(result)]
    return "\n".join(lines) + "\n"


def notes(result: Mapping[str, Any]) -> list[str]:
    """Bullet points on what each figure means and what bounds it."""
    out: list[str] = []
    s = result["sections"]
    sim = s.get("simulator")
    if sim and "error" not in sim:
        out.append(_simulator_note(sim, result["machine"]["cores"]))
    sus = s.get("sustained")
    if sus and "error" not in sus:
        out.append(
            f"- **Sustained ingest**: {sus['events']:,} preloaded messages (fault mix of `make run`), "
            f"`--available-now`, maxOffsetsPerTrigger {result['params']['sustained']['max_offsets_per_trigger']:,}: "
            f"job wall {sus['job_wall_s']:.0f} s (start-up {sus['job_startup_s']} s), "
            f"{len(sus['batches'])} batches. Steady state = after batch 0, from the job's batch log times. "
            f"Bound: {sus['bound']}."
        )
        floor = sus.get("floor")
        if floor:
            out.append(
                f"- **Floor, same run**: `python -m bench.floor`, a plain Structured Streaming Kafka -> Delta append "
                f"of the same topic to the same MinIO (no validation, no dedup), same session and batch cap: "
                f"{floor['steady_events_per_s'] or 0:,.0f} events/s steady, {floor['total_events_per_s'] or 0:,.0f} "
                f"incl. start-up ({len(floor['batches'])} batches). The job runs at "
                f"**{sus.get('sustained_over_floor')}x** the floor."
            )
        out.append("")
        keys = _share_keys(sus)
        out.append("  | batch | messages | events/s | foreachBatch s | " + " | ".join(keys) + " |")
        out.append("  |---|---|---|---|" + "---|" * len(keys))
        for b in sus["batches"]:
            cells = " | ".join(f"{b.get(k, 0):.1f}" for k in keys)
            out.append(
                f"  | {b['batch_id']} | {b['messages']:,} | {b.get('events_per_second') or 0:,} | "
                f"{b['foreach_batch_s']:.1f} | {cells} |"
            )
        out.append("")
        out.append(
            "  Seconds per part, from the job's batch log line and the commit timestamps of its three Delta tables "
            "(MERGE = Delta executionTimeMs, ending at its commit); before_readings_merge_s = Kafka read, parse, "
            "validate, batch stats, dedup rows"
            + (
                " (this code runs the quarantine append beside the MERGEs)"
                if any("quarantine_committed_at_s" in b for b in sus["batches"])
                else ""
            )
            + "; outside_foreach_batch_s = checkpoint offsets->commits time minus foreachBatch."
        )
        out.append("")
    lat = s.get("latency")
    if lat and "error" not in lat:
        p = result["params"]["latency"]
        out.append(
            f"- **Latency**: sensor-sim at {p['rate']:,}/s for {p['duration_s']:.0f} s into the running job "
            f"(trigger {p['trigger_interval']}); latency = readings CDF `_commit_timestamp` - `kafka_timestamp` over "
            f"{lat['rows_after_warmup']:,} rows; the first {p['warmup_s']:.0f} s of production "
            f"({lat['warmup_rows_left_out']:,} rows) left out as warm-up. Rows produced after the first readings "
            f"commit only: p50 {lat['latency_s_produced_after_first_commit'].get('p50', 0):.2f} s, "
            f"p99 {lat['latency_s_produced_after_first_commit'].get('p99', 0):.2f} s. {_batches(lat)}, "
            f"{lat['trigger_seconds'].get('p50', 0):.1f} s (p50 whole trigger). "
            f"Mean progress phases (s): {lat['progress_phase_means_s']}. Bound: {lat['bound']}."
        )
        growth = lat.get("readings_merge_growth")
        if growth:
            out.append(
                f"  **The readings MERGE against the table's size**: a least-squares fit over {growth['batches']} "
                f"batches, readings_merge_s = {growth['intercept_s']} s + {growth['s_per_million_table_rows']} s per "
                f"million rows already in the table + {growth['s_per_10k_batch_messages']} s per 10,000 messages of "
                f"the batch (R² {growth['r2']}); the table held {growth['table_rows_at_end']:,} rows at the end."
            )
        floor = lat.get("floor")
        if floor:
            out.append(
                f"  **Its floor, same run**: the same traffic on a topic of its own into `python -m bench.floor "
                f"--trigger` (a plain Structured Streaming append, the same trigger): "
                f"p50 {floor['latency_p50_s']:.2f} s, p99 {floor['latency_p99_s']:.2f} s over "
                f"{floor['rows_after_warmup']:,} rows; batches of "
                f"{floor['batch_messages'].get('p50', 0):,.0f} messages "
                f"in {floor['batch_seconds'].get('p50', 0):.2f} s (p50). "
                f"Job / floor: p50 {lat['latency_p50_over_floor']}x, p99 {lat['latency_p99_over_floor']}x."
            )
        out.append(
            f"- **RSS** (sampled every second with psutil during the latency run): "
            f"job {lat['job_rss_peak_gib']:.2f} GiB, stack {lat['stack_rss_peak_gib']:.2f} GiB; "
            f"per part {lat['procs']['rss_peak_gib']}."
        )
        if sus and "error" not in sus:
            out.append(f"  During the sustained run the job peaked at {sus['job_rss_peak_gib']:.2f} GiB.")
    high = s.get("latency_20k")
    if high and "error" not in high:
        out.append(
            f"- **Latency at {result['params']['latency_20k']['rate']:,} events/s**, measured like the run above: "
            f"p50 {high['latency_p50_s']:.2f} s, p99 {high['latency_p99_s']:.2f} s. {_batches(high)}; drained "
            f"{high['drain_after_sim_s']:.0f} s after the simulator stopped."
        )
    tiny = s.get("tiny")
    if tiny and "error" not in tiny:
        p = result["params"]["tiny"]
        out.append(
            f"- **Tiny batch**: sensor-sim at {p['rate']}/s for {p['duration_s']:.0f} s into the running job (the "
            f"shipped trigger); of the batches of 1..{p['max_messages']} messages after the first {p['skip']}, "
            f"{tiny['tiny_batches']} with {tiny['tiny_messages'].get('p50', 0):.0f} messages (p50): whole trigger "
            f"(offsets written -> quarantine, readings, device_state -> commit written) {tiny['tiny_batch_s']:.2f} s "
            f"(median; max {tiny['tiny_trigger_s'].get('max', 0):.2f} s), of which foreachBatch "
            f"{tiny['tiny_batch_foreach_s']:.2f} s.{_device_state_split(tiny)}"
        )
        if tiny.get("floor_tiny_batch_s"):
            out.append(
                f"  **Its floor, same run**: the same trickle on a topic of its own into `python -m bench.floor "
                f"--trigger`; its batches of 1..{p['max_messages']} messages after the first {p['skip']}: "
                f"{tiny['floor_tiny_batch_s']:.2f} s a trigger (median). Job / floor: {tiny['tiny_batch_over_floor']}x."
            )
    for key, where in (("merge", "spread over 7 days"), ("merge_open", "in the open partition, 5,000 rows/s")):
        mer = s.get(key)
        if not mer or "error" in mer:
            continue
        par = result["params"][key]
        dup, late = par.get("duplicate_fraction", 0.01), par.get("late_fraction", 0.005)  # older files lack them
        ids = {"sent": "; event ids in send order", "random": "; random event ids"}.get(par.get("ids", ""), "")
        out.append(
            f"- **MERGE, table {where}** (`{key}`), on MinIO, batch of {par['batch_rows']:,} rows ({dup:.0%} "
            f"duplicates, {late:.1%} late; the table's files hold {late:.1%} late rows too{ids}), median of "
            f"{par['runs']} runs, table restored after each run:"
        )
        out.append("")
        out.append(
            "  | table rows | files | literal MERGE s, median (runs) | target files read "
            "| seed-style MERGE s, median (runs) | target files read |"
        )
        out.append("  |---|---|---|---|---|---|")
        for size, d in mer["sizes"].items():
            lit, seed = d["literal"], d["seed"]
            out.append(
                f"  | {int(size):,} | {d['files']} | {_times(lit)} | {_files(lit)} | {_times(seed)} | {_files(seed)} |"
            )
        out.append("")
    for name, sec in s.items():
        if sec and "error" in sec:
            out.append(f"- **{name}** failed: {sec['error'][:500]}")
        failed = [r["error"] for r in (sec or {}).get("repeats", []) if "error" in r]
        if failed and "error" not in sec:
            out.append(f"- **{name}**: {len(failed)} of its runs failed (left out of the median): {failed[0][:300]}")
    return out


def _batches(lat: Mapping[str, Any]) -> str:
    """'Batches: N with M messages (p50) taking S s (p50 foreachBatch)' of a latency run."""
    return (
        f"Batches: {lat['batches']} with {lat['batch_messages'].get('p50', 0):,.0f} messages (p50) taking "
        f"{lat['batch_seconds'].get('p50', 0):.1f} s (p50 foreachBatch)"
    )


def _spread(result: Mapping[str, Any], target: Target) -> str:
    """' (median of 1.2, 1.4, 2.0)' for a figure of a repeated section."""
    values = result.get("spread", {}).get(target.key)
    if not values:
        return ""
    return " (median of " + ", ".join(fmt(v, target.unit).removesuffix(f" {target.unit}") for v in values) + ")"


def _simulator_note(sim: Mapping[str, Any], cores: int) -> str:
    runs = sim["runs"]
    rates = {b: [round(r["msgs_per_s"]) for r in rs] for b, rs in runs.items()}
    counts = {b: rs[0]["count"] for b, rs in runs.items()}
    text = f"- **Simulator**: `--rate 0`, fresh topic each run, median of the runs (msgs/s) {rates}; messages {counts}."
    if sim.get("generator_msgs_per_s"):
        text += f" `dry-run` is the generator alone (`--dry-run`, no Kafka): {sim['generator_msgs_per_s']:,.0f} msgs/s."
    cpu = {b: [r["cpu_cores"] for r in rs] for b, rs in runs.items() if "cpu_cores" in rs[0]}
    if cpu:
        text += f" CPU cores used by the simulator per run: {cpu}"
        broker = {b: [r["kafka_cpu_cores"] for r in rs] for b, rs in runs.items() if "kafka_cpu_cores" in rs[0]}
        if broker:
            text += f"; by the Kafka broker: {broker}"
        busy = [r["machine_busy_cores"] for rs in runs.values() for r in rs if "machine_busy_cores" in r]
        text += f"; the machine was {min(busy):.2f}-{max(busy):.2f} of {cores} cores busy." if busy else "."
    return text


def _dirty(result: Mapping[str, Any]) -> str:
    """The measured code paths (streaming/, stack/, producers/) that differed from the commit."""
    paths = result["git"]["dirty_paths"]
    return ", ".join(f"`{p}`" for p in paths if p.startswith(("streaming/", "stack/", "producers/", "config/")))


def _share_keys(sus: Mapping[str, Any]) -> list[str]:
    keys = (*BREAKDOWN_KEYS, "outside_foreach_batch_s")
    return [k for k in keys if any(k in b for b in sus["batches"])]


def _times(kind: Mapping[str, Any]) -> str:
    runs = ", ".join(f"{r['seconds']:.2f}" for r in kind["runs"])
    return f"{kind['median_s']:.2f} ({runs})"


def _files(kind: Mapping[str, Any]) -> str:
    values = sorted({int(r["scan"].get("files_read", -1)) for r in kind["runs"]})
    return "/".join(str(v) for v in values if v >= 0) or "?"


def write(result: Mapping[str, Any], out_dir: Path, stem: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(result, indent=2, sort_keys=False, default=str) + "\n")
    md_path.write_text(markdown(result))
    return json_path, md_path


def write_text_report(result: Mapping[str, Any], lines: list[str], out_dir: Path, stem: str) -> None:
    """A side-by-side benchmark's <stem>.json and its markdown lines as <stem>.md; the lines are printed too."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written: {out_dir / stem}.json, .md")


def run_line(result: Mapping[str, Any]) -> str:
    """The run_header of a result as the first sentence of its markdown: commit, load average, command."""
    commit = str(result["commit"].get("commit") or "?")[:12]
    return f"Commit `{commit}`; load average at start {result['load_average']}; command `{result['command']}`."


def run_header(module: str, argv: Sequence[str] | None, load: Any) -> dict[str, Any]:
    """What every side-by-side result starts with: date, commit, load average at start and the exact command."""
    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "date": datetime.now(UTC).date().isoformat(),
        "commit": git_commit(),
        "load_average": load,
        "command": shlex.join(["python", "-m", module, *args]),
    }
