"""`python -m bench.soak` (`make soak`): the compose deployment under a steady load.

A scratch deployment (stack.containers.scratch_deployment: the images built here, fresh secrets, the core services
with docker-compose.yml's settings, the sidecar's included), then the simulator at --rate for --minutes with
`make run`'s fault mix. Every --every seconds: the job's Kafka lag and input rate (from the compose Prometheus),
each container's resident memory (its process tree, psutil), restarts, readings' data files (its Delta log) and
the sidecar's OPTIMIZE runs. Then the drain: how long until the job has read the whole topic, and whether the
tables hold exactly what the simulator sent. Writes bench/results/<date>-soak.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from bench import procs, report
from bench.job import FAULTS
from stack import containers
from streaming.core import http
from streaming.core.config import load_settings
from streaming.core.storage import delta_rs_uri, delta_storage_options

RESULTS = Path(__file__).resolve().parent / "results"
TOPIC = "sensor-readings"
SERVICES = ("kafka", "minio", "ingest", "maintain", "prometheus")
MIB = 2**20


def _query(port: int, promql: str) -> float | None:
    """One instant PromQL value from the compose Prometheus (None when there is no sample yet)."""
    body = http.get_json(f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(promql)}", 5.0)
    result = (body or {}).get("data", {}).get("result") or []
    return float(result[0]["value"][1]) if result else None


class Lake:
    """The deployment's tables as the host reads them with delta-rs and the reader key."""

    def __init__(self, scratch: containers.Scratch) -> None:
        self.settings = load_settings(env=scratch.host_env())

    def table(self, name: str) -> DeltaTable | None:
        try:
            uri = delta_rs_uri(self.settings.storage.table_uri(name))
            return DeltaTable(uri, storage_options=delta_storage_options(self.settings))
        except TableNotFoundError:
            return None

    def files(self, name: str) -> int | None:
        table = self.table(name)
        return len(table.file_uris()) if table is not None else None

    def rows(self, name: str, distinct: str | None = None) -> int:
        table = self.table(name)
        if table is None:
            return 0
        if distinct is None:
            return table.to_pyarrow_dataset().count_rows()
        return len(set(table.to_pyarrow_table(columns=[distinct]).column(distinct).to_pylist()))


def sample(scratch: containers.Scratch, lake: Lake, started: float) -> dict[str, Any]:
    """One look at the deployment."""
    d, port = scratch.deployment, scratch.ports["PROMETHEUS_PORT"]
    looks = procs.snapshot()
    parents = {pid: look.ppid for pid, look in looks.items()}
    rss, restarts = {}, {}
    for service in SERVICES:
        pid, restarts[service] = (int(v) for v in d.inspect(service, "{{.State.Pid}} {{.RestartCount}}").split())
        tree = procs.descendants([pid], parents) if pid else set()
        rss[service] = round(sum(looks[p].rss for p in tree) / MIB, 1)
    return {
        "t_s": round(time.monotonic() - started, 1),
        "lag_messages": _query(port, "sum(iot_ingest_kafka_lag_messages)"),
        "input_rows_per_s": _query(port, "sum(rate(iot_ingest_input_rows_total[1m]))"),
        "rss_mib": rss,
        "restarts": restarts,
        "readings_files": lake.files("readings"),
        "optimize_runs": _query(port, 'sum(iot_maintenance_runs_total{operation="optimize"})'),
        "files_compacted": _query(port, 'sum(iot_maintenance_files_compacted_total{operation="optimize"})'),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=5_000, help="simulator messages per second (default 5000)")
    p.add_argument("--minutes", type=float, default=15.0, help="how long the simulator sends (default 15)")
    p.add_argument("--every", type=float, default=15.0, help="seconds between samples (default 15)")
    p.add_argument("--drain-minutes", type=float, default=30.0, help="how long to wait for the job to catch up")
    p.add_argument(
        "--override", type=Path, action="append", default=[], help="a compose override file (e.g. the deploy test's "
        "tests/deploy/compose.test.yml: a sidecar that compacts every few batches); repeatable",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    load = report.machine()["loadavg_at_start"]
    count = int(args.rate * args.minutes * 60)
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="iotlake-soak-") as work:
        home = Path(work)
        with containers.scratch_deployment(home, TOPIC, [o.resolve() for o in args.override]) as scratch:
            lake = Lake(scratch)
            started = time.monotonic()
            sim = scratch.deployment.simulator(
                scratch.out, home / "simulator.log",
                "--bootstrap-servers", "kafka:19092", "--topic", TOPIC, "--count", str(count),
                "--rate", str(args.rate), "--summary-json", "/out/summary.json", "--metrics-port", "9110",
                "--progress-interval", "60", *FAULTS,
            )  # fmt: skip
            while sim.poll() is None:
                samples.append(sample(scratch, lake, started))
                print(json.dumps(samples[-1]), flush=True)
                time.sleep(args.every)
            if sim.returncode != 0:
                log = (home / "simulator.log").read_text()[-3000:]
                raise SystemExit(f"the simulator exited {sim.returncode}:\n{log}")
            sent = json.loads((scratch.out / "summary.json").read_text())
            produced_s = time.monotonic() - started
            deadline = time.monotonic() + args.drain_minutes * 60
            while True:
                samples.append(sample(scratch, lake, started))
                print(json.dumps(samples[-1]), flush=True)
                readings = lake.rows("readings")
                if readings >= sent["valid_distinct"] or time.monotonic() > deadline:
                    break
                time.sleep(args.every)
            drained_s = time.monotonic() - started - produced_s
            counts = {
                "readings_rows": lake.rows("readings"),
                "readings_distinct_event_ids": lake.rows("readings", distinct="event_id"),
                "quarantine_rows": lake.rows("quarantine"),
                "expected_readings": sent["valid_distinct"],
                "expected_quarantine": sent["malformed_total"],
            }
    result = {
        "date": datetime.now(UTC).date().isoformat(),
        "commit": report.git_commit(),
        "load_average_at_start": load,
        "command": shlex.join(["python", "-m", "bench.soak", *(sys.argv[1:] if argv is None else argv)]),
        "suffix": "".join("-" + o.name.removesuffix(".yml").replace(".", "-") for o in args.override),
        "overrides": [str(o) for o in args.override],
        "rate": args.rate,
        "minutes": args.minutes,
        "sent": {k: sent[k] for k in ("sent_total", "valid_distinct", "malformed_total", "msgs_per_s") if k in sent},
        "produced_s": round(produced_s, 1),
        "drain_s": round(drained_s, 1),
        "counts": counts,
        "exact": counts["readings_rows"] == counts["readings_distinct_event_ids"] == counts["expected_readings"]
        and counts["quarantine_rows"] == counts["expected_quarantine"],
        "samples": samples,
    }
    write(result, args.out)
    return 0


def _span(values: list[float | None]) -> str:
    seen = [v for v in values if v is not None]
    return f"{min(seen):,.0f} / {max(seen):,.0f} / {seen[-1]:,.0f}" if seen else "no sample"


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{result['date']}-soak{result.get('suffix', '')}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    samples = result["samples"]
    produced = [s for s in samples if s["t_s"] <= result["produced_s"]]
    counts = result["counts"]
    lines = [
        f"# Compose soak, {result['date']}",
        "",
        f"Commit `{result['commit']['commit'][:12]}`; load average at start "
        f"{' '.join(result['load_average_at_start'])}; command `{result['command']}`"
        + (f" (compose overrides: {', '.join(result['overrides'])})." if result.get("overrides") else "."),
        "",
        f"- Sent: {result['sent']} in {result['produced_s']} s; the job needed {result['drain_s']} s more to read "
        "the rest of the topic.",
        f"- Tables exact: **{result['exact']}** ({counts}).",
        "",
        "| figure (while producing) | min / max / last |",
        "|---|---|",
        f"| Kafka lag, messages | {_span([s['lag_messages'] for s in produced])} |",
        f"| job input, rows/s (1 min rate) | {_span([s['input_rows_per_s'] for s in produced])} |",
        f"| readings data files | {_span([s['readings_files'] for s in samples])} |",
        f"| sidecar OPTIMIZE runs | {_span([s['optimize_runs'] for s in samples])} |",
        *[f"| RSS {service}, MiB | {_span([s['rss_mib'][service] for s in samples])} |" for service in SERVICES],
        f"| restarts (last sample) | {samples[-1]['restarts'] if samples else 'no sample'} |",
    ]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
