"""Checks before Spark starts: is Kafka there, is the topic there, does MinIO accept the writer's key."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlparse

import urllib3
from minio import Minio

from streaming.config import Settings, is_secret_key
from streaming.errors import ConfigError, CredentialsError, IotLakeError, ServiceUnreachableError, StorageError
from streaming.kafka_options import UnmappableKafkaOptions, java_to_librdkafka

__all__ = ["UnmappableKafkaOptions", "check_kafka", "check_storage", "kafka_client", "kafka_client_conf"]

CHECK_TIMEOUT_S = 10.0
OPTIONS_SETTING = "kafka.options (IOTLAKE_KAFKA__OPTIONS)"
KAFKA_SASL_PASSWORD_NAME = (
    "IOTLAKE_KAFKA_SASL_PASSWORD"  # stack.secrets.KAFKA_SASL_PASSWORD (streaming can't import stack)
)
SKIPPED = (
    "Kafka check skipped: {reasons}. Spark's own Kafka client connects with these options and reports any "
    "problem when the stream starts."
)

log = logging.getLogger(__name__)
C = TypeVar("C")


class _LibrdkafkaLog:
    """librdkafka's own log lines (every refused connection, every retry) at DEBUG: the checks raise one clear
    error instead."""

    def __init__(self) -> None:
        self._log = logging.getLogger(f"{__name__}.librdkafka")

    def log(self, level: int, msg: str, *args: Any) -> None:
        self._log.debug(msg, *args)


_LIBRDKAFKA_LOG = _LibrdkafkaLog()


def kafka_client_conf(settings: Settings) -> dict[str, str]:
    """librdkafka settings equivalent to the Spark source's `kafka.*` options (streaming.kafka_options).

    Raises UnmappableKafkaOptions when a security option can't be expressed for librdkafka.
    """
    return java_to_librdkafka(settings.kafka.bootstrap_servers, settings.kafka.options)


def kafka_client(
    settings: Settings, factory: Callable[[dict[str, Any]], C], extra: Mapping[str, Any] | None = None
) -> tuple[C, list[Any]]:
    """A confluent-kafka client (AdminClient, Consumer) for the settings, and the list its errors go to."""
    from confluent_kafka import KafkaException

    errors: list[Any] = []
    conf = kafka_client_conf(settings)
    try:
        client = factory({**conf, **(extra or {}), "error_cb": errors.append, "logger": _LIBRDKAFKA_LOG})
    except KafkaException as e:
        raise ConfigError(
            f"{OPTIONS_SETTING} can't be used to reach Kafka: {_redact(e.args[0].str(), conf)}. "
            "Fix the option it names; the Java names are used (kafka.ssl.truststore.location, ...)."
        ) from e
    return client, errors


def kafka_metadata(settings: Settings, client: Any, errors: list[Any], topic: str) -> Any:
    """The topic's metadata within CHECK_TIMEOUT_S; refused credentials or a failed TLS handshake fail at once."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + CHECK_TIMEOUT_S
    while True:
        try:
            return client.list_topics(topic=topic, timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except KafkaException as e:
            client.poll(0)  # serves error_cb: what went wrong on the connections
            failure = kafka_failure(settings, [*errors, e.args[0]], e.args[0].str())
            if not isinstance(failure, _NotAnswering) or time.monotonic() >= deadline:
                raise failure from e


class _NotAnswering(ServiceUnreachableError):
    """No broker answered (yet): worth waiting for until the deadline."""


def kafka_failure(settings: Settings, errors: Sequence[Any], cause: str) -> IotLakeError:
    """The error naming the cause and the fix, from the client's errors (confluent_kafka.KafkaError)."""
    from confluent_kafka import KafkaError

    servers = settings.kafka.bootstrap_servers
    auth = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    if auth:
        return CredentialsError(
            f"Kafka at {servers} refused the credentials ({_reason(auth[-1])}). Fix the username and password "
            f"in kafka.sasl.jaas.config of {OPTIONS_SETTING}, and kafka.sasl.mechanism if the broker expects "
            f"another mechanism (the native stack's SASL listener: password {KAFKA_SASL_PASSWORD_NAME} in the "
            "secrets file)."
        )
    tls = [e for e in errors if e.code() == KafkaError._SSL]
    if tls:
        return ServiceUnreachableError(
            f"The TLS handshake with Kafka at {servers} failed ({_reason(tls[-1])}). Point "
            "kafka.ssl.truststore.location (with kafka.ssl.truststore.type: PEM) at the CA that signed the "
            f"broker's certificate in {OPTIONS_SETTING}, and list the broker by the name in its certificate."
        )
    return _NotAnswering(
        f"Kafka at {servers} did not answer within {CHECK_TIMEOUT_S:.0f} s ({cause}). "
        "Start the local stack with `make up`, or point kafka.bootstrap_servers "
        "(IOTLAKE_KAFKA__BOOTSTRAP_SERVERS) at a running broker."
    )


def _reason(error: Any) -> str:
    """librdkafka's text without the broker prefix it repeats (`sasl_plaintext://host:port/bootstrap: `)."""
    text: str = error.str()
    return text.split("/bootstrap: ", 1)[-1]


def _redact(text: str, conf: Mapping[str, str]) -> str:
    for key, value in conf.items():
        if value and (is_secret_key(key) or key.endswith(".pem")):
            text = text.replace(value, "***")
    return text


def check_kafka(settings: Settings) -> int | None:
    """The number of partitions of the topic; a clear error when the broker or the topic is missing.

    None (and one log line) when the options can't be expressed for librdkafka: Spark's client checks then.
    """
    from confluent_kafka.admin import AdminClient

    k = settings.kafka
    try:
        admin, errors = kafka_client(settings, AdminClient)
    except UnmappableKafkaOptions as e:
        log.warning(SKIPPED.format(reasons=e))
        return None
    metadata = kafka_metadata(settings, admin, errors, k.topic)
    topic = metadata.topics.get(k.topic)
    if topic is None or topic.error is not None or not topic.partitions:
        raise ServiceUnreachableError(
            f"Kafka topic {k.topic!r} does not exist on {k.bootstrap_servers}. Create it with `make up` "
            f"(it creates {k.partitions} partitions), or set kafka.topic to an existing topic."
        )
    return len(topic.partitions)


def minio_client(settings: Settings, access_key: str | None = None, secret_key: str | None = None) -> Minio:
    """An S3 client for the configured endpoint (the writer's key unless told otherwise), failing fast."""
    s = settings.storage
    url = urlparse(s.endpoint)
    http = urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=CHECK_TIMEOUT_S, read=30.0),
        retries=urllib3.Retry(total=1, backoff_factor=0.2),
    )
    return Minio(
        url.netloc or url.path,
        access_key=access_key or s.access_key,
        secret_key=secret_key or s.secret_key,
        secure=url.scheme == "https",
        region=s.region,
        http_client=http,
    )


def check_storage(settings: Settings) -> None:
    """The endpoint answers, the writer's key is accepted, and the bucket exists."""
    s = settings.storage
    if not s.is_s3:
        return
    from minio.error import S3Error

    from streaming.session import storage_credentials

    storage_credentials(settings)  # raises CredentialsError when the keys are missing
    client = minio_client(settings)
    try:
        # A listing (not HEAD) so that errors come with their code: NoSuchBucket, InvalidAccessKeyId, ...
        next(iter(client.list_objects(s.bucket, prefix="_iotlake_preflight/")), None)
    except S3Error as e:
        if e.code == "NoSuchBucket":
            raise StorageError(
                f"Bucket {s.bucket!r} does not exist on {s.endpoint}. `make up` creates it (private); on another "
                "S3 endpoint, create it or change storage.base_uri."
            ) from e
        if e.code in ("InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise CredentialsError(
                f"MinIO at {s.endpoint} refused the writer's key ({e.code}). The key in {s.secrets_file} or "
                "IOTLAKE_STORAGE__ACCESS_KEY/SECRET_KEY is wrong or was deleted: run `make up` to recreate the "
                "writer user, or set the right key."
            ) from e
        if e.code == "AccessDenied":
            raise StorageError(
                f"The writer's key may not use bucket {s.bucket!r} on {s.endpoint} (AccessDenied). Its policy "
                "must allow the bucket and its objects: `make up` sets that up."
            ) from e
        raise StorageError(f"MinIO at {s.endpoint} answered {e.code}: {e.message}") from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise ServiceUnreachableError(
            f"MinIO at {s.endpoint} is unreachable ({type(e).__name__}). Start the local stack with `make up`, "
            "or set storage.endpoint (IOTLAKE_STORAGE__ENDPOINT) to a running S3 endpoint."
        ) from e
