"""stack/containers.py's pure parts: podman's settings, the extra CA staging, the compose command line and the
bootstrap secrets' sources. The containers themselves run in tests/deploy (`make deploy-test`)."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from stack import compose, containers
from stack import secrets as sec
from stack.layout import StackLayout
from streaming.core.errors import StackError

pytestmark = pytest.mark.unit


def test_containers_conf_keeps_rlimits_within_the_hard_limits_and_uses_runc() -> None:
    capped = containers.containers_conf_text(20_000, 4_096)
    assert 'default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]' in capped
    assert 'runtime = "runc"' in capped
    unlimited = containers.containers_conf_text(resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    assert '"nofile=65536:65536", "nproc=32768:32768"' in unlimited


def test_extra_ca_staging_copies_only_certificates(tmp_path: Path) -> None:
    host, target = tmp_path / "host", tmp_path / "ca"
    host.mkdir()
    target.mkdir()
    (host / "proxy.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (host / "notes.txt").write_text("not a certificate")
    assert containers.stage_extra_ca(host, target) == ["proxy.crt"]
    assert sorted(p.name for p in target.iterdir()) == ["proxy.crt"]
    assert containers.stage_extra_ca(tmp_path / "absent", target) == []


def test_compose_runs_both_files_under_its_project_with_its_env_file(tmp_path: Path) -> None:
    layout = StackLayout(home=tmp_path, cache=tmp_path / "cache")
    argv = containers.compose_argv(layout, "iotlake-x", tmp_path / "d.env", ("simulator",))
    files = [argv[i + 1] for i, a in enumerate(argv) if a == "-f"]
    assert files == [str(compose.COMPOSE_FILE), str(containers.LOCAL_COMPOSE_FILE)]
    assert argv[argv.index("-p") + 1] == "iotlake-x" and argv[argv.index("--env-file") + 1] == str(tmp_path / "d.env")
    assert argv[-2:] == ["--profile", "simulator"]
    extra = tmp_path / "override.yml"
    argv = containers.compose_argv(layout, "iotlake-x", tmp_path / "d.env", overrides=[extra])
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-f"][-1] == str(extra)  # last: it wins


def test_compose_environment_has_the_local_images_and_none_of_the_generated_values(tmp_path: Path) -> None:
    podman = containers.Podman.at(StackLayout(home=tmp_path, cache=tmp_path / "cache"))
    images = containers.local_images()
    env = containers.compose_env(podman, images)
    assert env["DOCKER_HOST"] == f"unix://{podman.socket}" and env["CONTAINERS_CONF"] == str(podman.conf)
    assert env["IOTLAKE_KAFKA_IMAGE"].startswith("localhost/iotlake-kafka:")
    assert not set(compose.GENERATED_VARS) & set(env)


def test_bootstrap_secrets_come_from_the_environment_or_else_the_mounted_file(tmp_path: Path) -> None:
    values = compose.generate_values()
    compose.write_secret_files(tmp_path / "s", values)
    mounted = tmp_path / "s" / "bootstrap.env"
    assert compose.bootstrap_secrets({}, mounted) == {n: values[n] for n in sec.NAMES}
    override = compose.bootstrap_secrets({sec.ROOT_USER: "FROMENV"}, mounted)
    assert override[sec.ROOT_USER] == "FROMENV" and override[sec.ROOT_PASSWORD] == values[sec.ROOT_PASSWORD]
    with pytest.raises(StackError, match=r"MINIO_ROOT_USER.*absent\.env.*make secrets"):
        compose.bootstrap_secrets({}, tmp_path / "absent.env")
