"""sensor-sim's command line, send loop, pacing and backends, without a Kafka service."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from producers import EventStream, SimOptions, simulate
from producers import cli as cli_module
from producers.backends import ConfluentBackend, KafkaPythonBackend, KafkaTarget
from producers.cli import RunConfig, build_parser, main, parse_config, run
from producers.pacing import TokenBucket
from producers.stream import Message, wall_clock_ms

pytestmark = pytest.mark.unit

TIMING_KEYS = (
    "elapsed_s",
    "msgs_per_s",
    "backend",
    "topic",
    "bootstrap_servers",
    "produced_total",
    "interrupted",
)
FAULT_FLAGS = ["--duplicate-rate", "0.05", "--out-of-order-rate", "0.05", "--late-rate", "0.05"]
FAULT_FLAGS += ["--malformed-rate", "0.05"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SENSOR_SIM_"):
            monkeypatch.delenv(name)


def recent_start() -> int:
    """A start ten minutes ago: recent enough for the 7-day window, far enough that times are not capped."""
    return wall_clock_ms() - 600_000


def comparable(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in TIMING_KEYS}


class FakeClock:
    """Monotonic time that only moves when the code sleeps (or by a fixed tick per reading)."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now = 1000.0
        self.tick = tick
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        self.now += self.tick
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


def config(argv: list[str]) -> RunConfig:
    return parse_config(argv, {}, wall_clock_ms())


# --- flag validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "-1"], "--rate must be >= 0"),
        (["--rate", "fast"], "'fast' is not a number (from --rate or SENSOR_SIM_RATE)"),
        (["--duplicate-rate", "1.5"], r"--duplicate-rate must be within [0, 1], got 1.5"),
        (["--malformed-rate", "-0.2"], r"--malformed-rate must be within [0, 1]"),
        (["--devices", "0"], "--devices must be at least 1, got 0"),
        (["--devices", "2.5"], "'2.5' is not an integer"),
        (["--count", "5", "--duration", "3"], "argument --duration: not allowed with argument --count"),
        (["--count", "0"], "--count must be at least 1"),
        (["--duration", "0"], "--duration must be > 0"),
        (["--late-rate", "0.6", "--malformed-rate", "0.6"], "the fault rates add up to 1.2"),
        (["--malformed-kinds", "not_json,bogus"], "unknown kind(s) bogus"),
        (["--start-time", "2020-01-01"], "days ago"),
        (["--start-time", "soon"], "neither epoch milliseconds nor ISO-8601"),
        (["--add-field", "my field"], "not a valid field name"),
        (["--add-field", "battery_v"], "already a field"),
        (["--backend", "rdkafka"], "invalid choice: 'rdkafka'"),
        (["--producer-config", "acks"], "is not KEY=VALUE"),
        (["--progress-interval", "0"], "--progress-interval must be > 0"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_flags_exit_2_with_one_clear_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("sensor-sim: error: ")
    assert message in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SENSOR_SIM_RATE": "abc"}, "(from --rate or SENSOR_SIM_RATE)"),
        ({"SENSOR_SIM_LATE_RATE": "2"}, "--late-rate must be within [0, 1]"),
        ({"SENSOR_SIM_COUNT": "10", "SENSOR_SIM_DURATION": "5"}, "unset one of them"),
        ({"SENSOR_SIM_COUNT": "ten"}, "(from --count or SENSOR_SIM_COUNT)"),
        ({"SENSOR_SIM_QUIET": "maybe"}, "SENSOR_SIM_QUIET='maybe' is not a boolean"),
    ],
)
def test_bad_environment_values_exit_2_naming_the_variable(
    env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["--dry-run"]) == 2
    assert message in capsys.readouterr().err


def test_help_shows_the_environment_variable_of_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    flags = [a.option_strings[0] for a in build_parser({})._actions if a.option_strings[0] != "-h"]
    assert len(flags) >= 24
    for flag in flags:
        env = "SENSOR_SIM_" + flag[2:].upper().replace("-", "_")
        assert f"[env: {env}" in text, flag


def test_flags_win_over_the_environment_and_the_environment_over_defaults() -> None:
    env = {
        "SENSOR_SIM_COUNT": "321",
        "SENSOR_SIM_RATE": "0",
        "SENSOR_SIM_SEED": "9",
        "SENSOR_SIM_QUIET": "yes",
    }
    env |= {
        "SENSOR_SIM_ADD_FIELD": "soil_ph, leaf_wetness",
        "SENSOR_SIM_MALFORMED_KINDS": "not_json,wrong_type",
    }
    cfg = parse_config([], env, wall_clock_ms())
    o = cfg.options
    assert (o.count, cfg.rate, o.seed, cfg.quiet) == (321, 0.0, 9, True)
    assert o.added_fields == ("soil_ph", "leaf_wetness")
    assert o.malformed_kinds == ("not_json", "wrong_type")
    cfg = parse_config(["--count", "5", "--seed", "1", "--add-field", "x"], env, wall_clock_ms())
    assert (cfg.options.count, cfg.options.seed, cfg.options.added_fields) == (5, 1, ("x",))
    cfg = parse_config(["--duration", "2"], env, wall_clock_ms())  # a flag beats the other's env var
    assert (cfg.options.count, cfg.duration_s) == (None, 2.0)


def test_defaults_and_the_simulated_time_step() -> None:
    cfg = config([])
    assert (cfg.target.bootstrap_servers, cfg.target.topic, cfg.backend) == (
        "127.0.0.1:9092",
        "sensor-readings",
        "confluent",
    )
    assert (cfg.options.devices, cfg.options.parcels, cfg.options.count, cfg.rate) == (
        100,
        10,
        10_000,
        1000.0,
    )
    assert cfg.options.step_ms == 1.0  # 1000 / rate
    assert config(["--rate", "250"]).options.step_ms == 4.0
    assert config(["--rate", "0", "--time-step-ms", "7.5"]).options.step_ms == 7.5
    start = recent_start()
    assert config(["--start-time", str(start)]).options.start_time_ms == start
    seeds = {config([]).options.seed for _ in range(5)}
    assert len(seeds) > 1  # random unless given


# --- dry runs through the CLI --------------------------------------------------------------------


def test_dry_run_summary_equals_the_library_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    start = recent_start()
    path = tmp_path / "out" / "summary.json"
    argv = ["--dry-run", "--rate", "0", "--count", "6000", "--seed", "11", "--start-time", str(start)]
    argv += [
        "--devices",
        "30",
        "--parcels",
        "3",
        "--add-field",
        "soil_ph",
        "--summary-json",
        str(path),
        *FAULT_FLAGS,
    ]
    assert main(argv) == 0
    summary = json.loads(path.read_text())
    opts = SimOptions(
        seed=11,
        start_time_ms=start,
        devices=30,
        parcels=3,
        count=6000,
        duplicate_rate=0.05,
        out_of_order_rate=0.05,
        late_rate=0.05,
        malformed_rate=0.05,
        added_fields=("soil_ph",),
    )
    assert comparable(summary) == comparable(simulate(opts))
    assert summary["sent_total"] == summary["produced_total"] == 6000
    assert summary["backend"] == "dry-run"
    out = capsys.readouterr().out
    assert "sensor-sim: sent 6,000 messages (dry run, no Kafka)" in out
    assert "seed             11" in out


def test_quiet_prints_nothing_and_env_drives_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.json"
    for name, value in {"COUNT": "321", "DRY_RUN": "1", "QUIET": "1", "RATE": "0", "SEED": "5"}.items():
        monkeypatch.setenv(f"SENSOR_SIM_{name}", value)
    monkeypatch.setenv("SENSOR_SIM_SUMMARY_JSON", str(path))
    assert main([]) == 0
    assert capsys.readouterr() == ("", "")
    summary = json.loads(path.read_text())
    assert (summary["sent_total"], summary["seed"]) == (321, 5)


def test_progress_lines_go_to_stderr_at_each_interval() -> None:
    clock = FakeClock(tick=0.3)  # every look at the clock is 0.3 s later
    out, err = io.StringIO(), io.StringIO()
    cfg = config(["--dry-run", "--rate", "0", "--count", "20000", "--progress-interval", "1"])
    assert run(cfg, stdout=out, stderr=err, monotonic=clock.monotonic, sleep=clock.sleep) == 0
    lines = err.getvalue().splitlines()
    assert len(lines) >= 2
    assert all(line.startswith("sensor-sim: sent=") and " msgs/s failed=0 queued=0" in line for line in lines)
    assert "sent 20,000 messages" in out.getvalue()


def test_pacing_batches_messages_and_holds_the_rate_without_a_sleep_per_message() -> None:
    clock = FakeClock()
    cfg = config(["--dry-run", "--rate", "2000", "--count", "4000", "--quiet"])
    assert run(cfg, stdout=io.StringIO(), stderr=io.StringIO(), monotonic=clock.monotonic, sleep=clock.sleep) == 0
    elapsed = clock.now - 1000.0
    assert elapsed == pytest.approx(2.0, rel=0.05)  # 4000 messages at 2000/s
    assert len(clock.sleeps) < 4000 / 5  # batches, not a sleep per message


class RecordingBackend:
    """Acknowledges everything at once and keeps what it was given."""

    name = "recording"
    last_error = None

    def __init__(self, target: KafkaTarget, on_ack: Any, on_fail: Any) -> None:
        self.on_ack = on_ack
        self.sent: list[Message] = []

    def connect(self, timeout_s: float) -> None:
        pass

    def send(self, msg: Message) -> None:
        self.sent.append(msg)
        self.on_ack(msg)

    def poll(self) -> None:
        pass

    def flush(self, timeout_s: float) -> int:
        return 0

    def close(self) -> None:
        pass


def test_duration_stops_the_run_and_still_sends_held_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[RecordingBackend] = []

    def create(name: str, target: KafkaTarget, on_ack: Any, on_fail: Any) -> RecordingBackend:
        created.append(RecordingBackend(target, on_ack, on_fail))
        return created[0]

    monkeypatch.setattr(cli_module, "create_backend", create)
    clock = FakeClock()
    path = tmp_path / "s.json"
    argv = ["--rate", "500", "--duration", "3", "--out-of-order-rate", "0.3", "--quiet", "--seed", "4"]
    cfg = config([*argv, "--summary-json", str(path)])
    assert run(cfg, stdout=io.StringIO(), stderr=io.StringIO(), monotonic=clock.monotonic, sleep=clock.sleep) == 0
    summary = json.loads(path.read_text())
    assert 1400 <= summary["sent_total"] <= 1600
    assert clock.now - 1000.0 == pytest.approx(3.0, abs=0.1)
    # Every generated event went out, held-back ones included: event ids count 0, 1, 2, ... without a gap.
    numbers = sorted(int(json.loads(m.value)["event_id"][-12:], 16) for m in created[0].sent)
    assert numbers == list(range(len(numbers))) and len(numbers) == summary["sent_total"]
    assert summary["out_of_order"] > 300


# --- delivery outcomes (a fake client) -----------------------------------------------------------


class FlakyBackend:
    """Acknowledges on poll(), but fails originals with seq 3, 10, 17...; leaves 3 unreported at flush."""

    name = "flaky"
    last_error = "broker went away"

    def __init__(self, target: KafkaTarget, on_ack: Any, on_fail: Any) -> None:
        self.on_ack, self.on_fail = on_ack, on_fail
        self.pending: list[Message] = []
        self.sent = 0

    def connect(self, timeout_s: float) -> None:
        pass

    def send(self, msg: Message) -> None:
        self.sent += 1
        self.pending.append(msg)

    def poll(self) -> None:
        ready, self.pending = self.pending[:-3], self.pending[-3:]  # the last 3 never get a report
        for msg in ready:
            if msg.kind == "duplicate" or msg.seq % 7 != 3:
                self.on_ack(msg)
            else:
                self.on_fail(msg, "MSG_TIMED_OUT")

    def flush(self, timeout_s: float) -> int:
        self.poll()
        return len(self.pending)

    def close(self) -> None:
        pass


def test_delivery_failures_are_counted_reported_and_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backends: list[FlakyBackend] = []

    def fake_create(name: str, target: KafkaTarget, on_ack: Any, on_fail: Any) -> FlakyBackend:
        assert name == "confluent"
        backends.append(FlakyBackend(target, on_ack, on_fail))
        return backends[0]

    monkeypatch.setattr(cli_module, "create_backend", fake_create)
    path = tmp_path / "s.json"
    err = io.StringIO()
    cfg = config(["--rate", "0", "--count", "3000", "--summary-json", str(path), *FAULT_FLAGS])
    assert run(cfg, stdout=io.StringIO(), stderr=err) == 1
    summary = json.loads(path.read_text())
    assert summary["sent_total"] + summary["delivery_failed"] == backends[0].sent == 3000
    assert summary["delivery_errors"]["unconfirmed_at_exit"] == 3
    assert summary["delivery_errors"]["MSG_TIMED_OUT"] > 250
    assert summary["sent_total"] == summary["valid_distinct"] + summary["duplicates"] + summary["malformed_total"]
    assert "were not acknowledged by Kafka" in err.getvalue()


# --- the backends with fake clients --------------------------------------------------------------


class FakeFuture:
    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def add_both(self, fn: Any, *args: Any) -> None:
        self.callbacks.append((fn, args))


class FakeKafkaProducer:
    """kafka-python's KafkaProducer, resolving futures on another thread like its I/O thread."""

    instances: ClassVar[list[FakeKafkaProducer]] = []

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.futures: list[tuple[FakeFuture, bytes]] = []
        FakeKafkaProducer.instances.append(self)

    def partitions_for(self, topic: str) -> set[int]:
        return {0, 1, 2}

    def send(self, topic: str, value: bytes, key: bytes) -> FakeFuture:
        future = FakeFuture()
        self.futures.append((future, value))
        return future

    def flush(self, timeout: float | None = None) -> None:
        def resolve() -> None:
            for future, value in self.futures:
                result: Any = ValueError("boom") if b'"seq":3,' in value else object()
                for fn, args in future.callbacks:
                    fn(*args, result)
            self.futures = []

        worker = threading.Thread(target=resolve)
        worker.start()
        worker.join()

    def close(self, timeout: float | None = None) -> None:
        pass


def fake_kafka_module() -> types.ModuleType:
    errors = types.ModuleType("kafka.errors")
    for name in ("KafkaError", "KafkaTimeoutError", "BrokerNotAvailableError", "KafkaConfigurationError"):
        setattr(errors, name, type(name, (Exception,), {}))
    module = types.ModuleType("kafka")
    module.KafkaProducer = FakeKafkaProducer  # type: ignore[attr-defined]
    module.errors = errors  # type: ignore[attr-defined]
    return module


def test_kafka_python_backend_configures_the_client_and_accounts_on_the_main_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kafka = fake_kafka_module()
    monkeypatch.setitem(sys.modules, "kafka", kafka)
    monkeypatch.setitem(sys.modules, "kafka.errors", kafka.errors)
    acked: list[Message] = []
    failed: list[tuple[Message, str, str]] = []
    backend = KafkaPythonBackend(
        KafkaTarget("h1:9092,h2:9092", "t", 30.0, {"security.protocol": "SSL", "retries": "5"}),
        acked.append,
        lambda m, why: failed.append((m, why, threading.current_thread().name)),
    )
    backend.connect(2.0)
    producer = FakeKafkaProducer.instances[-1]
    assert producer.config["acks"] == "all" and producer.config["enable_idempotence"] is True
    assert producer.config["compression_type"] == "gzip"
    assert producer.config["bootstrap_servers"] == ["h1:9092", "h2:9092"]
    assert (producer.config["security_protocol"], producer.config["retries"]) == ("SSL", 5)
    assert producer.config["max_block_ms"] == 2000
    msgs = list(EventStream(SimOptions(seed=1, start_time_ms=recent_start(), devices=4, parcels=2, count=40)))
    for m in msgs:
        backend.send(m)
    assert backend.flush(5.0) == 0
    assert len(acked) == 36 and [m.seq for m, _, _ in failed] == [3, 3, 3, 3]
    assert {why for _, why, _ in failed} == {"ValueError"}
    assert {thread for _, _, thread in failed} == {threading.current_thread().name}


class FakeRecord:
    """What confluent-kafka hands a delivery callback: the message's key and value, and a latency."""

    def __init__(self, key: bytes, value: bytes) -> None:
        self._key, self._value = key, value

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def latency(self) -> float:
        return 0.002


class FakeConfluentProducer:
    """confluent_kafka.Producer whose queue is full for the first two produce() calls.

    It serves the reports of each key in produce order, as a partition's are, but the keys interleaved
    differently from how they were produced (newest key first); every seventh message fails.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.full = 2
        self.polls: list[float] = []
        self.queue: list[tuple[bytes, bytes]] = []
        self.reported: list[tuple[bytes, bytes, bool]] = []  # key, value, whether it failed

    def produce(self, topic: str, value: bytes, key: bytes) -> None:
        if self.full:
            self.full -= 1
            raise BufferError("queue full")
        self.queue.append((key, value))

    def poll(self, timeout: float) -> int:
        self.polls.append(timeout)
        served, self.queue = self.queue, []
        keys = list(dict.fromkeys(key for key, _ in reversed(served)))
        order = [(k, v) for key in keys for k, v in served if k == key]
        for i, (key, value) in enumerate(order):
            self.reported.append((key, value, i % 7 == 6))
            self.config["on_delivery"](FakeError() if i % 7 == 6 else None, FakeRecord(key, value))
        return len(served)

    def flush(self, timeout: float) -> int:
        self.poll(0)
        return 0


class FakeError:
    def name(self) -> str:
        return "MSG_TIMED_OUT"


def test_confluent_backend_configures_the_client_retries_a_full_queue_and_matches_each_report(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Producer", FakeConfluentProducer)
    acked: list[Message] = []
    failed: list[tuple[Message, str]] = []
    latencies: list[float] = []
    target = KafkaTarget("h:1", "t", 60.0, {"linger.ms": "5"})
    backend = ConfluentBackend(target, acked.append, lambda m, e: failed.append((m, e)), latencies.append)
    producer: Any = backend._producer
    assert producer.config["enable.idempotence"] is True and producer.config["acks"] == "all"
    assert producer.config["compression.type"] == "lz4"
    assert producer.config["message.timeout.ms"] == 60_000
    assert producer.config["linger.ms"] == "5"  # extra settings win
    msgs = list(EventStream(SimOptions(seed=1, start_time_ms=recent_start(), devices=3, parcels=1, count=30)))
    for m in msgs:
        backend.send(m)
    assert producer.polls == [0.1, 0.1]  # served reports while the queue was full, then retried
    assert backend.flush(1.0) == 0
    # Each report reached the message it belongs to, whatever the order across keys.
    assert [(m.key, m.value) for m in acked] == [(k, v) for k, v, refused in producer.reported if not refused]
    assert [(m.key, m.value) for m, _ in failed] == [(k, v) for k, v, refused in producer.reported if refused]
    assert sorted(acked + [m for m, _ in failed]) == sorted(msgs) and len(failed) == 4
    assert {why for _, why in failed} == {"MSG_TIMED_OUT"} and latencies == [0.002] * 26


def test_token_bucket_grants_what_the_rate_allows() -> None:
    bucket = TokenBucket(rate=100.0, now=0.0)
    assert bucket.take(1000, 0.0) == 1
    assert bucket.take(1000, 0.0) == 0
    assert bucket.wait_s() == pytest.approx(0.01)
    assert bucket.take(1000, 0.03) == 3
    assert bucket.take(1000, 10.0) == 5  # a stall does not buy a burst beyond 50 ms worth
    unlimited = TokenBucket(rate=0.0, now=0.0)
    assert unlimited.take(2000, 0.0) == 2000 and unlimited.wait_s() == 0.0


# --- unreachable Kafka ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["confluent", "kafka-python"])
def test_unreachable_kafka_exits_3_naming_the_servers_and_the_fix(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--backend",
        backend,
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--connect-timeout",
        "0.5",
        "--count",
        "5",
    ]
    assert main(argv) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert "Kafka at 127.0.0.1:1 did not answer" in err and "`make up`" in err
    assert "Traceback" not in err


# --- stopping early ------------------------------------------------------------------------------


def test_ctrl_c_flushes_and_reports_what_was_acknowledged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class InterruptedBackend(RecordingBackend):
        def send(self, msg: Message) -> None:
            if len(self.sent) == 1234:
                raise KeyboardInterrupt
            super().send(msg)

    monkeypatch.setattr(cli_module, "create_backend", lambda *a: InterruptedBackend(*a[1:]))
    path, err = tmp_path / "s.json", io.StringIO()
    cfg = config(["--rate", "0", "--count", "5000", "--summary-json", str(path)])
    assert run(cfg, stdout=io.StringIO(), stderr=err) == 130
    summary = json.loads(path.read_text())
    assert (summary["sent_total"], summary["interrupted"]) == (1234, True)
    assert "interrupted" in err.getvalue()


def spawn_sim(argv: list[str], summary: Path) -> subprocess.Popen[str]:
    """`python -m producers` with these flags and a summary file, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "producers", *argv, "--summary-json", str(summary)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def test_sigterm_stops_the_process_like_ctrl_c(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    process = spawn_sim(["--dry-run", "--rate", "200", "--duration", "120", "--progress-interval", "0.1"], path)
    assert process.stderr is not None
    assert process.stderr.readline().startswith("sensor-sim: sent=")  # running: it printed progress
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    summary = json.loads(path.read_text())
    assert summary["interrupted"] is True and 0 < summary["sent_total"] < 200 * 120
    assert "sensor-sim: sent" in out


def test_workers_run_as_processes_and_report_one_summary(tmp_path: Path) -> None:
    """--workers 2 (dry run): two processes, each its share of the count and its devices; the summary adds up."""
    from producers.accounting import merge_summaries

    start = recent_start()
    path = tmp_path / "s.json"
    argv = ["--dry-run", "--workers", "2", "--rate", "0", "--count", "5001", "--seed", "3", "--devices", "7"]
    argv += ["--parcels", "2"]
    argv += ["--start-time", str(start), "--summary-json", str(path), *FAULT_FLAGS]
    out, err = io.StringIO(), io.StringIO()
    config = parse_config(argv, {}, wall_clock_ms())
    assert cli_module.run_workers(config, stdout=out, stderr=err) == 0, err.getvalue()
    summary = json.loads(path.read_text())
    shares = [cli_module.worker_config(config, w, tmp_path / f"{w}.json").options for w in range(2)]
    assert [o.count for o in shares] == [2501, 2500]
    assert comparable(summary) == comparable(merge_summaries([simulate(o) for o in shares]))
    assert summary["sent_total"] == 5001 and summary["workers"] == 2
    assert "sensor-sim: sent 5,001 messages (dry run, no Kafka)" in out.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "2", "--metrics-port", "9999"], "--metrics-port serves one process's counters"),
        (["--workers", "3", "--count", "2"], r"--workers \(3\) exceeds --count \(2\)"),
        (["--workers", "0"], "--workers must be at least 1"),
    ],
)
def test_bad_worker_flags_name_the_problem(argv: list[str], message: str) -> None:
    with pytest.raises(cli_module.UsageError, match=message):
        parse_config(argv, {}, wall_clock_ms())


def test_sigterm_stops_every_worker_and_the_summary_says_so(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    argv = ["--dry-run", "--workers", "2", "--rate", "400", "--duration", "120", "--progress-interval", "0.1"]
    process = spawn_sim(argv, path)
    assert process.stderr is not None
    seen: set[str] = set()
    while len(seen) < 2:  # both workers running: each printed progress (readline blocks until a line comes)
        line = process.stderr.readline()
        assert line, "sensor-sim ended before both workers printed progress"
        seen.update(w for w in ("[1/2]", "[2/2]") if line.startswith(f"sensor-sim{w}: sent="))
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    summary = json.loads(path.read_text())
    assert summary["interrupted"] is True and summary["workers"] == 2
    assert 0 < summary["sent_total"] < 400 * 120
    assert "sensor-sim: sent" in out
