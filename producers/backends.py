"""Kafka clients behind one small interface: confluent-kafka, kafka-python, and a no-Kafka dry run."""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from producers.errors import BackendUnavailableError, DeliveryReportError, KafkaUnreachableError, UsageError
from producers.stream import Message

BACKENDS = ("confluent", "kafka-python")
OnAck = Callable[[Message], None]
OnFail = Callable[[Message, str], None]
OnLatency = Callable[[float], None]  # seconds from send to a successful delivery report

# librdkafka logs through this logger; errors reach the user through error_cb instead.
_client_log = logging.getLogger("producers.kafka-client")
_client_log.addHandler(logging.NullHandler())
_client_log.propagate = False


@dataclass(frozen=True)
class KafkaTarget:
    """Where and how to produce."""

    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = "sensor-readings"
    delivery_timeout_s: float = 120.0
    extra_config: Mapping[str, str] = field(default_factory=dict)


class Backend(Protocol):
    """Sends messages; every send ends in exactly one on_ack or on_fail, served by poll() or flush().

    A backend given `on_latency` also reports each successful delivery's latency (seconds) through it.
    """

    name: str
    last_error: str | None

    def connect(self, timeout_s: float) -> None:
        """Fetch topic metadata within `timeout_s`, or raise KafkaUnreachableError."""

    def send(self, msg: Message) -> None:
        """Queue one message (blocks briefly while the client's queue is full)."""

    def poll(self) -> None:
        """Serve delivery reports that have arrived, without waiting."""

    def flush(self, timeout_s: float) -> int:
        """Wait for outstanding reports up to `timeout_s`; return how many are still unreported."""

    def close(self) -> None:
        """Release the client."""


def unreachable(target: KafkaTarget, timeout_s: float, detail: str | None) -> KafkaUnreachableError:
    """The error for a broker that did not answer in time."""
    why = f" (last error: {detail})" if detail else ""
    return KafkaUnreachableError(
        f"Kafka at {target.bootstrap_servers} did not answer a metadata request within {timeout_s:g} s{why}. "
        "Start the local stack with `make up`, or point --bootstrap-servers (SENSOR_SIM_BOOTSTRAP_SERVERS) "
        "at a running broker"
    )


def topic_missing(target: KafkaTarget) -> KafkaUnreachableError:
    """The error for a topic the broker neither has nor creates."""
    return KafkaUnreachableError(
        f"topic {target.topic!r} does not exist on {target.bootstrap_servers} and the broker does not "
        "create topics automatically. Create it with `make up` (which creates the project's topic), "
        "or choose an existing one with --topic (SENSOR_SIM_TOPIC)"
    )


class InFlight:
    """Messages handed to the client and not yet reported, per key, in send order.

    A partition's delivery reports come in produce order, and a key always maps to one partition, so a
    report belongs to the oldest unreported message of its key. The value is compared to make sure, and a
    report out of that order is matched further down its key's queue.
    """

    def __init__(self) -> None:
        self.by_key: defaultdict[bytes, deque[Message]] = defaultdict(deque)

    def take(self, key: bytes | None, value: bytes | None) -> Message:
        """The unreported message with this key and value, the oldest first; it is no longer in flight."""
        queue = self.by_key.get(key) if key is not None else None
        if queue:
            if queue[0][1] == value:
                return queue.popleft()
            for i, msg in enumerate(queue):
                if msg[1] == value:
                    del queue[i]
                    return msg
        raise DeliveryReportError(
            f"the Kafka client reported a message with key {key!r} that sensor-sim has no record of sending; "
            "this is a bug in sensor-sim's delivery accounting: please report it with the command line"
        )


class ConfluentBackend:
    """confluent-kafka (librdkafka): idempotent, acks=all, lz4.

    One producer-wide delivery callback, matched to the sent message through `InFlight`: a callback
    object per message costs about as much again as the rest of a send.
    """

    name = "confluent"
    send: Callable[[Message], None]

    def __init__(
        self, target: KafkaTarget, on_ack: OnAck, on_fail: OnFail, on_latency: OnLatency | None = None
    ) -> None:
        try:
            import confluent_kafka
        except ImportError as exc:
            raise BackendUnavailableError(
                f"--backend confluent needs the confluent-kafka package ({exc}); "
                "install the project with `make install` or use --backend kafka-python"
            ) from None
        self._kafka = confluent_kafka
        self._target = target
        self._in_flight = InFlight()
        self.last_error: str | None = None
        config: dict[str, Any] = {
            "bootstrap.servers": target.bootstrap_servers,
            "client.id": "sensor-sim",
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": 20,
            "partitioner": "murmur2_random",  # same key -> partition as the Java and kafka-python clients
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "message.timeout.ms": int(target.delivery_timeout_s * 1000),
            "error_cb": self._on_error,
            "logger": _client_log,
            **target.extra_config,
            "on_delivery": self._reporter(on_ack, on_fail, on_latency),
        }
        try:
            self._producer = confluent_kafka.Producer(config)
        except confluent_kafka.KafkaException as exc:
            raise UsageError(f"invalid producer configuration for confluent-kafka: {exc}") from None
        self._poll = self._producer.poll
        self.send = self._make_send()

    def _reporter(self, on_ack: OnAck, on_fail: OnFail, on_latency: OnLatency | None) -> Callable[[Any, Any], None]:
        """The delivery callback: the report's message found in flight, then on_ack (timed) or on_fail."""
        take = self._in_flight.take

        def delivered(err: Any, record: Any) -> None:
            msg = take(record.key(), record.value())
            if err is None:
                on_ack(msg)
            else:
                on_fail(msg, err.name())

        if on_latency is None:
            return delivered

        def delivered_timed(err: Any, record: Any) -> None:
            msg = take(record.key(), record.value())
            if err is None:
                latency = record.latency()  # librdkafka's produce-to-acknowledgement time
                if latency is not None:
                    on_latency(latency)
                on_ack(msg)
            else:
                on_fail(msg, err.name())

        return delivered_timed

    def _make_send(self) -> Callable[[Message], None]:
        """send(msg): produce(), then record it in flight; on a full queue, serve reports and retry."""
        produce, poll, topic, by_key = self._producer.produce, self._poll, self._target.topic, self._in_flight.by_key

        def send(msg: Message) -> None:  # locals only: this runs once per message
            while True:
                try:
                    produce(topic, msg[1], msg[0])
                    break
                except BufferError:
                    poll(0.1)
            by_key[msg[0]].append(msg)  # its report can't come before: reports are served by poll() and flush()

        return send

    def _on_error(self, err: Any) -> None:
        self.last_error = err.str() if hasattr(err, "str") else str(err)

    def connect(self, timeout_s: float) -> None:
        """Metadata for the topic within `timeout_s`, or KafkaUnreachableError."""
        kafka = self._kafka
        try:
            metadata = self._producer.list_topics(topic=self._target.topic, timeout=timeout_s)
        except kafka.KafkaException as exc:
            self._poll(0)  # serve error_cb: it names the cause (e.g. connection refused)
            raise unreachable(self._target, timeout_s, self.last_error or str(exc.args[0])) from None
        topic = metadata.topics.get(self._target.topic)
        if topic is None or (topic.error is not None and topic.error.code() == kafka.KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise topic_missing(self._target)

    def poll(self) -> None:
        """Serve delivery callbacks that are ready."""
        self._poll(0)

    def flush(self, timeout_s: float) -> int:
        """Wait for every delivery report up to `timeout_s`; the number still outstanding."""
        return int(self._producer.flush(timeout_s))

    def close(self) -> None:
        """Nothing to release beyond flush()."""


class KafkaPythonBackend:
    """kafka-python: idempotent, acks=all, gzip; reports arrive on its I/O thread and are served by poll()."""

    name = "kafka-python"

    def __init__(
        self, target: KafkaTarget, on_ack: OnAck, on_fail: OnFail, on_latency: OnLatency | None = None
    ) -> None:
        try:
            import kafka
            import kafka.errors
        except ImportError as exc:
            raise BackendUnavailableError(
                f"--backend kafka-python needs the kafka-python package ({exc}); "
                "install the project with `make install` or use --backend confluent"
            ) from None
        self._kafka = kafka
        self._target = target
        self._on_ack = on_ack
        self._on_fail = on_fail
        self._on_latency = on_latency
        self._reports: deque[tuple[Message, Any]] = deque()
        self._outstanding = 0
        self._producer: Any = None
        self.last_error: str | None = None

    def connect(self, timeout_s: float) -> None:
        """Bootstrap and fetch the topic's partitions within `timeout_s`, or KafkaUnreachableError."""
        kafka = self._kafka
        timeout_ms = max(1, int(timeout_s * 1000))
        delivery_ms = max(1000, int(self._target.delivery_timeout_s * 1000))
        config: dict[str, Any] = {
            "bootstrap_servers": self._target.bootstrap_servers.split(","),
            "client_id": "sensor-sim",
            "acks": "all",
            "enable_idempotence": True,
            "compression_type": "gzip",
            "linger_ms": 20,
            "batch_size": 512 * 1024,
            "max_block_ms": timeout_ms,
            "bootstrap_timeout_ms": timeout_ms,
            "request_timeout_ms": min(30_000, max(500, delivery_ms // 2 - 20)),
            "delivery_timeout_ms": delivery_ms,
            **{key.replace(".", "_"): _typed(value) for key, value in self._target.extra_config.items()},
        }
        try:
            self._producer = kafka.KafkaProducer(**config)
            partitions = self._producer.partitions_for(self._target.topic)
        except (kafka.errors.KafkaTimeoutError, kafka.errors.BrokerNotAvailableError) as exc:
            if self._producer is not None and self._topic_absent():
                raise topic_missing(self._target) from None
            raise unreachable(self._target, timeout_s, str(exc)) from None
        except (kafka.errors.KafkaConfigurationError, ValueError, TypeError) as exc:
            raise UsageError(f"invalid producer configuration for kafka-python: {exc}") from None
        if not partitions:
            raise topic_missing(self._target)

    def _topic_absent(self) -> bool:
        """After a metadata timeout: did the broker answer, just without the topic?"""
        try:
            cluster = self._producer._metadata
            return bool(cluster.brokers()) and self._target.topic not in cluster.topics()
        except AttributeError:  # kafka-python internals differ: assume the broker is the problem
            return False

    def _done(self, msg: Message, result: Any) -> None:
        # On the client's I/O thread: deque.append is thread-safe, accounting stays on the main thread.
        self._reports.append((msg, result))

    def _done_timed(self, msg: Message, started: float, result: Any) -> None:
        # The future's callback, on the I/O thread: Histogram.observe is thread-safe.
        if not isinstance(result, BaseException) and self._on_latency is not None:
            self._on_latency(time.perf_counter() - started)
        self._reports.append((msg, result))

    def send(self, msg: Message) -> None:
        """send() plus a callback that queues the outcome for poll()."""
        self._outstanding += 1
        started = time.perf_counter()
        try:
            future = self._producer.send(self._target.topic, value=msg[1], key=msg[0])
        except self._kafka.errors.KafkaError as exc:
            self._reports.append((msg, exc))
            return
        if self._on_latency is None:
            future.add_both(self._done, msg)
        else:
            future.add_both(self._done_timed, msg, started)

    def poll(self) -> None:
        """Account the outcomes the I/O thread has queued."""
        reports = self._reports
        while reports:
            msg, result = reports.popleft()
            self._outstanding -= 1
            if isinstance(result, BaseException):
                self._on_fail(msg, type(result).__name__)
            else:
                self._on_ack(msg)

    def flush(self, timeout_s: float) -> int:
        """Wait for every outcome up to `timeout_s`; the number still outstanding.

        kafka-python's flush raises "Future not done" for a batch the broker refused as too large: it has split
        it and sent the halves again, so the outcomes are still coming, and the flush is tried again.
        """
        errors = self._kafka.errors
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._producer.flush(timeout=max(0.0, deadline - time.monotonic()))
                break
            except errors.KafkaTimeoutError:
                break
            except errors.UnknownError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.01)
        self.poll()
        return self._outstanding

    def close(self) -> None:
        """Close the client without waiting for anything still queued."""
        if self._producer is not None:
            self._producer.close(timeout=1)


class DryRunBackend:
    """No Kafka: every message is acknowledged at once (for measuring the generator, and for tests)."""

    name = "dry-run"
    send: Callable[[Message], None]

    def __init__(
        self, target: KafkaTarget, on_ack: OnAck, on_fail: OnFail, on_latency: OnLatency | None = None
    ) -> None:
        self.send = on_ack  # no delivery, so no latency to report
        self.last_error: str | None = None

    def connect(self, timeout_s: float) -> None:
        """Nothing to reach."""

    def poll(self) -> None:
        """Nothing to serve."""

    def flush(self, timeout_s: float) -> int:
        """Nothing outstanding."""
        return 0

    def close(self) -> None:
        """Nothing to release."""


def _typed(value: str) -> Any:
    """A config string as int, float or bool when it looks like one (kafka-python wants typed values)."""
    lowered = value.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def create_backend(
    name: str, target: KafkaTarget, on_ack: OnAck, on_fail: OnFail, on_latency: OnLatency | None = None
) -> Backend:
    """The backend called `name` (confluent, kafka-python or dry-run)."""
    classes: dict[str, Callable[[KafkaTarget, OnAck, OnFail, OnLatency | None], Backend]] = {
        "confluent": ConfluentBackend,
        "kafka-python": KafkaPythonBackend,
        "dry-run": DryRunBackend,
    }
    if name not in classes:
        raise UsageError(f"--backend {name!r} is unknown; choose {' or '.join(BACKENDS)}")
    return classes[name](target, on_ack, on_fail, on_latency)


__all__ = [
    "BACKENDS",
    "Backend",
    "ConfluentBackend",
    "DryRunBackend",
    "InFlight",
    "KafkaPythonBackend",
    "KafkaTarget",
    "create_backend",
]
