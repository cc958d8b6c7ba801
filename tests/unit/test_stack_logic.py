"""The native stack's logic: addresses, server.properties, MinIO policies, secrets, install checks, CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import stack.install
from stack import cli, kafka, minio, proc
from stack import secrets as sec
from stack.addresses import HostPort, kafka_controller, kafka_listener, minio_api, minio_console
from stack.layout import StackLayout
from streaming.core.config import load_settings
from streaming.core.errors import ConfigError, StackError

pytestmark = pytest.mark.unit


# --- addresses ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("servers", "expected"),
    [
        ("127.0.0.1:9092", HostPort("127.0.0.1", 9092)),
        ("localhost:19092,127.0.0.1:29092", HostPort("localhost", 19092)),
        (" 127.0.0.1:9094 ", HostPort("127.0.0.1", 9094)),
        ("PLAINTEXT://127.0.0.1:9095", HostPort("127.0.0.1", 9095)),
    ],
)
def test_kafka_listener_is_the_first_bootstrap_server(servers: str, expected: HostPort) -> None:
    assert kafka_listener(servers) == expected
    assert kafka_controller(expected) == HostPort(expected.host, expected.port + 1)


@pytest.mark.parametrize(
    ("servers", "needle"),
    [
        ("127.0.0.1", "not host:port"),
        ("127.0.0.1:abc", "not a number"),
        ("127.0.0.1:65535", "out of range"),
        ("10.0.0.5:9092", "not loopback"),
        ("kafka.example.com:9092", "not loopback"),
    ],
)
def test_bad_bootstrap_servers_are_explained(servers: str, needle: str) -> None:
    with pytest.raises(StackError, match=needle):
        kafka_listener(servers)


def test_minio_api_and_console_ports() -> None:
    api = minio_api("http://127.0.0.1:9000")
    assert api == HostPort("127.0.0.1", 9000)
    assert minio_console(api) == HostPort("127.0.0.1", 9001)
    assert minio_api("http://localhost:19000/") == HostPort("localhost", 19000)
    assert minio_api("127.0.0.1:9100") == HostPort("127.0.0.1", 9100)


@pytest.mark.parametrize(
    ("endpoint", "needle"),
    [
        ("https://127.0.0.1:9000", "plain http"),
        ("http://127.0.0.1", "needs a host and a port"),
        ("http://127.0.0.1:x", "invalid port"),
        ("http://s3.amazonaws.com:80", "not loopback"),
    ],
)
def test_bad_endpoints_are_explained(endpoint: str, needle: str) -> None:
    with pytest.raises(StackError, match=needle):
        minio_api(endpoint)


# --- server.properties --------------------------------------------------------------------------------


def _props(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {k: v for k, v in pairs}


def test_server_properties_for_one_loopback_node(tmp_path: Path) -> None:
    settings = load_settings(
        env={"IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:19092", "IOTLAKE_KAFKA__PARTITIONS": "4"}
    )
    layout = StackLayout(home=tmp_path, cache=tmp_path / "cache")
    p = _props(kafka.server_properties(settings, layout))
    assert p["process.roles"] == "broker,controller"
    assert p["node.id"] == "1"
    assert p["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert p["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert p["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert p["controller.listener.names"] == "CONTROLLER"
    assert p["log.dirs"] == str(tmp_path / "kafka" / "data")
    assert p["num.partitions"] == "4"
    assert p["auto.create.topics.enable"] == "false"
    assert p["message.max.bytes"] == str(2 * 1024 * 1024)
    assert p["group.initial.rebalance.delay.ms"] == "0"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
    ):
        assert p[key] == "1", key


def test_localhost_binds_loopback_and_advertises_the_configured_name(tmp_path: Path) -> None:
    settings = load_settings(env={"IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": "localhost:9092"})
    p = _props(kafka.server_properties(settings, StackLayout(home=tmp_path, cache=tmp_path)))
    assert p["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert p["advertised.listeners"] == "PLAINTEXT://localhost:9092"


def test_no_sasl_listener_unless_a_port_is_configured(tmp_path: Path) -> None:
    settings = load_settings(env={"IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:19092"})
    p = _props(kafka.server_properties(settings, StackLayout(home=tmp_path, cache=tmp_path), sasl_password="pw"))
    assert not [k for k in p if "sasl" in k] and "pw" not in p.values()
    assert p["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert p["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"


def test_sasl_plain_listener_on_the_configured_port(tmp_path: Path) -> None:
    settings = load_settings(
        env={"IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": "localhost:19092", "IOTLAKE_KAFKA__SASL_LISTENER_PORT": "19095"}
    )
    layout = StackLayout(home=tmp_path, cache=tmp_path)
    p = _props(kafka.server_properties(settings, layout, sasl_password="Gen3rated"))
    assert p["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093,SASL://127.0.0.1:19095"
    assert p["advertised.listeners"] == "PLAINTEXT://localhost:19092,SASL://localhost:19095"
    assert p["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL:SASL_PLAINTEXT"
    assert p["inter.broker.listener.name"] == "PLAINTEXT"
    assert p["sasl.enabled.mechanisms"] == "PLAIN"
    assert p["listener.name.sasl.plain.sasl.jaas.config"] == (
        f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{kafka.SASL_USER}="Gen3rated";'
    )
    # Without the password (comparing addresses of a running broker) the listener is the same, the user is not.
    q = _props(kafka.server_properties(settings, layout))
    assert q["listeners"] == p["listeners"] and "listener.name.sasl.plain.sasl.jaas.config" not in q


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"IOTLAKE_KAFKA__SASL_LISTENER_PORT": "19093"}, "kafka.sasl_listener_port 19093 is the controller port"),
        ({"IOTLAKE_KAFKA__SASL_LISTENER_PORT": "19092"}, "kafka.sasl_listener_port 19092 is a broker port"),
        ({"IOTLAKE_KAFKA__SASL_LISTENER_PORT": "70000"}, "kafka.sasl_listener_port must be 0..65535"),
        (
            {
                "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:19092,127.0.0.1:19096",
                "IOTLAKE_KAFKA__SASL_LISTENER_PORT": "19095",
            },
            "only on a one-node stack",
        ),
    ],
)
def test_bad_sasl_listener_ports_are_explained(env: dict[str, str], needle: str, tmp_path: Path) -> None:
    env = {"IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:19092", **env}
    with pytest.raises((StackError, ConfigError)) as info:
        kafka.server_properties(load_settings(env=env), StackLayout(home=tmp_path, cache=tmp_path), sasl_password="x")
    assert needle in str(info.value)


def test_server_properties_are_written_private(tmp_path: Path) -> None:
    path = tmp_path / "server.properties"
    path.write_text("old\n")
    path.chmod(0o644)
    sec.write_private(path, "listener.name.sasl.plain.sasl.jaas.config=...\n")
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == "listener.name.sasl.plain.sasl.jaas.config=...\n"
    fresh = tmp_path / "new.properties"
    sec.write_private(fresh, "x=1\n")
    assert fresh.stat().st_mode & 0o777 == 0o600


def test_cluster_ids_look_like_kafkas() -> None:
    ids = {kafka.new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


# --- MinIO policies -------------------------------------------------------------------------------------

WRITER_ACTIONS = {
    "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket", "s3:GetBucketLocation",
    "s3:ListBucketMultipartUploads", "s3:ListMultipartUploadParts", "s3:AbortMultipartUpload",
}  # fmt: skip
READER_ACTIONS = {"s3:GetObject", "s3:ListBucket", "s3:GetBucketLocation"}


def _actions_and_resources(policy: dict) -> tuple[set[str], set[str]]:
    actions: set[str] = set()
    resources: set[str] = set()
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        assert set(statement) == {"Effect", "Action", "Resource"}  # no conditions, principals or NotAction
        actions |= set(statement["Action"])
        resources |= set(statement["Resource"])
    return actions, resources


def test_writer_policy_grants_only_the_listed_actions_on_one_bucket() -> None:
    actions, resources = _actions_and_resources(minio.writer_policy("lake1"))
    assert actions == WRITER_ACTIONS
    assert resources == {"arn:aws:s3:::lake1", "arn:aws:s3:::lake1/*"}
    assert not any("*" in a for a in actions)


def test_reader_policy_is_read_only_on_one_bucket() -> None:
    actions, resources = _actions_and_resources(minio.reader_policy("lake1"))
    assert actions == READER_ACTIONS
    assert resources == {"arn:aws:s3:::lake1", "arn:aws:s3:::lake1/*"}


def test_object_actions_apply_to_objects_and_bucket_actions_to_the_bucket() -> None:
    for statement in minio.writer_policy("b")["Statement"]:
        object_level = any(a in statement["Action"] for a in ("s3:GetObject", "s3:PutObject"))
        assert statement["Resource"] == (["arn:aws:s3:::b/*"] if object_level else ["arn:aws:s3:::b"])


# --- secrets --------------------------------------------------------------------------------------------


def test_generated_secrets_are_random_and_never_the_minio_default() -> None:
    a, b = sec.generate(), sec.generate()
    assert set(a) == set(sec.NAMES)
    assert all(a[n] != b[n] for n in sec.NAMES)
    assert "minioadmin" not in a.values()
    assert all(len(a[n]) == 20 for n in sec.ACCESS_KEYS)
    assert all(len(a[n]) == 40 for n in sec.SECRET_KEYS)
    assert len(set(a.values())) == len(a)


def test_secrets_file_is_created_0600_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "var" / "secrets.env"
    first = sec.ensure_secrets_file(path)
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    for name, value in first.items():
        assert f"{name}={value}\n" in text
    assert sec.ensure_secrets_file(path) == first
    assert path.read_text() == text
    assert sec.load(path) == first


def test_secrets_file_only_gains_missing_names_and_is_tightened(tmp_path: Path) -> None:
    path = tmp_path / "secrets.env"
    path.write_text("MINIO_ROOT_USER=keepme\nOTHER=1\n")
    path.chmod(0o644)
    values = sec.ensure_secrets_file(path)
    assert values[sec.ROOT_USER] == "keepme"
    assert values[sec.WRITER_ACCESS_KEY]
    assert "OTHER=1" in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600


def test_the_kafka_sasl_password_is_generated_only_when_asked_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "secrets.env"
    plain = sec.ensure_secrets_file(path)
    assert sec.KAFKA_SASL_PASSWORD not in plain and sec.KAFKA_SASL_PASSWORD not in path.read_text()
    values = sec.ensure_secrets_file(path, extra=(sec.KAFKA_SASL_PASSWORD,))
    password = values[sec.KAFKA_SASL_PASSWORD]
    assert len(password) == 40 and password.isalnum()
    assert {n: values[n] for n in sec.NAMES} == plain  # existing values are never regenerated
    assert path.stat().st_mode & 0o777 == 0o600
    assert sec.ensure_secrets_file(path, extra=(sec.KAFKA_SASL_PASSWORD,))[sec.KAFKA_SASL_PASSWORD] == password
    sec.ensure_secrets_file(path)  # a later `up` without the listener keeps it
    assert f"{sec.KAFKA_SASL_PASSWORD}={password}\n" in path.read_text()


def test_loading_an_incomplete_secrets_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="python -m stack up"):
        sec.load(tmp_path / "missing.env")


# --- install ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("garbage", None),
    ],
)
def test_java_major_version(output: str, major: int | None) -> None:
    assert stack.install.java_major(output) == major


def test_missing_java_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(StackError, match=r"Java is missing.*openjdk-17"):
        stack.install.find_java()


def test_old_java_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'java version \"1.8.0_392\"' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(StackError, match=r"Java 8; Kafka .* needs Java 17"):
        stack.install.find_java()


def test_missing_mvn_and_go_are_explained_only_when_needed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    java = Path(stack.install.find_java())
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("JAVA_HOME", str(java.resolve().parent.parent))
    layout = StackLayout(home=tmp_path / "home", cache=tmp_path / "cache")
    with pytest.raises(StackError, match=r"Maven \(mvn\) is missing"):
        stack.install.check_prerequisites(layout)
    libs = stack.install.kafka_libs(layout)
    libs.mkdir(parents=True)
    (libs / "kafka_2.13-4.2.0.jar").write_bytes(b"")
    (stack.install.kafka_dir(layout) / "versions.txt").write_text(stack.install._kafka_stamp())
    with pytest.raises(StackError, match="Go is missing"):
        stack.install.check_prerequisites(layout)
    binary = stack.install.minio_binary(layout)
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"")
    binary.chmod(0o755)
    with pytest.raises(StackError, match=r"apt-get is missing; .*Debian's prometheus package"):
        stack.install.check_prerequisites(layout)
    for tool in (stack.install.prometheus_binary(layout), stack.install.promtool_binary(layout)):
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_bytes(b"")
        tool.chmod(0o755)
    assert set(stack.install.check_prerequisites(layout)) == {"java"}
    lines: list[str] = []
    installed = stack.install.install(layout, echo=lines.append)  # everything cached: no mvn, go or apt-get
    assert installed.kafka_libs == libs and installed.minio == binary
    assert installed.promtool == stack.install.promtool_binary(layout)
    assert any("kafka 4.2.0 jars: cached" in line for line in lines)
    assert any("cached" in line and "minio" in line for line in lines)
    assert any("prometheus 2.42.0+ds-5+deb12u1: cached" in line for line in lines)


def test_missing_dpkg_deb_is_explained(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    apt_get = tmp_path / "apt-get"
    apt_get.write_text("#!/bin/sh\nexit 1\n")
    apt_get.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    layout = StackLayout(home=tmp_path / "home", cache=tmp_path / "cache")
    with pytest.raises(StackError, match=r"dpkg-deb is missing; .*python -m stack install"):
        stack.install.install_prometheus(layout, echo=None)


def test_versions_stamp_change_means_reinstall(tmp_path: Path) -> None:
    layout = StackLayout(home=tmp_path, cache=tmp_path)
    libs = stack.install.kafka_libs(layout)
    libs.mkdir(parents=True)
    (libs / "kafka_2.13-4.2.0.jar").write_bytes(b"")
    (stack.install.kafka_dir(layout) / "versions.txt").write_text("kafka.version=0.0.1\n")
    assert not stack.install._kafka_done(layout)


# --- processes ----------------------------------------------------------------------------------------------


def _service(tmp_path: Path) -> proc.Service:
    return proc.Service("dummy", tmp_path / "run" / "dummy.pid", tmp_path / "logs" / "dummy.log", "dummy-marker")


def test_a_process_dying_during_start_up_shows_its_log(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    pid = proc.start(svc, ["sh", "-c", "echo dummy-marker boom: bad config >&2; exit 3"])
    with pytest.raises(StackError, match=r"(?s)exited during start-up.*boom: bad config"):
        proc.wait_ready(svc, pid, lambda: False, timeout=30, what="never")
    assert not svc.pidfile.exists()


def test_readiness_is_polled_and_stop_is_safe_twice(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    flag = tmp_path / "ready"
    code = f"import pathlib, time; time.sleep(0.3); pathlib.Path({str(flag)!r}).touch(); time.sleep(60)"
    pid = proc.start(svc, [sys.executable, "-c", code, "dummy-marker"])
    assert proc.wait_ready(svc, pid, flag.exists, timeout=30, what="flag") >= 0
    assert proc.read_pid(svc) == pid
    assert proc.stop(svc, timeout=10) == pid
    assert not proc.pid_alive(pid)
    assert proc.stop(svc, timeout=10) is None
    assert proc.read_pid(svc) is None


def test_readiness_deadline_names_the_service(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    pid = proc.start(svc, [sys.executable, "-c", "import time; time.sleep(60)", "dummy-marker"])
    try:
        with pytest.raises(StackError, match=r"did not become ready .* within 0s"):
            proc.wait_ready(svc, pid, lambda: False, timeout=0.3, what="never")
    finally:
        proc.stop(svc, timeout=10)


def test_a_stale_or_reused_pid_file_is_ignored(tmp_path: Path) -> None:
    svc = _service(tmp_path)
    svc.pidfile.parent.mkdir(parents=True)
    svc.pidfile.write_text(f"{os.getpid()}\n")  # alive, but not the service
    assert proc.read_pid(svc) is None
    done = subprocess.run(["true"], check=True)
    assert done.returncode == 0
    svc.pidfile.write_text("999999999\n")
    assert proc.read_pid(svc) is None


def test_a_taken_port_is_reported_with_the_fix() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(StackError, match=f"broker port 127.0.0.1:{port} is already in use.*IOTLAKE_KAFKA"):
            proc.require_free_ports("Kafka", {"broker": HostPort("127.0.0.1", port)}, kafka.SETTING)


# --- CLI ----------------------------------------------------------------------------------------------------


def test_cli_turns_errors_into_exit_code_2_without_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def boom(*_: object, **__: object) -> None:
        raise StackError("Kafka port taken. Stop it.")

    monkeypatch.setattr(cli.api, "up", boom)
    assert cli.main(["up"]) == 2
    err = capsys.readouterr().err
    assert err == "error: Kafka port taken. Stop it.\n"


def test_cli_status_formats_one_line_per_service() -> None:
    info = {
        "kafka": {"state": "running", "pid": 10, "address": "127.0.0.1:9092", "log": "/v/logs/kafka.log"},
        "minio": {"state": "stopped", "pid": None, "address": "http://127.0.0.1:9000",
                  "console": "http://127.0.0.1:9001", "log": "/v/logs/minio.log"},
        "prometheus": {"state": "running", "pid": 12, "address": "http://127.0.0.1:9090",
                       "log": "/v/logs/prometheus.log"},
        "home": "/v", "cache": "/c",
    }  # fmt: skip
    lines = cli.format_status(info).splitlines()
    assert lines[0].split()[:3] == ["kafka", "running", "pid"]
    assert lines[1].split()[:3] == ["minio", "stopped", "-"]
    assert lines[2].split()[:4] == ["prometheus", "running", "pid", "12"]


def test_python_dash_m_stack_help_runs() -> None:
    root = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "stack", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    for command in ("install", "up", "down", "status", "secrets", "bootstrap", "probe", "daemon"):
        assert command in done.stdout


# --- install with fake tools (no network) ---------------------------------------------------------------


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / name
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(0o755)


def test_minio_is_built_with_go_install_into_the_versioned_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls = tmp_path / "go-calls"
    _fake_tool(
        tmp_path / "bin",
        "go",
        f'echo "$@ GOBIN=$GOBIN GOFLAGS=$GOFLAGS" >> {calls}\nprintf "#!/bin/sh\\n" > "$GOBIN/minio"\n'
        'chmod +x "$GOBIN/minio"\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    layout = StackLayout(home=tmp_path / "home", cache=tmp_path / "cache")
    binary = stack.install.install_minio(layout, echo=None)
    version = stack.install.versions.MINIO_VERSION
    assert binary == tmp_path / "cache" / "minio" / version / "minio"
    assert calls.read_text() == f"install github.com/minio/minio@{version} GOBIN={binary.parent} GOFLAGS=-mod=mod\n"
    stack.install.install_minio(layout, echo=None)  # cached: go is not called again
    assert len(calls.read_text().splitlines()) == 1


def test_a_failed_maven_run_leaves_no_half_done_kafka_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_tool(tmp_path / "bin", "mvn", 'echo "[ERROR] Could not resolve dependencies"\nexit 1\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    layout = StackLayout(home=tmp_path / "home", cache=tmp_path / "cache")
    with pytest.raises(StackError, match=r"(?s)failed \(exit 1\).*Maven Central.*Could not resolve"):
        stack.install.install_kafka(layout, echo=None)
    assert list((tmp_path / "cache" / "kafka").iterdir()) == []


def test_maven_output_is_moved_into_place_whole(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = (
        'for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; esac; done\n'
        'mkdir -p "$out" && touch "$out/kafka_2.13-4.2.0.jar" "$out/log4j-core-2.25.3.jar"\n'
    )
    _fake_tool(tmp_path / "bin", "mvn", script)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    layout = StackLayout(home=tmp_path / "home", cache=tmp_path / "cache")
    lines: list[str] = []
    libs = stack.install.install_kafka(layout, echo=lines.append)
    assert libs == tmp_path / "cache" / "kafka" / "4.2.0" / "libs"
    assert sorted(p.name for p in libs.iterdir()) == ["kafka_2.13-4.2.0.jar", "log4j-core-2.25.3.jar"]
    assert [p.name for p in (tmp_path / "cache" / "kafka").iterdir()] == ["4.2.0"]
    assert lines and "installed" in lines[0]


# --- what each install installs ------------------------------------------------------------------------


def test_the_install_make_run_uses_builds_none_of_the_test_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run` installs what running needs; Docker Compose (a Go build of minutes) and the Dockerfile linter
    only check the deployment, so only `make test` (`stack install --test-tools`) builds them."""
    calls: list[str] = []
    monkeypatch.setattr(cli, "install", lambda layout: calls.append("stack"))
    monkeypatch.setattr(cli.compose, "install_compose", lambda layout: calls.append("compose"))
    monkeypatch.setattr(cli.compose, "install_dockerfile_linter", lambda layout: calls.append("linter"))
    monkeypatch.setattr(cli.logstore, "needs_jar", lambda settings: False)
    monkeypatch.setattr(
        cli.subprocess, "run", lambda argv, **kw: calls.append(argv[-1]) or subprocess.CompletedProcess(argv, 0)
    )
    assert cli.main(["install"]) == 0
    assert calls == ["stack", "streaming.core.session", "streaming.core.class_archive"]
    calls.clear()
    assert cli.main(["install", "--test-tools"]) == 0
    assert calls == ["stack", "compose", "linter", "streaming.core.session", "streaming.core.class_archive"]

    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    recipes = dict(re.findall(r"^([a-z-]+):[^\n]*\n\t([^\n]*)", makefile, flags=re.M))
    prerequisites = dict(re.findall(r"^([a-z-]+):\s*([^#\n]*)", makefile, flags=re.M))
    assert prerequisites["run"].split() == ["install"]
    assert recipes["install"].endswith("-m stack install")
    assert recipes["test-tools"].endswith("-m stack install --test-tools")
    assert all(prerequisites[t].split() == ["test-tools"] for t in ("test", "unit", "integration", "deploy-test"))
