"""docker-compose.yml, Dockerfile and .env.example checked where no Docker engine runs.

The file is loaded by a real Compose implementation (the pinned `docker-compose` CLI built by
`python -m stack install --test-tools`): `config` interpolates it and validates it against the Compose
specification's schema, exactly as `docker compose up` would. Then every service is checked against the project itself:
commands against the CLIs' own argparse parsers (and Spark's own usage text), environment overrides
through the real config loader, metric ports against Prometheus' targets, mounts against the tree.

Every interface the file relies on (`iotlake maintain`, the maintenance.* settings, `sensor-sim
--metrics-port`/`--metrics-host`, monitoring/, streaming/core/logstore.py) is required: a missing one fails its
test with an assertion naming it. Nothing here is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator, Mapping
from http.server import HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.exposition import MetricsHandler

import streaming.cli
from producers import cli as sim_cli
from producers.errors import UsageError
from stack import cli as stack_cli
from stack import compose
from stack import secrets as sec
from stack.layout import StackLayout
from streaming.core.config import PROJECT_ROOT, Settings, load_settings
from streaming.core.errors import StackError
from streaming.core.session import uses_preinstalled_jars
from tests.helpers import free_port_pair

pytestmark = pytest.mark.unit

ROOT = PROJECT_ROOT
DOCKERFILE = ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
APP_COMMANDS = ("iotlake", "sensor-sim", "python", "spark-class")
ONE_SHOT = {"minio-init", "kafka-init"}
INTERNAL_KAFKA = "kafka:19092"
# service -> (metrics port, Prometheus target file in monitoring/compose/targets/)
METRICS = {"ingest": (9108, "ingest.json"), "maintain": (9109, "maintain.json"), "simulator": (9110, "simulator.json")}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|_KEY$|ACCESS_KEY|ROOT_USER", re.IGNORECASE)
REQUIRED_REF = re.compile(r"^\$\{([A-Z_][A-Z0-9_]*):\?[^}]+\}$")


# --- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def compose_bin() -> Path:
    """The pinned Compose CLI (`make test-tools` builds it; built here too if missing, ~3 min once)."""
    return compose.install_compose(StackLayout.default(), echo=None)


@pytest.fixture(scope="session")
def env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A .env made by the real generator (`python -m stack secrets`)."""
    return compose.write_env(tmp_path_factory.mktemp("compose") / ".env")


@pytest.fixture(scope="session")
def env(env_file: Path) -> dict[str, str]:
    return compose.parse_env(env_file.read_text())


@pytest.fixture(scope="session")
def secrets_folder(env_file: Path) -> Path:
    return compose.secrets_dir(env_file)


@pytest.fixture(scope="session")
def generated(secrets_folder: Path) -> dict[str, str]:
    """Every generated secret by name, as the secrets folder holds them."""
    return compose.read_secret_files(secrets_folder)


@pytest.fixture(scope="session")
def model(compose_bin: Path, env_file: Path) -> dict[str, Any]:
    """The file as Compose resolves it, every profile on: interpolated, merged, schema-validated."""
    done = compose.compose_config(compose_bin, env_file, "--format", "json")
    assert done.returncode == 0, f"docker-compose config refused the file:\n{done.stderr}"
    data: dict[str, Any] = json.loads(done.stdout)
    return data


@pytest.fixture(scope="session")
def services(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = model["services"]
    return result


@pytest.fixture(scope="session")
def raw() -> dict[str, Any]:
    """The file as written (not interpolated)."""
    data: dict[str, Any] = yaml.safe_load(compose.COMPOSE_FILE.read_text())
    return data


def app_services(services: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    image = services["ingest"]["image"]
    return {name: svc for name, svc in services.items() if svc["image"] == image}


def on_host(value: str, secrets_folder: Path | None) -> str:
    """A container path of a mounted secret (/run/secrets/NAME) as the host file compose mounts there."""
    if secrets_folder is not None and value.startswith("/run/secrets/"):
        return str(secrets_folder / value.removeprefix("/run/secrets/"))
    return value


def settings_for(svc: Mapping[str, Any], secrets_folder: Path | None = None) -> Settings:
    """The settings a container gets: the image's config file + its IOTLAKE_* environment, real loader, with
    its mounted secret files read from the secrets folder (or none, without one)."""
    service_env = {k: on_host(str(v), secrets_folder) for k, v in (svc.get("environment") or {}).items()}
    if secrets_folder is None:
        service_env["IOTLAKE_STORAGE__SECRETS_FILE"] = "/nonexistent/secrets.env"
    return load_settings(env=service_env)


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


def subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser | None = action.choices.get(name)
            return found
    return None


def url_port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def healthcheck_url(svc: Mapping[str, Any]) -> str:
    test = svc["healthcheck"]["test"]
    urls = [part for part in test if str(part).startswith("http://")]
    assert len(urls) == 1, f"healthcheck {test} should probe one URL"
    return str(urls[0])


# --- the file as Compose sees it ---------------------------------------------------------------------------


def test_compose_accepts_the_file_with_generated_secrets(model: dict[str, Any]) -> None:
    assert model["name"] == "iotlake"
    assert {"minio", "minio-init", "kafka", "kafka-init", "ingest", "maintain", "prometheus", "grafana"} <= set(
        model["services"]
    )


def test_compose_refuses_the_example_env_naming_each_empty_secret(compose_bin: Path) -> None:
    done = compose.compose_config(compose_bin, compose.ENV_EXAMPLE, "--quiet")
    assert done.returncode != 0
    for name in compose.GENERATED_VARS:
        assert f"required variable {name} is missing a value: run `make secrets`" in done.stderr


def test_compose_validates_against_the_spec_schema(compose_bin: Path, env_file: Path, tmp_path: Path) -> None:
    """Negative control: the same CLI rejects a misspelled key, so acceptance above means schema-valid."""
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(compose.COMPOSE_FILE.read_text().replace("stop_grace_period:", "stop_grace_periodx:", 1))
    done = compose.compose_config(compose_bin, env_file, "--quiet", compose_file=bad)
    assert done.returncode != 0
    assert "stop_grace_periodx" in done.stderr


def test_profiles_keep_the_simulator_and_spark_cluster_optional(services: dict[str, dict[str, Any]]) -> None:
    assert services["simulator"]["profiles"] == ["simulator"]
    assert services["spark-master"]["profiles"] == services["spark-worker"]["profiles"] == ["spark-cluster"]
    core = {n for n, s in services.items() if not s.get("profiles")}
    assert {"ingest", "maintain", "minio", "kafka", "prometheus", "grafana"} <= core


def test_env_example_lists_exactly_the_variables_compose_reads(compose_bin: Path, env_file: Path) -> None:
    done = compose.compose_config(compose_bin, env_file, "--variables", "--format", "json")
    assert done.returncode == 0, done.stderr
    variables = json.loads(done.stdout)
    example = compose.parse_env(compose.ENV_EXAMPLE.read_text())
    assert set(variables) == set(example)
    required = {name for name, v in variables.items() if v["Required"]}
    assert required == set(compose.GENERATED_VARS)
    for name, v in variables.items():
        if not v["Required"]:
            assert v["DefaultValue"] == example[name], f"{name}: default in compose != .env.example"


# --- commands against the real parsers ----------------------------------------------------------------


def _check_iotlake(argv: list[str]) -> None:
    parser = streaming.cli.build_parser()
    if argv and not argv[0].startswith("-"):
        assert subparser(parser, argv[0]) is not None, f"streaming.cli has no `iotlake {argv[0]}` subcommand"
    parser.parse_args(argv)


def _check_sensor_sim(argv: list[str]) -> None:
    parser = sim_cli.build_parser({})
    flags = [a.split("=", 1)[0] for a in argv if a.startswith("--")]
    missing = [f for f in flags if f not in option_strings(parser)]
    assert not missing, f"producers.cli has no option {missing} (`sensor-sim {' '.join(argv)}`)"
    sim_cli.parse_config(argv, {}, now_ms=1_764_000_000_000)


def _check_stack(argv: list[str]) -> None:
    assert argv[:2] == ["-m", "stack"], argv
    stack_cli.build_parser().parse_args(argv[2:])


def test_every_app_command_parses_with_the_projects_own_cli(services: dict[str, dict[str, Any]]) -> None:
    scripts = PYPROJECT["project"]["scripts"]
    checks = {"iotlake": _check_iotlake, "sensor-sim": _check_sensor_sim, "python": _check_stack}
    seen = set()
    for name, svc in app_services(services).items():
        for argv in (svc["command"], svc["healthcheck"].get("test", [None])[1:]):
            if not argv or argv[0] == "spark-class":
                continue
            program = argv[0]
            assert program in checks, f"{name}: {program} is not one of the project's entry points"
            if program != "python":
                assert program in scripts, f"{name}: {program} is not a console script in pyproject.toml"
            seen.add(program)
            try:
                checks[program](list(argv[1:]))
            except AssertionError as e:
                pytest.fail(f"{name}: {e}")
            except (SystemExit, UsageError) as e:
                pytest.fail(f"{name}: `{' '.join(argv)}` is refused by its parser ({e!r})")
    assert seen == {"iotlake", "python", "sensor-sim"}


def _spark_usage(cls: str) -> subprocess.Popen[str]:
    bin_dir = Path(sys.executable).parent  # the venv's bin: spark-class finds SPARK_HOME through its python
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.Popen(
        [str(bin_dir / "spark-class"), cls, "--help"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _daemon(svc: Mapping[str, Any]) -> tuple[str, list[str]]:
    """(role, spark-class arguments) of a spark-cluster service's `python -m stack spark-daemon ROLE ARGS...`."""
    command = [str(a) for a in svc["command"]]
    assert command[:4] == ["python", "-m", "stack", "spark-daemon"], command
    return command[4], command[5:]


def test_spark_cluster_commands_use_real_classes_and_flags(services: dict[str, dict[str, Any]]) -> None:
    """spark-class's own usage text (Spark's argument parsers) lists every flag the services pass."""
    from stack import spark_cluster

    daemons = {name: _daemon(services[name]) for name in ("spark-master", "spark-worker")}
    assert {role for role, _ in daemons.values()} == {"master", "worker"}
    procs = {name: _spark_usage(spark_cluster.ROLE_CLASSES[role]) for name, (role, _) in daemons.items()}
    for name, proc in procs.items():
        role, args = daemons[name]
        out, _ = proc.communicate(timeout=120)
        assert "Usage:" in out, f"{spark_cluster.ROLE_CLASSES[role]} is not a Spark main class:\n{out[-2000:]}"
        known = set(re.findall(r"(--[a-z][a-z-]*)", out.split("Options:", 1)[1]))
        used = {a for a in args if a.startswith("--")} | {"--properties-file"}  # spark-daemon adds the last
        assert used <= known, f"{name}: {sorted(used - known)} not accepted by {spark_cluster.ROLE_CLASSES[role]}"
    master = daemons["spark-master"][1]
    url = f"spark://{master[master.index('--host') + 1]}:{master[master.index('--port') + 1]}"
    assert daemons["spark-worker"][1][-1] == url
    ingest_master = services["ingest"]["environment"]["IOTLAKE_SPARK__MASTER"]
    assert ingest_master == "local[2]", "the default stays local; README tells how to submit to the cluster"
    assert "spark://spark-master:7077" in compose.ENV_EXAMPLE.read_text()


def test_the_spark_cluster_profile_authenticates_with_a_generated_secret(
    services: dict[str, dict[str, Any]], generated: dict[str, str], secrets_folder: Path, tmp_path: Path
) -> None:
    """Master, worker and the ingest driver share the generated spark.authenticate secret from the secrets folder;
    each daemon gets it in a 0600 properties file, not on its command line or in its environment."""
    from stack import spark_cluster

    secret = generated[sec.SPARK_AUTH_SECRET]
    assert len(secret) >= 32
    on_cluster = {"IOTLAKE_SPARK__MASTER": "spark://spark-master:7077"}  # SPARK_MASTER in .env
    ingest = services["ingest"]
    cluster = settings_for({**ingest, "environment": {**ingest["environment"], **on_cluster}}, secrets_folder)
    assert cluster.spark.auth_secret == secret and uses_preinstalled_jars(cluster)
    for name in ("spark-master", "spark-worker"):
        assert [s["source"] for s in services[name]["secrets"]] == ["spark_auth_secret"], name
        role, args = _daemon(services[name])
        folder = tmp_path / role
        folder.mkdir()
        environment = {k: on_host(str(v), secrets_folder) for k, v in services[name]["environment"].items()}
        argv, child_env = spark_cluster.container_daemon(role, args, environment, folder)
        assert argv[1] == spark_cluster.ROLE_CLASSES[role] and argv[-len(args) :] == args
        assert secret not in " ".join(argv) and secret not in json.dumps(child_env), name
        assert spark_cluster.AUTH_SECRET_FILE_ENV not in child_env
        conf = Path(argv[argv.index("--properties-file") + 1])
        assert conf.parent == folder and stat.S_IMODE(conf.stat().st_mode) == 0o600
        props = dict(line.split(" ", 1) for line in conf.read_text().splitlines() if not line.startswith("#"))
        assert props["spark.authenticate"] == "true" and props["spark.authenticate.secret"] == secret
        if role == "worker":  # the native worker's work-dir cleanup too
            assert spark_cluster.WORKER_PROPERTIES.items() <= props.items()
    with pytest.raises(StackError, match="make secrets"):
        spark_cluster.container_daemon("master", [], {}, tmp_path)


# --- environment against the config the app reads -----------------------------------------------------


def test_iotlake_environment_loads_through_the_real_config_loader(
    services: dict[str, dict[str, Any]], env: dict[str, str], generated: dict[str, str], secrets_folder: Path
) -> None:
    assert "maintenance" in Settings.__dataclass_fields__, "streaming.core.config.Settings has no maintenance section"
    for name in ("ingest", "maintain", "minio-init"):
        svc = services[name]
        settings = settings_for(svc, secrets_folder)
        assert settings.storage.endpoint == "http://minio:9000"
        if name == "minio-init":
            continue
        assert settings.kafka.bootstrap_servers == INTERNAL_KAFKA
        assert settings.kafka.topic == env["KAFKA_TOPIC"]
        assert settings.kafka.partitions == int(env["KAFKA_PARTITIONS"])
        # The pipeline writes with the writer's key, never MinIO's root, from its mounted writer.env.
        assert [s["source"] for s in svc["secrets"]] == ["writer.env"]
        assert settings.storage.access_key == generated[sec.WRITER_ACCESS_KEY]
        assert settings.storage.secret_key == generated[sec.WRITER_SECRET_KEY]
        assert generated[sec.ROOT_PASSWORD] not in (secrets_folder / "writer.env").read_text()


def test_ingest_settings_match_its_volume_healthcheck_and_cluster_wiring(services: dict[str, dict[str, Any]]) -> None:
    svc = services["ingest"]
    settings = settings_for(svc)
    assert settings.ingest.metrics_host == "0.0.0.0"
    assert settings.ingest.metrics_port == url_port(healthcheck_url(svc)) == METRICS["ingest"][0]
    volume_targets = {v["target"] for v in svc["volumes"] if v["type"] == "volume"}
    assert any(settings.ingest.checkpoint_location.startswith(t + "/") for t in volume_targets)
    assert settings.spark.conf["spark.driver.host"] == "ingest"


def test_minio_init_gets_exactly_the_bootstrap_secrets(
    services: dict[str, dict[str, Any]], generated: dict[str, str], secrets_folder: Path
) -> None:
    svc = services["minio-init"]
    assert [s["source"] for s in svc["secrets"]] == ["bootstrap.env"]
    settings = settings_for(svc, secrets_folder)
    found = compose.bootstrap_secrets(svc["environment"], Path(settings.storage.secrets_file))
    assert found == {n: generated[n] for n in sec.NAMES}
    assert svc["command"] == ["python", "-m", "stack", "bootstrap-minio"]


def test_minio_reads_its_root_login_from_mounted_files(
    services: dict[str, dict[str, Any]], generated: dict[str, str], secrets_folder: Path
) -> None:
    environment = services["minio"]["environment"]
    mounted = {s["source"] for s in services["minio"]["secrets"]}
    assert mounted == {"minio_root_user", "minio_root_password"}
    for variable, name in (("MINIO_ROOT_USER_FILE", sec.ROOT_USER), ("MINIO_ROOT_PASSWORD_FILE", sec.ROOT_PASSWORD)):
        assert Path(on_host(environment[variable], secrets_folder)).read_text() == generated[name]


def test_other_variables_are_ones_the_programs_read(services: dict[str, dict[str, Any]]) -> None:
    """Non-IOTLAKE_* variables of app services: MinIO bootstrap names, sensor-sim's [env: ...] fallbacks, or
    nothing else."""
    sim_envs = {sim_cli.env_name(flag) for flag in option_strings(sim_cli.build_parser({})) if flag.startswith("--")}
    for name, svc in app_services(services).items():
        for key in svc.get("environment") or {}:
            if key.startswith("IOTLAKE_") or key in sec.NAMES:
                continue
            assert key.startswith("SENSOR_SIM_"), f"{name}: {key} is read by no program"
            flag = "--" + key[len("SENSOR_SIM_") :].lower().replace("_", "-")
            assert key in sim_envs, f"{name}: {key} is read by no program (sensor-sim has no {flag} option)"


def test_kafka_addresses_agree(services: dict[str, dict[str, Any]], env: dict[str, str]) -> None:
    kafka = services["kafka"]["environment"]
    advertised = dict(item.split("://", 1) for item in kafka["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert advertised["INTERNAL"] == INTERNAL_KAFKA
    assert advertised["HOST"] == f"127.0.0.1:{env['KAFKA_HOST_PORT']}"
    listeners = dict(item.split("://", 1) for item in kafka["KAFKA_LISTENERS"].split(","))
    assert listeners["INTERNAL"] == ":19092"
    published = {p["target"]: p for p in services["kafka"]["ports"]}
    assert int(listeners["HOST"].lstrip(":")) in published
    sim = services["simulator"]["command"]
    assert sim[sim.index("--bootstrap-servers") + 1] == INTERNAL_KAFKA
    assert f"--bootstrap-server {INTERNAL_KAFKA}" in " ".join(services["kafka-init"]["command"])
    assert services["kafka"]["healthcheck"]["test"][-1] == INTERNAL_KAFKA
    init_env = services["kafka-init"]["environment"]
    assert init_env["KAFKA_PARTITIONS"] == env["KAFKA_PARTITIONS"]
    assert init_env["KAFKA_RETENTION_MS"] == env["KAFKA_RETENTION_MS"]
    assert kafka["CLUSTER_ID"] == env[compose.KAFKA_CLUSTER_ID]


def test_minio_serves_where_the_pipeline_looks(services: dict[str, dict[str, Any]]) -> None:
    command = services["minio"]["command"]
    api_port = int(command[command.index("--address") + 1].lstrip(":"))
    console_port = int(command[command.index("--console-address") + 1].lstrip(":"))
    endpoint = urlsplit(settings_for(services["ingest"]).storage.endpoint)
    assert (endpoint.hostname, endpoint.port) == ("minio", api_port)
    assert {p["target"] for p in services["minio"]["ports"]} == {api_port, console_port}


# --- operations: health, restarts, ports, images -------------------------------------------------------


def test_long_running_services_have_healthchecks_and_restart_policies(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        if name in ONE_SHOT:
            assert svc["restart"].startswith("on-failure"), name
            continue
        assert svc.get("restart") in ("unless-stopped", "always"), f"{name} is not restarted after a crash"
        health = svc.get("healthcheck") or {}
        assert not health.get("disable") and health.get("test"), f"{name} has no healthcheck"
        assert health["test"][0] in ("CMD", "CMD-SHELL"), name


def test_one_shot_jobs_gate_the_pipeline(services: dict[str, dict[str, Any]]) -> None:
    for name in ("ingest", "maintain"):
        depends = services[name]["depends_on"]
        assert depends["minio-init"]["condition"] == "service_completed_successfully"
    assert services["ingest"]["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert services["minio-init"]["depends_on"]["minio"]["condition"] == "service_healthy"
    assert services["kafka-init"]["depends_on"]["kafka"]["condition"] == "service_healthy"


# Services whose image writes outside its volumes at start: apache/kafka renders its configuration into
# /opt/kafka/config; Grafana can't run here to prove otherwise.
WRITABLE_ROOT = {"kafka", "kafka-init", "grafana"}


def test_every_other_service_has_a_read_only_root_and_a_private_tmp(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        if name in WRITABLE_ROOT:
            assert not svc.get("read_only"), f"{name}: remove it from WRITABLE_ROOT"
            continue
        assert svc.get("read_only") is True, f"{name} has a writable root file system"
        assert any(t.split(":")[0] == "/tmp" for t in svc.get("tmpfs") or []), f"{name} has no tmpfs /tmp"


def test_ports_are_published_on_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    published = []
    for name, svc in services.items():
        for port in svc.get("ports") or []:
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            published.append(name)
    assert set(published) >= {"minio", "kafka", "prometheus", "grafana"}
    for name in METRICS:
        assert not services[name].get("ports"), f"{name}'s metrics stay on the compose network"


def test_images_are_pinned(services: dict[str, dict[str, Any]]) -> None:
    version = PYPROJECT["project"]["version"]
    for name, svc in services.items():
        image = svc["image"]
        _repo, sep, tag = image.rpartition(":")
        assert sep and "/" not in tag and tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned to a version"
    assert services["ingest"]["image"] == f"iotlake:{version}"
    assert sum(1 for svc in services.values() if svc.get("build")) == 1, "one service builds the app image"
    for arg, value in re.findall(r"^ARG (\w+_IMAGE)=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE):
        assert re.search(r":\d[\w.-]*$", value) and ":latest" not in value, f"Dockerfile {arg}={value}"


def test_app_image_matches_the_native_kafka_version(services: dict[str, dict[str, Any]]) -> None:
    from streaming.core import versions

    assert services["kafka"]["image"] == f"apache/kafka:{versions.KAFKA_VERSION}"
    assert services["kafka-init"]["image"] == services["kafka"]["image"]


# --- secrets --------------------------------------------------------------------------------------------


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")
    else:
        yield path, node


def test_no_secret_reaches_a_container_but_as_a_mounted_file(raw: dict[str, Any]) -> None:
    """A variable named like a credential holds the path of a mounted secret, never a value or a ${VAR};
    every mounted secret is a file of the generated folder, and each service mounts what it points at."""
    pointers = 0
    for name, svc in raw["services"].items():
        mounted = set(svc.get("secrets") or [])
        assert mounted <= compose.SECRET_FILES.keys(), f"{name} mounts {mounted - compose.SECRET_FILES.keys()}"
        for path, value in _walk(svc.get("environment") or {}):
            if SECRET_NAME.search(path):
                assert str(value).startswith("/run/secrets/"), f"{name}.environment.{path} = {value!r}"
                assert str(value).removeprefix("/run/secrets/") in mounted, f"{name} doesn't mount {value}"
                pointers += 1
    assert pointers >= 6
    for secret, spec in raw["secrets"].items():
        assert secret in compose.SECRET_FILES
        assert REQUIRED_REF.match(spec["file"].rsplit("/", 1)[0]) and spec["file"].endswith(f"/{secret}"), spec
    assert raw["secrets"].keys() == compose.SECRET_FILES.keys()
    text = compose.COMPOSE_FILE.read_text()
    for name in compose.SECRET_VARS:
        assert not re.search(rf"\$\{{?{name}\b", text), f"docker-compose.yml references ${name}"


# A variable reference (${VAR...}, $VAR, or $$VAR for the container's shell) and Spark's default
# spark.redaction.regex, which names credential-like settings (fs.s3a.secret.key, --password, ...).
VAR_REF = re.compile(r"\$\$?\{?([A-Za-z_][A-Za-z0-9_]*)")
CREDENTIAL_WORD = re.compile(r"secret|password|token|access[._-]?key", re.IGNORECASE)


def _secret_arguments(argv: Any) -> list[str]:
    """The arguments of a command that reference a secret variable or name a credential."""
    args = [argv] if isinstance(argv, str) else list(argv or [])
    bad = []
    for arg in map(str, args):
        names = VAR_REF.findall(arg)
        if any(n in compose.SECRET_VARS or SECRET_NAME.search(n) for n in names) or CREDENTIAL_WORD.search(arg):
            bad.append(arg)
    return bad


@pytest.mark.parametrize(
    "argv",
    [
        ["server", "/data", "--password", "${MINIO_ROOT_PASSWORD:?x}"],
        ["sh", "-c", 'mc alias set local http://minio:9000 "$$MINIO_ROOT_USER" x'],
        "iotlake ingest --conf spark.hadoop.fs.s3a.secret.key=abc",
        ["iotlake", "ingest", "$IOTLAKE_WRITER_ACCESS_KEY"],
    ],
)
def test_secret_argument_detector_catches_references_and_credential_flags(argv: Any) -> None:
    assert _secret_arguments(argv)


def test_no_service_passes_a_secret_in_its_command(raw: dict[str, Any]) -> None:
    """Arguments are world-readable (`ps`, /proc/<pid>/cmdline); secrets go through mounted files only."""
    checked = 0
    for name, svc in raw["services"].items():
        for field in ("command", "entrypoint"):
            if field in svc:
                checked += 1
                assert not _secret_arguments(svc[field]), f"{name}.{field}: {_secret_arguments(svc[field])}"
        test = (svc.get("healthcheck") or {}).get("test")
        assert not _secret_arguments(test), f"{name}.healthcheck.test: {_secret_arguments(test)}"
    assert checked >= 8, "every long-running service and job has a command"


def test_env_example_holds_no_secret_and_every_generated_name(env: dict[str, str], generated: dict[str, str]) -> None:
    example = compose.parse_env(compose.ENV_EXAMPLE.read_text())
    for name in compose.GENERATED_VARS:
        assert example[name] == "", f".env.example must leave {name} empty (compose refuses it then)"
        assert env[name], name
    assert set(env) == set(example)
    assert not set(compose.SECRET_VARS) & set(env), "secrets live in the secrets folder, not in .env"
    assert not any(value in " ".join(env.values()) for value in generated.values())
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert ".env" in ignored and ".secrets/" in ignored


def test_secrets_command_writes_a_private_env_and_folder_and_refuses_to_overwrite(tmp_path: Path) -> None:
    path = tmp_path / ".env"
    folder = compose.secrets_dir(path)
    assert stack_cli.main(["secrets", "--env", str(path)]) == 0
    first = compose.read_secret_files(folder)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert compose.parse_env(path.read_text())[compose.SECRETS_DIR_VAR] == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted(compose.SECRET_FILES)
    assert first.keys() == set(compose.SECRET_VARS)
    assert len(set(first.values())) == len(compose.SECRET_VARS), "every secret differs"
    assert len(first[sec.ROOT_PASSWORD]) == sec.SECRET_KEY_LENGTH
    assert len(first[sec.WRITER_ACCESS_KEY]) == sec.ACCESS_KEY_LENGTH
    assert stack_cli.main(["secrets", "--env", str(path)]) == 2
    assert compose.read_secret_files(folder) == first, "refused means untouched"
    path.unlink()
    assert stack_cli.main(["secrets", "--env", str(path)]) == 2, "the folder alone holds the volumes' credentials"
    assert stack_cli.main(["secrets", "--env", str(path), "--force"]) == 0
    assert compose.read_secret_files(folder)[sec.ROOT_PASSWORD] != first[sec.ROOT_PASSWORD]


def test_render_env_refuses_a_template_missing_a_generated_name() -> None:
    with pytest.raises(StackError, match="KAFKA_CLUSTER_ID"):
        compose.render_env("MINIO_ROOT_USER=\n", compose.generate_values())


# --- mounts and monitoring ---------------------------------------------------------------------------------


def test_every_mounted_host_path_exists(services: dict[str, dict[str, Any]]) -> None:
    missing = []
    for name, svc in services.items():
        for volume in svc.get("volumes") or []:
            if volume["type"] != "bind":
                continue
            source = Path(volume["source"])
            assert source.is_relative_to(ROOT), f"{name} mounts {source}, outside the project"
            if not source.exists():
                missing.append(str(source.relative_to(ROOT)))
    assert not missing, f"mounted but missing (Docker would create empty directories): {missing}"


def test_prometheus_targets_match_service_names_and_metric_ports(services: dict[str, dict[str, Any]]) -> None:
    mounts = {v["target"]: Path(v["source"]) for v in services["prometheus"]["volumes"] if v["type"] == "bind"}
    targets_dir = mounts["/etc/prometheus/targets"]
    config_path = mounts["/etc/prometheus/prometheus.yml"]
    assert config_path.exists(), f"prometheus mounts {config_path}, which does not exist"
    config = yaml.safe_load(config_path.read_text())
    files = {f for job in config["scrape_configs"] for sd in job.get("file_sd_configs", []) for f in sd["files"]}
    for name, (port, target_file) in METRICS.items():
        assert f"targets/{target_file}" in files, f"prometheus.yml does not read targets/{target_file}"
        groups = json.loads((targets_dir / target_file).read_text())
        assert [t for g in groups for t in g["targets"]] == [f"{name}:{port}"]
        assert url_port(healthcheck_url(services[name])) == port
    sim = services["simulator"]["command"]
    assert int(sim[sim.index("--metrics-port") + 1]) == METRICS["simulator"][0]
    maintenance = settings_for(services["maintain"]).maintenance
    assert maintenance.metrics_port == METRICS["maintain"][0]
    assert maintenance.metrics_host == "0.0.0.0"
    rules = list(config.get("rule_files", []))
    assert all(r.startswith("rules/") for r in rules) and "/etc/prometheus/rules" in mounts


def test_grafana_provisioning_points_at_the_compose_prometheus(services: dict[str, dict[str, Any]]) -> None:
    mounts = {v["target"]: Path(v["source"]) for v in services["grafana"]["volumes"] if v["type"] == "bind"}
    provisioning = mounts["/etc/grafana/provisioning"]
    assert provisioning.exists(), f"grafana mounts {provisioning}, which does not exist"
    datasources = [yaml.safe_load(p.read_text()) for p in sorted((provisioning / "datasources").glob("*.y*ml"))]
    urls = {ds["url"] for doc in datasources for ds in doc.get("datasources", [])}
    assert urls == {"http://prometheus:9090"}
    providers = [yaml.safe_load(p.read_text()) for p in sorted((provisioning / "dashboards").glob("*.y*ml"))]
    paths = {p["options"]["path"] for doc in providers for p in doc.get("providers", [])}
    dashboards = [t for t, src in mounts.items() if src == ROOT / "monitoring" / "grafana" / "dashboards"]
    assert paths and paths == set(dashboards), f"dashboards mounted at {dashboards}, the provider reads {paths}"
    assert list((ROOT / "monitoring" / "grafana" / "dashboards").glob("*.json")), "no dashboard to provision"
    env = services["grafana"]["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


# --- the Dockerfile ----------------------------------------------------------------------------------------


def test_dockerfile_installs_the_one_dependency_list_of_pyproject() -> None:
    text = DOCKERFILE.read_text()
    pip_lines = [line.strip() for line in re.findall(r"pip install[^\n\\]*", text)]
    assert pip_lines == ["pip install -r /tmp/requirements.txt", "pip install --no-deps -e ."]
    assert not list(ROOT.glob("requirements*.txt")), "no second dependency list"
    snippet = re.search(r'python -c "(import tomllib;[^"]+)"', text)
    assert snippet, "requirements are read from pyproject.toml at build time"
    done = subprocess.run(
        [sys.executable, "-c", snippet.group(1)],  # sh leaves "\\n" alone in double quotes; Python reads it
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == PYPROJECT["project"]["dependencies"]


def test_dockerfile_bakes_the_jars_and_runs_unprivileged() -> None:
    text = DOCKERFILE.read_text()
    stages = re.findall(r"^FROM \S+ AS (\w+)$", text, re.MULTILINE)
    assert stages[-1] == "runtime" and "build" in stages
    assert "RUN PYTHONPATH=/app python -m streaming.core.session" in text, "the project's resolver runs at build time"
    assert text.count("IOTLAKE_SPARK__IVY_CACHE=/opt/iotlake/ivy") == 2, "same Ivy path when built and when run"
    assert re.search(r"^USER iotlake$", text, re.MULTILINE)
    assert re.search(r"^HEALTHCHECK .*\n?.*stack\", \"probe\"", text, re.MULTILINE)
    assert text.count("IOTLAKE_CACHE=/opt/iotlake/cache") == 2, "the log store jar is found where it was built"
    assert "ARG WITH_LOGSTORE=true" in text
    from streaming.core import logstore  # the build step calls it by name

    assert callable(getattr(logstore, "ensure_jar", None)), (
        "Dockerfile builds the jar with streaming.core.logstore.ensure_jar()"
    )
    for name in ("secret", "password"):
        assert not re.search(rf"^(ENV|ARG) .*{name}", text, re.IGNORECASE | re.MULTILINE)
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE))
    copied = [
        re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], source).rstrip("/")
        for source in re.findall(r"^COPY (?!--from)(?:--\S+ )*(\S+) ", text, re.MULTILINE)
    ]
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()}
    assert {".env", ".git", "var", ".venv"} <= ignored
    assert not set(copied) & ignored, "a COPY source is excluded by .dockerignore"
    for source in copied:
        assert (ROOT / source).exists(), source
    packages = {p.rstrip("*") for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= {Path(c).name for c in copied}, "every package listed in pyproject is copied"


def test_dockerfile_passes_the_linter(tmp_path: Path) -> None:
    linter = compose.install_dockerfile_linter(StackLayout.default(), echo=None)
    done = subprocess.run([str(linter), "lint", str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    # Negative control: the same linter flags a broken instruction.
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("EXPOSE 9108 ", "EXPOSE 9108x ", 1))
    done = subprocess.run([str(linter), "lint", str(bad)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Invalid containerPort: 9108x" in done.stdout


# --- the healthcheck probe -------------------------------------------------------------------------------


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, Gauge]]:
    registry = CollectorRegistry()
    gauge = Gauge("iot_ingest_query_up", "test", registry=registry)
    port = free_port_pair()
    server = HTTPServer(("127.0.0.1", port), MetricsHandler.factory(registry))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/metrics", gauge
    finally:
        server.shutdown()
        server.server_close()


def test_probe_requires_the_metric_above_zero(metrics_server: tuple[str, Gauge]) -> None:
    url, gauge = metrics_server
    assert compose.probe(url)[0]
    ok, why = compose.probe(url, require="iot_ingest_query_up")
    assert not ok and "is 0" in why
    gauge.set(1)
    assert compose.probe(url, require="iot_ingest_query_up") == (True, "iot_ingest_query_up = 1")
    assert stack_cli.main(["probe", url, "--require", "iot_ingest_query_up"]) == 0
    assert stack_cli.main(["probe", url, "--require", "iot_no_such_metric"]) == 1


def test_probe_fails_when_nothing_answers() -> None:
    port = free_port_pair()
    ok, why = compose.probe(f"http://127.0.0.1:{port}/metrics", timeout=1.0)
    assert not ok and "did not answer" in why


# --- operations: the VACUUM guard's source, the Spark worker's disk -------------------------------------------


def _volume_holding(svc: Mapping[str, Any], path: str) -> dict[str, Any] | None:
    """The named-volume mount of a service that holds `path` in its container."""
    for mount in svc.get("volumes") or []:
        target = str(mount["target"]).rstrip("/")
        if mount["type"] == "volume" and (path == target or path.startswith(target + "/")):
            found: dict[str, Any] = mount
            return found
    return None


def test_maintain_gets_a_smaller_cpu_share_than_ingest(services: dict[str, dict[str, Any]]) -> None:
    """Each container is a CPU group of its own, so the sidecar's nice orders only its own processes: its
    container's share is what keeps a compaction from taking the stream's CPU (1024 is the default share)."""
    maintain, ingest = services["maintain"], services["ingest"]
    assert int(maintain.get("cpu_shares", 1024)) * 4 <= int(ingest.get("cpu_shares", 1024))


def test_maintain_reads_the_ingest_checkpoint_read_only(services: dict[str, dict[str, Any]]) -> None:
    """The sidecar's VACUUM guard reads the stream's checkpoint: the same path on the same volume, read-only."""
    ingest, maintain = services["ingest"], services["maintain"]
    where = settings_for(ingest).ingest.checkpoint_location
    assert settings_for(maintain).ingest.checkpoint_location == where, "maintain would read another checkpoint"
    written, read = _volume_holding(ingest, where), _volume_holding(maintain, where)
    assert written is not None and not written.get("read_only"), ingest.get("volumes")
    assert read is not None, f"maintain has no volume at {where}: its VACUUM guard can't see the stream"
    assert read["source"] == written["source"] and read.get("read_only") is True, read


def test_compose_spark_worker_keeps_its_work_dir_on_a_volume(services: dict[str, dict[str, Any]]) -> None:
    """Executor logs (and the jars of a driver that sends them) go to the work dir: on a named volume, not in
    the container's writable layer; finished applications' dirs are deleted (the authentication test checks the
    worker's cleanup properties)."""
    _, args = _daemon(services["spark-worker"])
    work_dir = args[args.index("--work-dir") + 1]
    assert _volume_holding(services["spark-worker"], work_dir) is not None, f"{work_dir} is not on a volume"
