"""Checks before Spark starts: is Kafka there, is the topic there, does MinIO accept the writer's key."""

from __future__ import annotations

from urllib.parse import urlparse

import urllib3
from minio import Minio

from streaming.config import Settings
from streaming.errors import CredentialsError, ServiceUnreachableError, StorageError

CHECK_TIMEOUT_S = 10.0


def kafka_client_conf(settings: Settings) -> dict[str, str | int | float | bool]:
    """librdkafka settings equivalent to the Spark source's `kafka.*` options."""
    conf: dict[str, str | int | float | bool] = {"bootstrap.servers": settings.kafka.bootstrap_servers}
    for key, value in settings.kafka.options.items():
        if key.startswith("kafka."):
            conf[key.removeprefix("kafka.")] = value
    return conf


def check_kafka(settings: Settings) -> int:
    """The number of partitions of the topic; a clear error when the broker or the topic is missing."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    k = settings.kafka
    try:
        admin = AdminClient(kafka_client_conf(settings))
        metadata = admin.list_topics(topic=k.topic, timeout=CHECK_TIMEOUT_S)
    except KafkaException as e:
        raise ServiceUnreachableError(
            f"Kafka at {k.bootstrap_servers} did not answer within {CHECK_TIMEOUT_S:.0f} s ({e.args[0]}). "
            "Start the local stack with `make up`, or point kafka.bootstrap_servers "
            "(IOTLAKE_KAFKA__BOOTSTRAP_SERVERS) at a running broker."
        ) from e
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
