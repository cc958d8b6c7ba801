"""`iotlake`: the streaming job, the sidecar, the whole pipeline live (`run`); lake status and table operations."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import date
from typing import Any

from streaming.core.config import DEFAULT_CONFIG_PATH, Settings, load_settings
from streaming.core.errors import IotLakeError, first_line
from streaming.lake.ops import OPS_COMMANDS, add_ops_parsers

# Every command's log lines; the benchmark parses the job's batch lines and the sidecar's OPTIMIZE lines.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="iotlake",
        description="Streaming IoT lakehouse ingestion: Kafka -> Spark Structured Streaming -> Delta Lake on MinIO.",
        epilog="Every config key can be overridden with IOTLAKE_<SECTION>__<KEY>, e.g. IOTLAKE_KAFKA__TOPIC=t1.",
    )
    parser.add_argument(
        "--config",
        help=f"YAML config file (default: {DEFAULT_CONFIG_PATH}) [env: IOTLAKE_CONFIG]",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every batch")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ingest = sub.add_parser("ingest", help="run the streaming job (until Ctrl-C / SIGTERM)")
    ingest.add_argument(
        "--available-now",
        action="store_true",
        help="process what is in the topic now, then exit (for tests, backfills and cron)",
    )

    status = sub.add_parser("status", help="tables (version, rows, files, size, last commit) and stream lag")
    status.add_argument("--json", action="store_true", help="machine-readable output")

    maintain = sub.add_parser(
        "maintain", help="the maintenance sidecar: table health metrics, compaction and VACUUM, in a loop"
    )
    maintain.add_argument("--once", action="store_true", help="one cycle, then exit (for cron)")
    maintain.add_argument("--json", action="store_true", help="print each cycle's report as JSON")

    optimize = sub.add_parser("optimize", help="compact (and Z-ORDER) now, with the sidecar's safety")
    optimize.add_argument("table", nargs="?", help="one table (default: all)")
    optimize.add_argument("--partition", type=_date, help="only this date partition (YYYY-MM-DD)")
    optimize.add_argument("--json", action="store_true", help="machine-readable output")

    vacuum = sub.add_parser("vacuum", help="delete unreferenced files older than the retention, now")
    vacuum.add_argument("table", nargs="?", help="one table (default: all)")
    vacuum.add_argument("--retention", help="e.g. '7 days' (default: tables.deleted_file_retention)")
    vacuum.add_argument("--json", action="store_true", help="machine-readable output")

    config = sub.add_parser("config", help="print the effective config, secrets masked")
    config.add_argument("--json", action="store_true", help="JSON instead of YAML-ish text")
    _add_run_parser(sub)
    add_ops_parsers(sub)
    return parser


def _add_run_parser(sub: Any) -> None:
    """`iotlake run`: the whole pipeline live, then a summary (the README's first command, via `make run`)."""
    parser = sub.add_parser("run", help="the whole pipeline live (stack, ingest, simulator), then a summary")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of simulated traffic (default 120)")
    parser.add_argument("--rate", type=int, default=5000, help="events per second from sensor-sim (default 5000)")
    parser.add_argument("--devices", type=int, default=200, help="simulated devices (default 200)")
    from stack.supervise import RestartPolicy

    default = RestartPolicy()
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=default.max_restarts,
        help="restarts of a dead ingest job or sidecar allowed within --restart-window, then exit 1 "
        f"(default {default.max_restarts})",
    )
    parser.add_argument(
        "--restart-window",
        type=float,
        default=default.window_s,
        help=f"seconds over which deaths count against --max-restarts (default {default.window_s:.0f})",
    )


def _run(settings: Settings, args: argparse.Namespace) -> int:
    from streaming.cli import run

    return run.run(settings, args)


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date; use YYYY-MM-DD") from e


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command in ("ingest", "maintain") else logging.WARNING,
        format=LOG_FORMAT,
    )
    try:
        settings = load_settings(args.config)
        return _COMMANDS[args.command](settings, args)
    except IotLakeError as e:
        print(f"iotlake: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # not one we foresaw: one line here, the full trace with -v
        if args.verbose:
            raise
        print(
            f"iotlake: error: `iotlake {args.command}` failed: {first_line(e)}\n"
            "Run it again with -v for the full trace; `iotlake status` shows whether the stack and tables answer.",
            file=sys.stderr,
        )
        return 1


def _ingest(settings: Settings, args: argparse.Namespace) -> int:
    from streaming.pipeline.faults import Faults
    from streaming.pipeline.ingest import run

    reports = run(settings, available_now=args.available_now, faults=Faults.from_env())
    total = sum(r.input_rows for r in reports)
    print(f"iotlake ingest: {len(reports)} batch(es), {total} message(s) processed")
    return 0


def _status(settings: Settings, args: argparse.Namespace) -> int:
    from streaming.lake.status import status

    data = status(settings)
    if args.json:
        print(json.dumps(data, indent=2, default=str))
        return 0
    print(f"{'table':<14}{'version':>8}{'rows':>12}{'files':>8}{'MiB':>10}  last commit")
    for t in data["tables"]:
        if not t["exists"]:
            print(f"{t['name']:<14}{'(not created yet)':>38}  {t['uri']}")
            continue
        mib = (t["bytes"] or 0) / 2**20
        print(f"{t['name']:<14}{t['version']:>8}{t['rows']:>12}{t['files']:>8}{mib:>10.2f}  {t['last_commit']}")
    s = data["stream"]
    lag = f"unknown ({s['kafka_note']})" if s["kafka_note"] else f"{s['total_lag']} message(s)"
    print(f"\ncheckpoint: {s['checkpoint']}\nlast batch: {s['last_batch_id']}\nkafka lag:  {lag}")
    for partition, lag in sorted(s["lag"].items()):
        print(f"  partition {partition}: {lag}")
    return 0


def _maintain(settings: Settings, args: argparse.Namespace) -> int:
    from streaming.lake.maintenance import CycleReport, run

    def show(report: CycleReport) -> None:
        if args.json:
            print(json.dumps(report.to_dict(), default=str), flush=True)
            return
        for r in report.optimized:
            print(
                f"optimize {r.table} {r.partition or '(table)'}: {r.outcome}, {r.files_before} -> {r.files_after} files"
            )
        for v in report.vacuumed:
            print(f"vacuum {v.table}: {v.outcome}, {v.files_deleted} files / {v.bytes_deleted} bytes deleted")
        for table, why in report.skipped.items():
            print(f"skipped {table}: {why}")

    run(settings, once=args.once, on_cycle=show)
    return 0


def _one_off(settings: Settings) -> Any:
    """A Maintainer on its own session, for `optimize` / `vacuum` (a second writer, like the sidecar)."""
    from streaming.lake.maintenance import Maintainer, session

    return Maintainer(session(settings), settings)


def _optimize(settings: Settings, args: argparse.Namespace) -> int:
    from streaming.lake.maintenance import manual_tasks, table_specs

    maintainer = _one_off(settings)
    results = []
    try:
        for spec in table_specs(settings, args.table):
            health = maintainer.measure(spec)
            if health is not None:
                results.extend(maintainer.compact(spec, health, manual_tasks(health, args.partition)))
    finally:
        maintainer.spark.stop()
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print(f"{'table':<14}{'partition':<26}{'files before':>13}{'after':>7}{'MiB rewritten':>15}  outcome")
        for r in results:
            mib, where = r.bytes_rewritten / 2**20, r.partition or "(table)"
            print(f"{r.table:<14}{where:<26}{r.files_before:>13}{r.files_after:>7}{mib:>15.2f}  {r.outcome}")
        if not results:
            print("nothing to compact: no partition has two or more small files")
    return 0 if all(r.outcome == "ok" for r in results) else 1


def _vacuum(settings: Settings, args: argparse.Namespace) -> int:
    from streaming.core.config import parse_duration
    from streaming.lake.maintenance import check_vacuum, table_specs

    retention = parse_duration(args.retention, "--retention") if args.retention else None
    for spec in table_specs(settings, args.table):  # refuse before starting Spark
        check_vacuum(settings, spec.name, retention)
    maintainer = _one_off(settings)
    results = []
    try:
        for spec in table_specs(settings, args.table):
            if maintainer.measure(spec) is not None:
                results.append(maintainer.vacuum(spec, retention))
    finally:
        maintainer.spark.stop()
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print(f"{'table':<14}{'retention h':>12}{'files deleted':>15}{'MiB deleted':>13}  outcome")
        for r in results:
            hours, mib = r.retention_s / 3600, r.bytes_deleted / 2**20
            print(f"{r.table:<14}{hours:>12.1f}{r.files_deleted:>15}{mib:>13.2f}  {r.outcome}")
    return 0 if all(r.outcome == "ok" for r in results) else 1


def _config(settings: Settings, args: argparse.Namespace) -> int:
    if args.json:
        print(settings.to_json())
    else:
        import yaml

        print(yaml.safe_dump(settings.masked(), sort_keys=False))
    return 0


_COMMANDS = {
    "ingest": _ingest,
    "status": _status,
    "maintain": _maintain,
    "optimize": _optimize,
    "vacuum": _vacuum,
    "config": _config,
    "run": _run,
    **OPS_COMMANDS,
}
