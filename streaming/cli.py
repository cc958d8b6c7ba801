"""`iotlake`: run the streaming job, inspect the lake, print the effective config."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence

from streaming.config import DEFAULT_CONFIG_PATH, Settings, load_settings
from streaming.errors import IotLakeError
from streaming.ops import OPS_COMMANDS, add_ops_parsers


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

    config = sub.add_parser("config", help="print the effective config, secrets masked")
    config.add_argument("--json", action="store_true", help="JSON instead of YAML-ish text")
    add_ops_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command == "ingest" else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = load_settings(args.config)
        return _COMMANDS[args.command](settings, args)
    except IotLakeError as e:
        print(f"iotlake: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


def _ingest(settings: Settings, args: argparse.Namespace) -> int:
    from streaming.ingest import run

    reports = run(settings, available_now=args.available_now)
    total = sum(r.input_rows for r in reports)
    print(f"iotlake ingest: {len(reports)} batch(es), {total} message(s) processed")
    return 0


def _status(settings: Settings, args: argparse.Namespace) -> int:
    from streaming.status import status

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
    print(f"\ncheckpoint: {s['checkpoint']}\nlast batch: {s['last_batch_id']}\nkafka lag:  {s['total_lag']} message(s)")
    for partition, lag in sorted(s["lag"].items()):
        print(f"  partition {partition}: {lag}")
    return 0


def _config(settings: Settings, args: argparse.Namespace) -> int:
    if args.json:
        print(settings.to_json())
    else:
        import yaml

        print(yaml.safe_dump(settings.masked(), sort_keys=False))
    return 0


_COMMANDS = {"ingest": _ingest, "status": _status, "config": _config, **OPS_COMMANDS}

if __name__ == "__main__":
    sys.exit(main())
