"""The native stack with real processes: Kafka round-trip, MinIO access control, status, idempotence."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from minio import Minio
from minio.error import S3Error

from stack import StackLayout, down, status, up
from stack import kafka as stack_kafka
from stack import secrets as sec
from stack.addresses import minio_api
from streaming.config import PROJECT_ROOT, Settings, load_settings
from streaming.errors import StackError
from tests.helpers import free_port_pair, wait_for

pytestmark = pytest.mark.integration


def _client(settings: Settings, access: str, secret: str) -> Minio:
    api = minio_api(settings.storage.endpoint)
    return Minio(f"{api.host}:{api.port}", access_key=access, secret_key=secret, secure=False, region="us-east-1")


def _key(settings: Settings, name: str) -> str:
    """An object key under this test's base_uri prefix."""
    prefix = settings.storage.base_uri.split("://", 1)[1].split("/", 1)[1]
    return f"{prefix}/{name}"


def test_topic_has_six_partitions_and_round_trips(settings: Settings) -> None:
    admin = stack_kafka.admin_client(settings.kafka.bootstrap_servers)
    topic = admin.list_topics(topic=settings.kafka.topic, timeout=10).topics[settings.kafka.topic]
    assert len(topic.partitions) == 6
    assert all(p.leader >= 0 for p in topic.partitions.values())

    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "enable.idempotence": True})
    sent = {f"device-{i}".encode(): f'{{"seq": {i}}}'.encode() for i in range(20)}
    for key, value in sent.items():
        producer.produce(settings.kafka.topic, key=key, value=value)
    assert producer.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": f"test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    received: dict[bytes | None, bytes | None] = {}
    partitions: set[int | None] = set()

    def got_all() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            received[msg.key()] = msg.value()
            partitions.add(msg.partition())
        return len(received) == len(sent)

    try:
        consumer.subscribe([settings.kafka.topic])
        wait_for(got_all, timeout=60, interval=0, message="all 20 messages back from Kafka")
    finally:
        consumer.close()
    assert received == sent
    assert len(partitions) > 1  # keys spread over the partitions


def test_anonymous_access_to_the_bucket_is_refused(settings: Settings, stack_secrets: dict[str, str]) -> None:
    writer = _client(settings, stack_secrets[sec.WRITER_ACCESS_KEY], stack_secrets[sec.WRITER_SECRET_KEY])
    key = _key(settings, "anon.txt")
    writer.put_object(settings.storage.bucket, key, io.BytesIO(b"secret"), 6)
    endpoint = settings.storage.endpoint.rstrip("/")
    for url in (f"{endpoint}/{settings.storage.bucket}/", f"{endpoint}/{settings.storage.bucket}/{key}"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, timeout=10)
        assert e.value.code == 403, url


def test_writer_can_write_objects_but_not_create_buckets(settings: Settings, stack_secrets: dict[str, str]) -> None:
    writer = _client(settings, stack_secrets[sec.WRITER_ACCESS_KEY], stack_secrets[sec.WRITER_SECRET_KEY])
    key = _key(settings, "w.txt")
    writer.put_object(settings.storage.bucket, key, io.BytesIO(b"hello"), 5)
    response = writer.get_object(settings.storage.bucket, key)
    try:
        assert response.read() == b"hello"
    finally:
        response.close()
        response.release_conn()
    assert [o.object_name for o in writer.list_objects(settings.storage.bucket, prefix=key)] == [key]
    writer.remove_object(settings.storage.bucket, key)
    with pytest.raises(S3Error) as e:
        writer.make_bucket(f"other-{uuid.uuid4().hex[:8]}")
    assert e.value.code == "AccessDenied"


def test_reader_can_read_but_not_write(settings: Settings, stack_secrets: dict[str, str]) -> None:
    writer = _client(settings, stack_secrets[sec.WRITER_ACCESS_KEY], stack_secrets[sec.WRITER_SECRET_KEY])
    reader = _client(settings, stack_secrets[sec.READER_ACCESS_KEY], stack_secrets[sec.READER_SECRET_KEY])
    key = _key(settings, "r.txt")
    writer.put_object(settings.storage.bucket, key, io.BytesIO(b"data"), 4)
    response = reader.get_object(settings.storage.bucket, key)
    try:
        assert response.read() == b"data"
    finally:
        response.close()
        response.release_conn()
    assert [o.object_name for o in reader.list_objects(settings.storage.bucket, prefix=key)] == [key]
    for attempt in (
        lambda: reader.put_object(settings.storage.bucket, _key(settings, "x"), io.BytesIO(b"x"), 1),
        lambda: reader.remove_object(settings.storage.bucket, key),
    ):
        with pytest.raises(S3Error) as e:
            attempt()
        assert e.value.code == "AccessDenied"


def test_root_credentials_are_random_and_the_default_ones_are_refused(
    settings: Settings, stack_secrets: dict[str, str]
) -> None:
    assert stack_secrets[sec.ROOT_USER] != "minioadmin"
    assert stack_secrets[sec.ROOT_PASSWORD] != "minioadmin"
    with pytest.raises(S3Error) as e:
        _client(settings, "minioadmin", "minioadmin").list_buckets()
    assert e.value.code == "InvalidAccessKeyId"
    root = _client(settings, stack_secrets[sec.ROOT_USER], stack_secrets[sec.ROOT_PASSWORD])
    assert settings.storage.bucket in [b.name for b in root.list_buckets()]
    mode = Path(settings.storage.secrets_file).stat().st_mode & 0o777
    assert mode == 0o600


def test_settings_use_the_writer_key_not_root(settings: Settings, stack_secrets: dict[str, str]) -> None:
    assert settings.storage.access_key == stack_secrets[sec.WRITER_ACCESS_KEY]
    assert settings.storage.access_key != stack_secrets[sec.ROOT_USER]


def test_status_reports_both_services_running(settings: Settings, stack_layout: StackLayout) -> None:
    info = status(settings, stack_layout)
    for name in ("kafka", "minio"):
        assert info[name]["state"] == "running", info
        assert isinstance(info[name]["pid"], int)
        assert Path(info[name]["log"]).parent == stack_layout.logs
    assert info["kafka"]["address"] == settings.kafka.bootstrap_servers
    assert info["minio"]["address"] == settings.storage.endpoint


def test_second_up_is_a_no_op(settings: Settings, stack_layout: StackLayout) -> None:
    before = status(settings, stack_layout)
    up(settings, stack_layout, echo=None)
    after = status(settings, stack_layout)
    assert [after[n]["pid"] for n in ("kafka", "minio")] == [before[n]["pid"] for n in ("kafka", "minio")]
    assert after["kafka"]["state"] == after["minio"]["state"] == "running"


def test_up_refuses_to_reuse_a_stack_running_on_other_ports(
    test_env: dict[str, str], stack_layout: StackLayout
) -> None:
    other = free_port_pair()
    moved = load_settings(env={**test_env, "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{other}"})
    with pytest.raises(StackError, match=r"already running .* other addresses"):
        up(moved, stack_layout, echo=None)
    assert status(load_settings(env=test_env), stack_layout)["kafka"]["state"] == "running"


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "stack", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_cli_status_json_sees_the_test_stack(test_env: dict[str, str]) -> None:
    done = _cli(["status", "--json"], test_env)
    assert done.returncode == 0, done.stderr
    assert '"state": "running"' in done.stdout
    assert test_env["IOTLAKE_KAFKA__BOOTSTRAP_SERVERS"] in done.stdout


def test_cli_up_with_a_taken_port_fails_clearly(tmp_path: Path, test_env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            **test_env,
            "IOTLAKE_STACK_HOME": str(tmp_path / "home"),
            "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
            "IOTLAKE_STORAGE__SECRETS_FILE": str(tmp_path / "secrets.env"),
        }
        done = _cli(["up"], env)
    assert done.returncode == 2
    assert f"port 127.0.0.1:{port} is already in use" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "home" / "run" / "kafka.pid").exists()


@pytest.mark.slow
def test_a_fresh_stack_goes_up_and_down_twice(tmp_path: Path, stack_layout: StackLayout) -> None:
    """Separate stack: up, then down stops both processes, and a second down is harmless."""
    kafka_port = free_port_pair()
    minio_port = free_port_pair({kafka_port, kafka_port + 1})
    layout = StackLayout(home=tmp_path / "home", cache=stack_layout.cache)
    s = load_settings(
        env={
            **os.environ,
            "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{kafka_port}",
            "IOTLAKE_STORAGE__ENDPOINT": f"http://127.0.0.1:{minio_port}",
            "IOTLAKE_STORAGE__SECRETS_FILE": str(tmp_path / "secrets.env"),
        }
    )
    try:
        up(s, layout, echo=None)
        running = status(s, layout)
        pids = [running[n]["pid"] for n in ("kafka", "minio")]
        assert all(pids) and {running["kafka"]["state"], running["minio"]["state"]} == {"running"}
    finally:
        down(layout, echo=None)
    stopped = status(s, layout)
    assert stopped["kafka"]["state"] == stopped["minio"]["state"] == "stopped"
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    down(layout, echo=None)  # safe twice
    assert not (layout.run / "kafka.pid").exists() and not (layout.run / "minio.pid").exists()
