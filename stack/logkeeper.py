"""The log keeper: a small detached process `stack up` starts beside the services, rotating every log the stack
and `make run` write (stack.logrotate) every 30 s, so they stay bounded while only `make up` runs.

`python -m stack.logkeeper --home <home>`; pid file run/logkeeper.pid, its own messages in logs/logkeeper.log.
Stopped by `stack down` (SIGTERM). `make run`'s supervisor rotates the same files; a rotation holds a lock on
the log, so the two never rotate one file at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from stack import kafka, logrotate, minio, proc, spark_cluster
from stack import prometheus as prom
from stack.addresses import MAX_KAFKA_NODES
from stack.layout import StackLayout, default_cache
from streaming.core.config import PROJECT_ROOT

INTERVAL_S = 30.0
RUN_LOGS = ("ingest", "maintain", "sensor-sim")  # `make run`'s children (streaming/cli/run.py)
STOP_TIMEOUT_S = 10.0


def service(layout: StackLayout) -> proc.Service:
    return proc.Service(
        name="logkeeper",
        pidfile=layout.pidfile("logkeeper"),
        log=layout.log("logkeeper"),
        marker=f"stack.logkeeper --home {layout.home} ",
    )


def service_logs(layout: StackLayout) -> list[Path]:
    """The stdout logs of the stack's detached services (Kafka's own log4j files roll by themselves)."""
    nodes = [kafka.node_service(layout, n).log for n in range(1, MAX_KAFKA_NODES + 1)]
    services = (minio.service(layout), prom.service(layout))
    cluster = (spark_cluster.master_service(layout), spark_cluster.worker_service(layout))
    return [*nodes, *(s.log for s in services), *(s.log for s in cluster)]


def logs(layout: StackLayout) -> list[Path]:
    """Every log the keeper rotates: the services', `make run`'s children's and its own."""
    return [*service_logs(layout), *(layout.log(name) for name in RUN_LOGS), layout.log("logkeeper")]


def argv(layout: StackLayout, policy: logrotate.RotationPolicy, interval_s: float) -> list[str]:
    return [
        sys.executable, "-m", "stack.logkeeper",
        "--home", str(layout.home),
        "--interval", f"{interval_s:g}",
        "--max-bytes", str(policy.max_bytes),
        "--keep", str(policy.keep),
    ]  # fmt: skip


def launch(
    layout: StackLayout, policy: logrotate.RotationPolicy | None = None, interval_s: float = INTERVAL_S
) -> tuple[int, bool]:
    """Start the keeper detached unless one runs for this home. Returns (pid, reused)."""
    svc = service(layout)
    pid = proc.read_pid(svc)
    if pid is not None:
        return pid, True
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    command = argv(layout, policy or logrotate.RotationPolicy(), interval_s)
    return proc.start(svc, command, env=env, cwd=layout.home), False


def stop(layout: StackLayout, timeout: float = STOP_TIMEOUT_S) -> int | None:
    return proc.stop(service(layout), timeout)


def keep(layout: StackLayout, policy: logrotate.RotationPolicy, interval_s: float, stop: threading.Event) -> None:
    """Rotate every `interval_s` until `stop` is set or the home is gone; a failed rotation is reported, the
    loop goes on."""
    while not stop.is_set() and layout.home.is_dir():
        try:
            for path in logrotate.rotate_all(logs(layout), policy):
                print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} rotated {path}", flush=True)
        except OSError as e:
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} rotation failed: {e}", file=sys.stderr, flush=True)
        stop.wait(interval_s)


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack.logkeeper", description=__doc__)
    parser.add_argument("--home", required=True, help="the stack's home (its logs/ folder is kept)")
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between rounds")
    parser.add_argument("--max-bytes", type=int, default=logrotate.DEFAULT_MAX_BYTES, help="rotate at this size")
    parser.add_argument("--keep", type=int, default=logrotate.DEFAULT_KEEP, help="rotated copies kept")
    ns = parser.parse_args(args)
    layout = StackLayout(home=Path(ns.home).resolve(), cache=default_cache())
    policy = logrotate.RotationPolicy(ns.max_bytes, ns.keep)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    keep(layout, policy, ns.interval, stopping)
    return 0


if __name__ == "__main__":
    sys.exit(main())
