"""Command line of the native stack: `python -m stack install|up|down|status [--config PATH]`, and the compose
deployment's helpers (`stack.compose`: secrets, bootstrap, probe, daemon)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from stack import api, compose, containers
from stack.install import install
from stack.layout import StackLayout
from streaming.core import logstore
from streaming.core.config import Settings, load_settings
from streaming.core.errors import IotLakeError


def layout() -> StackLayout:
    """The layout from the environment (IOTLAKE_STACK_HOME, IOTLAKE_CACHE) or the defaults."""
    return StackLayout.default()


def load_settings_from(args: argparse.Namespace) -> Settings:
    return load_settings(getattr(args, "config", None))


def _install(args: argparse.Namespace) -> int:
    if logstore.needs_jar(load_settings_from(args)):
        logstore.find_javac()  # fail before the long downloads, not after them
    install(layout())
    if args.test_tools:  # only the tests check the compose file and lint the Dockerfile
        compose.install_compose(layout())
        compose.install_dockerfile_linter(layout())
    # Spark's jars come through Ivy; resolving them here (its own JVM) keeps the first job start short.
    env = dict(os.environ)
    if getattr(args, "config", None):
        env["IOTLAKE_CONFIG"] = args.config
    code = subprocess.run([sys.executable, "-m", "streaming.core.session"], env=env, check=False).returncode
    if code != 0:
        return code
    # The drivers' class archive (about 50 s, once per virtualenv): each JVM then starts ~4 s sooner. A failure is
    # one line of its own, and the jobs run without it.
    subprocess.run([sys.executable, "-m", "streaming.core.class_archive"], env=env, check=False)
    return 0


def _up(args: argparse.Namespace) -> int:
    api.up(load_settings_from(args), layout(), cluster=args.cluster)
    return 0


def _down(args: argparse.Namespace) -> int:
    api.down(layout())
    return 0


def _status(args: argparse.Namespace) -> int:
    info = api.status(load_settings_from(args), layout())
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(format_status(info))
    return 0


def format_status(info: dict[str, Any]) -> str:
    """One line per service: name, state, pid, address, log (the Spark cluster's lines only once started)."""
    lines = []
    for name in ("kafka", "minio", "prometheus", "spark-master", "spark-worker", "logkeeper"):
        svc = info.get(name)
        if svc is None or (name.startswith("spark") and svc["state"] == "stopped"):
            continue
        pid = f"pid {svc['pid']}" if svc["pid"] else "-"
        extra = f" (console {svc['console']})" if "console" in svc else ""
        extra += f" (SASL {svc['sasl_address']})" if svc.get("sasl_address") else ""
        lines.append(f"{name:<12} {svc['state']:<14} {pid:<10} {svc['address']}{extra}  log {svc['log']}")
    lines.append(f"{'home':<12} {info['home']}  cache {info['cache']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config", metavar="PATH", help="config YAML (default: $IOTLAKE_CONFIG or config/default.yaml)"
    )
    parser = argparse.ArgumentParser(
        prog="python -m stack",
        description="Native local stack: Kafka (KRaft), MinIO and Prometheus on loopback, optionally a Spark "
        "standalone cluster.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inst = sub.add_parser(
        "install",
        parents=[common],
        help="what running needs: Kafka jars, MinIO, Prometheus, the Spark jars and the log store, cached outside "
        "the clone",
    )
    inst.add_argument(
        "--test-tools",
        action="store_true",
        help="also what only the tests need: Docker Compose (checks the compose file) and the Dockerfile linter",
    )
    inst.set_defaults(func=_install)
    up = sub.add_parser(
        "up", parents=[common], help="install, start Kafka, MinIO and Prometheus, create the bucket, keys and topic"
    )
    up.add_argument(
        "--cluster",
        action="store_true",
        help="also start a Spark standalone master + worker on loopback (ports: spark_cluster.* in config)",
    )
    up.set_defaults(func=_up)
    sub.add_parser("down", parents=[common], help="stop the services this stack started").set_defaults(func=_down)
    status = sub.add_parser("status", parents=[common], help="each service: state, pid, address, log")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=_status)
    compose.register(sub, common)
    containers.register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; an IotLakeError prints its message (no traceback) and returns its exit code (2)."""
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except IotLakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
