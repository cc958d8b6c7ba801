"""sensor-sim: flags (each with a SENSOR_SIM_* fallback), the send loop, progress lines and the summary."""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any, NoReturn, TextIO

from producers.accounting import UNCONFIRMED, Accounting, merge_summaries
from producers.backends import BACKENDS, Backend, KafkaTarget, OnAck, OnFail, create_backend
from producers.errors import SimulatorError, UsageError
from producers.faults import DUPLICATE, LATE, MALFORMED_KINDS, OUT_OF_ORDER, VALID
from producers.metrics import SimulatorMetrics
from producers.options import SimOptions, check_start_time, iso_utc, parse_kinds, parse_start_time
from producers.pacing import TokenBucket
from producers.stream import EventStream, Message, wall_clock_ms

ENV_PREFIX = "SENSOR_SIM_"
DEFAULT_COUNT = 10_000
BATCH = 2_000  # messages between two polls of the client (and two looks at the clock)
EXIT_OK, EXIT_DELIVERY_FAILED, EXIT_INTERRUPTED = 0, 1, 130
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class RunConfig:
    """A validated command line: what to generate, where to send it, how fast, what to report."""

    options: SimOptions
    target: KafkaTarget
    backend: str = "confluent"
    rate: float = 1000.0
    duration_s: float | None = None
    progress_interval_s: float = 1.0
    quiet: bool = False
    summary_json: Path | None = None
    connect_timeout_s: float = 10.0
    dry_run: bool = False
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    notes: tuple[str, ...] = field(default=())
    label: str = "sensor-sim"  # of progress lines: "sensor-sim[2/4]" in a --workers process
    print_summary: bool = True  # a --workers process leaves the summary to the parent


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError (one line, exit 2) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def env_name(flag: str) -> str:
    """SENSOR_SIM_<NAME> for --name."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


def _number(flag: str, cast: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type that names both the flag and its environment variable on error."""

    def convert(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            kind = "an integer" if cast is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind} (from {flag} or {env_name(flag)})") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number (from {flag} or {env_name(flag)})")
        return value

    convert.__name__ = cast.__name__
    return convert


def _env_bool(env: Mapping[str, str], flag: str) -> bool:
    """A boolean environment fallback: 1/true/yes/on or 0/false/no/off."""
    text = env.get(env_name(flag), "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise UsageError(f"{env_name(flag)}={text!r} is not a boolean; use 1/true/yes/on or 0/false/no/off")


def _env_list(env: Mapping[str, str], flag: str) -> list[str]:
    """A comma-separated environment fallback for a repeatable flag."""
    return [part.strip() for part in env.get(env_name(flag), "").split(",") if part.strip()]


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    """The sensor-sim argument parser; defaults come from `env` where set."""
    parser = _Parser(
        prog="sensor-sim",
        description=(
            "Simulate IoT sensors (devices on farm parcels) and produce their readings as JSON to Kafka, "
            "with exact, seeded fault injection. Every flag falls back to the environment variable shown."
        ),
        epilog=(
            "Exit codes: 0 ok, 1 deliveries failed, 2 bad flags, 3 Kafka unreachable, 4 sensor-sim bug, "
            "130 interrupted."
        ),
    )

    def add(group: Any, flag: str, help_text: str, default: Any = None, **kwargs: Any) -> None:
        """A flag whose default is its environment variable, if set (converted by `type`)."""
        name = env_name(flag)
        shown = f" (default: {default})" if default is not None else ""
        help_text = f"{help_text}{shown} [env: {name}]"
        group.add_argument(flag, default=env.get(name, default), help=help_text, **kwargs)

    def add_late_env(group: Any, flag: str, help_text: str, env_note: str = "", **kwargs: Any) -> None:
        """A flag (boolean or repeatable) whose environment fallback parse_config applies itself."""
        group.add_argument(flag, help=f"{help_text} [env: {env_name(flag)}{env_note}]", **kwargs)

    def number(group: Any, flag: str, help_text: str, default: Any, cast: Callable[[str], Any] = float) -> None:
        add(group, flag, help_text, default, type=_number(flag, cast), metavar="N")

    kafka = parser.add_argument_group("Kafka")
    add(
        kafka,
        "--bootstrap-servers",
        "Kafka bootstrap servers, comma-separated",
        "127.0.0.1:9092",
        metavar="HOSTS",
    )
    add(kafka, "--topic", "topic to produce to", "sensor-readings", metavar="NAME")
    add(kafka, "--backend", f"Kafka client: {' or '.join(BACKENDS)}", "confluent", choices=BACKENDS)
    number(kafka, "--connect-timeout", "seconds to wait for Kafka's metadata answer before giving up", 10.0)
    number(kafka, "--delivery-timeout", "seconds a message may wait for its acknowledgement", 120.0)
    add_late_env(
        kafka,
        "--producer-config",
        "extra client setting, repeatable, e.g. security.protocol=SSL",
        ", comma-separated",
        action="append",
        metavar="KEY=VALUE",
    )
    add_late_env(kafka, "--dry-run", "generate and count without Kafka (measures the generator)", action="store_true")

    sim = parser.add_argument_group("simulation")
    number(sim, "--devices", "number of devices", 100, int)
    number(sim, "--parcels", "number of parcels (device i sits on parcel i mod parcels)", 10, int)
    number(sim, "--rate", "messages per second; 0 = as fast as possible", 1000.0)
    number(
        sim,
        "--workers",
        "processes (one Kafka producer each) that share the devices, the count and the rate; one summary",
        1,
        int,
    )
    amount = sim.add_mutually_exclusive_group()
    amount.add_argument(
        "--count",
        type=_number("--count", int),
        metavar="N",
        help=f"messages to send (default: {DEFAULT_COUNT} unless --duration) [env: {env_name('--count')}]",
    )
    amount.add_argument(
        "--duration",
        type=_number("--duration", float),
        metavar="SECONDS",
        help=f"send for this many seconds instead of a count [env: {env_name('--duration')}]",
    )
    number(
        sim,
        "--seed",
        "random seed; same seed and start time give the same bytes (default: random)",
        None,
        int,
    )
    add(
        sim,
        "--start-time",
        "simulated time of the first event: epoch ms or ISO-8601 (naive = UTC); capped at the wall clock",
        "now",
        metavar="TIME",
    )
    number(sim, "--time-step-ms", "simulated ms between events when --rate is 0 (else 1000/rate)", 1.0)
    add_late_env(
        sim,
        "--add-field",
        "schema drift: every valid event also carries NAME with a float value; repeatable",
        ", comma-separated",
        action="append",
        metavar="NAME",
    )

    faults = parser.add_argument_group("fault injection (fractions of messages, in [0, 1], summing to <= 1)")
    number(faults, "--duplicate-rate", "re-send the exact bytes of an earlier valid message", 0.0)
    number(faults, "--out-of-order-rate", "hold a valid event back until after its device's next one", 0.0)
    number(faults, "--late-rate", "valid events stamped 5 min to 6 h behind the clock", 0.0)
    number(faults, "--malformed-rate", "messages the streaming job must quarantine", 0.0)
    add(
        faults,
        "--malformed-kinds",
        f"comma list of {', '.join(MALFORMED_KINDS)} or all",
        "all",
        metavar="KINDS",
    )

    report = parser.add_argument_group("reporting")
    add(report, "--summary-json", "also write the run summary as JSON to PATH", metavar="PATH")
    number(report, "--progress-interval", "seconds between progress lines on stderr", 1.0)
    number(report, "--metrics-port", "serve Prometheus /metrics on this port while running; 0 = off", 0, int)
    add(report, "--metrics-host", "address the /metrics server listens on", "127.0.0.1", metavar="HOST")
    add(
        report,
        "--quiet",
        "no progress lines and no summary text (errors still go to stderr)",
        action="store_true",
    )
    return parser


def parse_config(argv: list[str] | None, env: Mapping[str, str], now_ms: int) -> RunConfig:
    """Flags, then environment fallbacks, validated into a RunConfig (raises UsageError)."""
    parser = build_parser(env)
    # Boolean and list fallbacks can't go through argparse defaults without surprises.
    parser.set_defaults(quiet=_env_bool(env, "--quiet"), dry_run=_env_bool(env, "--dry-run"))
    ns = parser.parse_args(argv)
    count, duration = _count_and_duration(ns, env)
    rate = float(ns.rate)
    if rate < 0:
        raise UsageError(f"--rate must be >= 0 (0 = as fast as possible), got {ns.rate}")
    for flag, value in (
        ("--progress-interval", ns.progress_interval),
        ("--connect-timeout", ns.connect_timeout),
        ("--delivery-timeout", ns.delivery_timeout),
    ):
        if value <= 0:
            raise UsageError(f"{flag} must be > 0 seconds, got {value}")
    if not 0 <= ns.metrics_port <= 65535:
        raise UsageError(f"--metrics-port must be 0..65535 (0 = off), got {ns.metrics_port}")
    if ns.workers > 1 and ns.metrics_port:
        raise UsageError("--metrics-port serves one process's counters: use it with --workers 1, or drop it")
    if count is not None and ns.workers > count >= 1:
        raise UsageError(f"--workers ({ns.workers}) exceeds --count ({count}): every worker needs a message")
    start_ms = parse_start_time(str(ns.start_time), now_ms)
    check_start_time(start_ms, now_ms)
    notes: list[str] = []
    if start_ms > now_ms:
        notes.append(f"--start-time {iso_utc(start_ms)} is in the future: event times stay at the wall clock")
    options = SimOptions(
        seed=ns.seed if ns.seed is not None else secrets.randbelow(2**31),
        start_time_ms=start_ms,
        devices=ns.devices,
        parcels=ns.parcels,
        count=count,
        step_ms=1000.0 / rate if rate > 0 else float(ns.time_step_ms),
        duplicate_rate=ns.duplicate_rate,
        out_of_order_rate=ns.out_of_order_rate,
        late_rate=ns.late_rate,
        malformed_rate=ns.malformed_rate,
        malformed_kinds=parse_kinds(ns.malformed_kinds),
        added_fields=tuple(ns.add_field if ns.add_field is not None else _env_list(env, "--add-field")),
        workers=ns.workers,
    )
    raw_config = ns.producer_config if ns.producer_config is not None else _env_list(env, "--producer-config")
    target = KafkaTarget(
        bootstrap_servers=ns.bootstrap_servers,
        topic=ns.topic,
        delivery_timeout_s=ns.delivery_timeout,
        extra_config=_key_values(raw_config),
    )
    summary_json = Path(ns.summary_json) if ns.summary_json else None
    return RunConfig(
        options=options,
        target=target,
        backend=ns.backend,
        rate=rate,
        duration_s=duration,
        progress_interval_s=ns.progress_interval,
        quiet=ns.quiet,
        summary_json=summary_json,
        connect_timeout_s=ns.connect_timeout,
        dry_run=ns.dry_run,
        metrics_port=ns.metrics_port,
        metrics_host=str(ns.metrics_host),
        notes=tuple(notes),
    )


def _count_and_duration(ns: argparse.Namespace, env: Mapping[str, str]) -> tuple[int | None, float | None]:
    """--count or --duration (flags win over the environment); a count of 10000 if neither is set."""
    count, duration = ns.count, ns.duration
    if count is None and duration is None:
        env_count, env_duration = env.get(env_name("--count")), env.get(env_name("--duration"))
        if env_count and env_duration:
            raise UsageError(f"both {env_name('--count')} and {env_name('--duration')} are set; unset one of them")
        if env_count:
            count = _parse_env_number("--count", env_count, int)
        elif env_duration:
            duration = _parse_env_number("--duration", env_duration, float)
    if duration is not None:
        if duration <= 0:
            raise UsageError(f"--duration must be > 0 seconds, got {duration}")
        return None, float(duration)
    return (DEFAULT_COUNT if count is None else count), None


def _parse_env_number(flag: str, text: str, cast: Callable[[str], Any]) -> Any:
    try:
        return _number(flag, cast)(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"argument {flag}: {exc}") from None


def _key_values(items: list[str]) -> dict[str, str]:
    """KEY=VALUE strings as a dict."""
    config: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--producer-config {item!r} is not KEY=VALUE, e.g. security.protocol=SSL")
        config[key.strip()] = value.strip()
    return config


def progress_line(
    sent: int, rate: float, failed: int, queued: int, last_error: str | None, label: str = "sensor-sim"
) -> str:
    """One progress line: acknowledged, throughput, failures, still waiting for acknowledgement."""
    line = f"{label}: sent={sent:,} rate={rate:,.0f} msgs/s failed={failed:,} queued={queued:,}"
    return f"{line} last_error={last_error!r}" if last_error else line


def format_summary(s: Mapping[str, Any]) -> str:
    """The run summary, readable."""
    where = (
        "(dry run, no Kafka)"
        if s["backend"] == "dry-run"
        else (f"to {s['topic']} at {s['bootstrap_servers']} via {s['backend']}")
    )
    kinds = ", ".join(f"{kind}={count:,}" for kind, count in s["malformed_by_kind"].items() if count)
    errors = ", ".join(f"{name}={count:,}" for name, count in s["delivery_errors"].items())
    lines = [
        f"sensor-sim: sent {s['sent_total']:,} messages {where} in {s['elapsed_s']:.2f} s "
        f"({s['msgs_per_s']:,.0f} msgs/s)",
        f"  valid distinct   {s['valid_distinct']:,}  (late {s['late']:,}, out of order {s['out_of_order']:,})",
        f"  duplicates       {s['duplicates']:,}",
        f"  malformed        {s['malformed_total']:,}" + (f"  ({kinds})" if kinds else ""),
        f"  delivery failed  {s['delivery_failed']:,}" + (f"  ({errors})" if errors else ""),
        f"  devices          {s['devices']:,} on {s['parcels']:,} parcels, "
        f"{len(s['latest_by_device']):,} with a valid event",
        f"  seed             {s['seed']}  (start time {s['start_time']} = {s['start_time_ms']})",
    ]
    if s["added_fields"]:
        lines.append(f"  added fields     {', '.join(s['added_fields'])}")
    return "\n".join(lines)


def run(
    config: RunConfig,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    metrics: SimulatorMetrics | None = None,
) -> int:
    """Generate, send, flush and report one run; the exit code.

    Metrics are kept when `metrics` is given or --metrics-port is set, and served on that port while running.
    """
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    for note in config.notes:
        print(f"sensor-sim: note: {note}", file=err)
    accounting = Accounting(config.options)
    name = "dry-run" if config.dry_run else config.backend
    if metrics is None and config.metrics_port:
        metrics = SimulatorMetrics()
    stop_metrics = _serve_metrics(metrics, config) if metrics is not None else _no_op
    try:
        if metrics is None:
            backend = create_backend(name, config.target, accounting.ack, accounting.fail)
        else:
            on_ack, on_fail = counted(accounting, metrics)
            observe = metrics.delivery_latency.observe
            backend = create_backend(name, config.target, on_ack, on_fail, on_latency=observe)
        try:
            backend.connect(config.connect_timeout_s)
            began = monotonic()
            produced, interrupted = _send_all(config, backend, accounting, err, monotonic, sleep)
            unreported = backend.flush(config.target.delivery_timeout_s + 5)
            accounting.unconfirmed(unreported)
            if metrics is not None and unreported > 0:
                metrics.failed.labels(UNCONFIRMED).inc(unreported)
            elapsed = monotonic() - began
        finally:
            backend.close()
    finally:
        stop_metrics()
    summary = accounting.summary(
        elapsed_s=elapsed,
        backend=backend.name,
        topic=None if config.dry_run else config.target.topic,
        bootstrap_servers=None if config.dry_run else config.target.bootstrap_servers,
    )
    summary["produced_total"] = produced
    summary["interrupted"] = interrupted
    return finish(config, summary, out, err)


def finish(config: RunConfig, summary: Mapping[str, Any], out: TextIO, err: TextIO) -> int:
    """Write and print the summary of a run (or of all its workers); the exit code."""
    if config.summary_json is not None:
        _write_json(config.summary_json, summary)
    talk = config.print_summary  # a --workers process leaves all of it to the parent
    if talk and not config.quiet:
        print(format_summary(summary), file=out)
    if summary["interrupted"]:
        if talk:
            print("sensor-sim: interrupted; the summary counts what Kafka acknowledged", file=err)
        return EXIT_INTERRUPTED
    if summary["delivery_failed"]:
        if talk:
            print(
                f"sensor-sim: error: {summary['delivery_failed']:,} message(s) were not acknowledged by Kafka "
                f"({', '.join(summary['delivery_errors'])}); check the broker at "
                f"{config.target.bootstrap_servers}",
                file=err,
            )
        return EXIT_DELIVERY_FAILED
    return EXIT_OK


def worker_config(config: RunConfig, worker: int, summary_json: Path) -> RunConfig:
    """What worker `worker` of --workers N runs: its devices, its share of the count and of the rate."""
    o = config.options
    n = o.workers
    count = None if o.count is None else o.count // n + (1 if worker < o.count % n else 0)
    return replace(
        config,
        options=replace(o, worker=worker, count=count),
        rate=config.rate / n,
        summary_json=summary_json,
        label=f"sensor-sim[{worker + 1}/{n}]",
        print_summary=False,
        notes=(),
    )


def run_workers(config: RunConfig, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """--workers N: N processes, each with its own producer, its devices and its share of the rate; one summary.

    A worker that can't run (Kafka unreachable, a bad producer setting) prints its own error; its exit code is
    returned. Ctrl-C reaches every worker of the terminal's process group; SIGTERM is passed on to them.
    """
    out, err = stdout or sys.stdout, stderr or sys.stderr
    for note in config.notes:
        print(f"sensor-sim: note: {note}", file=err)
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold client threads
    with tempfile.TemporaryDirectory(prefix="sensor-sim-workers-") as tmp:
        paths = [Path(tmp) / f"worker-{w}.json" for w in range(config.options.workers)]
        procs = [
            context.Process(target=_worker_main, args=(worker_config(config, w, path),), name=f"sensor-sim-{w + 1}")
            for w, path in enumerate(paths)
        ]
        for p in procs:
            p.start()
        try:
            for p in procs:
                p.join()
        except KeyboardInterrupt:
            for p in procs:
                if p.is_alive() and p.pid is not None:
                    os.kill(p.pid, signal.SIGTERM)
            for p in procs:
                p.join()
        codes = [p.exitcode for p in procs]
        if any(not path.exists() for path in paths):
            print(f"sensor-sim: error: not every worker finished its run (exit codes {codes}; see above)", file=err)
            return next((c for c in codes if c not in (EXIT_OK, None) and c > 0), 1)
        summary = merge_summaries([json.loads(path.read_text(encoding="utf-8")) for path in paths])
    return finish(config, summary, out, err)


def _worker_main(config: RunConfig) -> None:
    """One --workers process: SIGTERM stops it like Ctrl-C; its exit code is its run's."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = run(config)
    except SimulatorError as exc:
        print(f"{config.label}: error: {exc}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    sys.exit(code)


def counted(accounting: Accounting, metrics: SimulatorMetrics) -> tuple[OnAck, OnFail]:
    """Accounting's ack and fail, also counting each message by kind in the metrics."""
    kinds = (VALID, DUPLICATE, OUT_OF_ORDER, LATE, *MALFORMED_KINDS)
    sent = {kind: metrics.sent.labels(kind) for kind in kinds}  # every kind exported, from 0
    failed = {kind: metrics.failed.labels(kind) for kind in kinds}
    ack, fail = accounting.ack, accounting.fail

    def on_ack(m: Message) -> None:
        ack(m)
        sent[m[2]].inc()

    def on_fail(m: Message, reason: str) -> None:
        fail(m, reason)
        failed[m[2]].inc()

    return on_ack, on_fail


def _serve_metrics(metrics: SimulatorMetrics, config: RunConfig) -> Callable[[], None]:
    """Start /metrics; a port that can't be bound is a usage error naming the flag."""
    try:
        return metrics.serve(config.metrics_host, config.metrics_port)
    except OSError as exc:
        raise UsageError(
            f"--metrics-port {config.metrics_port}: cannot listen on {config.metrics_host}:{config.metrics_port} "
            f"({exc.strerror or exc}); choose a free port, or 0 to turn metrics off"
        ) from None


def _no_op() -> None:
    """Nothing to stop."""


def _send_all(
    config: RunConfig,
    backend: Backend,
    accounting: Accounting,
    err: TextIO,
    monotonic: Callable[[], float],
    sleep: Callable[[float], None],
) -> tuple[int, bool]:
    """The paced send loop; (messages handed to the client, whether Ctrl-C stopped it)."""
    stream = EventStream(config.options)
    messages = iter(stream)
    send = backend.send
    now = monotonic()
    bucket = TokenBucket(config.rate, now)
    batch_tokens = bucket.batch()
    deadline = now + config.duration_s if config.duration_s is not None else math.inf
    interval = config.progress_interval_s
    next_progress = now + interval
    last_report, last_sent = now, 0
    produced = 0
    try:
        while True:
            if now >= deadline:
                stream.stop()  # the stream still emits its held-back events, then ends
            granted = bucket.take(BATCH, now)
            if granted:
                batch = 0
                for msg in islice(messages, granted):
                    send(msg)
                    batch += 1
                produced += batch
                backend.poll()
                if batch < granted:
                    return produced, False
            else:
                # Wait for a few milliseconds' worth of tokens: a sleep per batch, not per message.
                sleep(max(0.001, min(bucket.wait_s(batch_tokens), next_progress - now, deadline - now)))
                backend.poll()
            now = monotonic()
            if now >= next_progress:
                if not config.quiet:
                    sent = accounting.sent_total
                    queued = produced - sent - accounting.delivery_failed
                    rate = (sent - last_sent) / (now - last_report)
                    print(
                        progress_line(sent, rate, accounting.delivery_failed, queued, backend.last_error, config.label),
                        file=err,
                        flush=True,
                    )
                    last_sent = sent
                last_report = now
                next_progress = now + interval
    except KeyboardInterrupt:
        return produced, True


def _write_json(path: Path, summary: Mapping[str, Any]) -> None:
    """Write the summary atomically (temp file, then rename)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise UsageError(f"--summary-json {path}: cannot write it ({exc.strerror}); choose a writable path") from None


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Entry point of `sensor-sim`; returns the exit code."""
    # SIGTERM stops the run like Ctrl-C: flush, then report what Kafka acknowledged.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main_thread else None
    try:
        config = parse_config(argv, os.environ, wall_clock_ms())
        return run_workers(config) if config.options.workers > 1 else run(config)
    except SimulatorError as exc:
        print(f"sensor-sim: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print("sensor-sim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
