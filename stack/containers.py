"""The compose deployment run for real on a machine without Docker: podman (with runc) serves Docker's API,
the project's Docker Compose drives it, and the images are built here.

Where no container registry is reachable, nothing can be pulled, so every image starts from a local Debian
base that `mmdebstrap` builds from the Debian mirror apt already uses: the app image from ./Dockerfile (its
base images are build arguments), and Kafka, MinIO and Prometheus from deploy/<name>/Dockerfile with the
binaries the native stack installs (Maven's Kafka jars, the pinned MinIO build, Debian's Prometheus).
deploy/compose.local.yml points docker-compose.yml at those images; users with a registry keep the public
ones. podman's settings live in a project-written containers.conf (CONTAINERS_CONF); /etc is never edited.

`python -m stack deploy build|compose ARGS` (see `register`); tests/deploy drives it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import resource
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stack import compose
from stack import install as inst
from stack import secrets as sec
from stack.addresses import free_port
from stack.install import Echo, _say
from stack.layout import StackLayout, default_cache
from stack.proc import run_checked
from streaming.core import versions
from streaming.core.config import PROJECT_ROOT
from streaming.core.errors import StackError

DEPLOY_DIR = PROJECT_ROOT / "deploy"
LOCAL_COMPOSE_FILE = DEPLOY_DIR / "compose.local.yml"
EXTRA_CA_DIR = DEPLOY_DIR / "ca"
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
APT_PACKAGES = ("podman", "runc", "mmdebstrap")
# What every local image needs: Python for the app (and the healthchecks), a JDK for the app's build stage
# and Kafka, the CA store, the tools the Dockerfiles run (useradd, wget for Prometheus's healthcheck).
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "python-is-python3",
    "ca-certificates",
    "openjdk-17-jdk-headless",
    "passwd",
    "procps",
    "wget",
)
BASE_REPO = "localhost/iotlake-base"
SERVICE_TIMEOUT_S = 60.0
BUILD_TIMEOUT_S = 45 * 60


@dataclass(frozen=True)
class Podman:
    """podman's private settings file and API socket, under the stack's home and cache."""

    conf: Path
    socket: Path
    log: Path

    @classmethod
    def at(cls, layout: StackLayout) -> Podman:
        return cls(
            conf=layout.cache / "containers" / "containers.conf",
            socket=layout.run / "podman" / "podman.sock",
            log=layout.logs / "podman-service.log",
        )

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def env(self) -> dict[str, str]:
        """The environment podman and docker-compose run with: this conf, this socket."""
        env = dict(os.environ)
        env["CONTAINERS_CONF"] = str(self.conf)
        env["DOCKER_HOST"] = self.docker_host
        return env


# --- tools ---------------------------------------------------------------------------------------------


def missing_tools() -> list[str]:
    """The Debian packages of APT_PACKAGES whose command is not on PATH."""
    return [name for name in APT_PACKAGES if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()]


def install_tools(echo: Echo | None = print) -> None:
    """apt-get install podman, runc and mmdebstrap when one is missing (root, or sudo without a password)."""
    started = time.monotonic()
    missing = missing_tools()
    if not missing:
        _say(echo, "podman, runc, mmdebstrap", "present", started)
        return
    sudo: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise StackError(
                f"{', '.join(missing)} missing and this user is not root. Run `sudo apt-get install "
                f"{' '.join(APT_PACKAGES)}` once, then run this again."
            )
        sudo = ["sudo", "-n"]
    run_checked(
        [*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES, "catatonit"],
        what=f"Installing {', '.join(missing)} with apt-get",
        fix=f"Run `apt-get update` as root, or `apt-get install {' '.join(APT_PACKAGES)}` yourself, then retry.",
        timeout=15 * 60,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    _say(echo, f"{', '.join(missing)} (apt-get)", "installed", started)


def containers_conf_text(nofile_hard: int, nproc_hard: int) -> str:
    """podman's settings: runc (crun refuses hybrid cgroups), and default rlimits within this machine's
    hard limits (podman's own defaults exceed them and every container then fails in setrlimit)."""

    def cap(limit: int, wanted: int) -> int:
        return wanted if limit == resource.RLIM_INFINITY else min(limit, wanted)

    nofile, nproc = cap(nofile_hard, 65536), cap(nproc_hard, 32768)
    return (
        "# Written by stack/containers.py: podman's settings for the iotlake deployment (CONTAINERS_CONF).\n"
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )


def write_conf(podman: Podman) -> Path:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    podman.conf.parent.mkdir(parents=True, exist_ok=True)
    podman.conf.write_text(containers_conf_text(nofile, nproc))
    return podman.conf


# --- the Docker API ------------------------------------------------------------------------------------


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(str(self._path))
        self.sock = sock


def api_answers(podman: Podman, timeout: float = 2.0) -> bool:
    """True if the socket serves Docker's API (GET /_ping answers OK)."""
    conn = _UnixConnection(podman.socket, timeout)
    try:
        conn.request("GET", "/_ping")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def api_service(podman: Podman) -> Iterator[Podman]:
    """podman's Docker API on its socket for the block (an already serving one is reused, and left running)."""
    if api_answers(podman):
        yield podman
        return
    podman.socket.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    podman.socket.unlink(missing_ok=True)
    podman.log.parent.mkdir(parents=True, exist_ok=True)
    with podman.log.open("ab") as log:
        child = subprocess.Popen(
            ["podman", "system", "service", "--time=0", podman.docker_host],
            env=podman.env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + SERVICE_TIMEOUT_S
        while not api_answers(podman):
            if child.poll() is not None or time.monotonic() >= deadline:
                raise StackError(
                    f"podman's Docker API did not come up on {podman.socket} (see {podman.log}). Check that "
                    "`podman info` works with CONTAINERS_CONF=" + str(podman.conf) + "."
                )
            time.sleep(0.2)
        yield podman
    finally:
        child.terminate()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


# --- images --------------------------------------------------------------------------------------------


def podman_run(podman: Podman, *args: str, what: str, fix: str, timeout: float = 600, log: Path | None = None) -> str:
    return run_checked(["podman", *args], what=what, fix=fix, timeout=timeout, env=podman.env(), log=log)


def podman_out(podman: Podman, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`podman ARGS` with this conf, its output captured; the caller reads the exit code."""
    return subprocess.run(
        ["podman", *args], env=podman.env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def image_exists(podman: Podman, ref: str) -> bool:
    return podman_out(podman, "image", "exists", ref).returncode == 0


def base_image() -> str:
    """The local base's tag: Debian bookworm and the package list (a new list is a new base)."""
    digest = hashlib.sha256(" ".join(BASE_PACKAGES).encode()).hexdigest()[:10]
    return f"{BASE_REPO}:bookworm-{digest}"


def debian_sources() -> Path:
    for path in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if path.exists():
            return path
    raise StackError("No apt sources found (/etc/apt/sources.list.d/debian.sources): mmdebstrap needs a Debian mirror.")


def build_base(podman: Podman, layout: StackLayout, echo: Echo | None = print) -> str:
    """The local Debian base image (mmdebstrap from apt's own mirror, about a minute), once per package list.

    Java is moved to /opt/java/openjdk (where the Temurin images the Dockerfile uses by default keep it) and
    linked back, so the same Dockerfile lines copy it out of either base.
    """
    started = time.monotonic()
    ref = base_image()
    if image_exists(podman, ref):
        _say(echo, f"base image {ref}", "cached", started)
        return ref
    tar = layout.cache / "containers" / f"{ref.rsplit(':', 1)[1]}.tar"
    tar.parent.mkdir(parents=True, exist_ok=True)
    java = "/usr/lib/jvm/java-17-openjdk-amd64"
    run_checked(
        [
            "mmdebstrap",
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            f'--customize-hook=mkdir -p "$1/opt/java" && mv "$1{java}" "$1/opt/java/openjdk" '
            f'&& ln -s /opt/java/openjdk "$1{java}"',
            '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*',
            "bookworm",
            str(tar),
            str(debian_sources()),
        ],
        what="Building the local Debian base image with mmdebstrap",
        fix="Check that the Debian mirror in /etc/apt/sources.list.d answers (`apt-get update`), then retry.",
        timeout=20 * 60,
        log=layout.logs / "deploy-base.log",
    )
    try:
        podman_run(
            podman,
            "import",
            str(tar),
            ref,
            what=f"Importing {tar} as {ref}",
            fix=f"Delete {tar} and retry.",
            log=layout.logs / "deploy-base.log",
        )
    finally:
        tar.unlink(missing_ok=True)
    _say(echo, f"base image {ref}", "built", started)
    return ref


@dataclass(frozen=True)
class Images:
    """The image references deploy/compose.local.yml reads (as environment variables)."""

    app: str
    kafka: str
    minio: str
    prometheus: str

    def env(self) -> dict[str, str]:
        return {
            "IOTLAKE_IMAGE": self.app,
            "IOTLAKE_KAFKA_IMAGE": self.kafka,
            "IOTLAKE_MINIO_IMAGE": self.minio,
            "IOTLAKE_PROMETHEUS_IMAGE": self.prometheus,
        }


def local_images() -> Images:
    return Images(
        app=f"localhost/iotlake:{_project_version()}",
        kafka=f"localhost/iotlake-kafka:{versions.KAFKA_VERSION}",
        minio=f"localhost/iotlake-minio:{versions.MINIO_VERSION.removeprefix('v0.0.0-')}",
        prometheus=f"localhost/iotlake-prometheus:{versions.PROMETHEUS_DEB_VERSION.split('+')[0]}",
    )


def _project_version() -> str:
    import tomllib

    return str(tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["version"])


def _build(
    podman: Podman, layout: StackLayout, ref: str, context: Path, dockerfile: Path, args: Mapping[str, str]
) -> None:
    argv = ["build", "--layers", "-t", ref, "-f", str(dockerfile)]
    for key, value in args.items():
        argv += ["--build-arg", f"{key}={value}"]
    podman_run(
        podman,
        *argv,
        str(context),
        what=f"Building {ref}",
        fix=f"Read the build's log ({layout.logs / 'deploy-build.log'}); fix what it names and run the build again.",
        timeout=BUILD_TIMEOUT_S,
        log=layout.logs / "deploy-build.log",
    )


def _stage(context: Path, files: Mapping[str, Path]) -> None:
    """A build context of its own: `name -> source` (files or directories), hard-linked where possible."""
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    for name, source in files.items():
        target = context / name
        if source.is_dir():
            shutil.copytree(source, target, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(source), str(target))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def stage_extra_ca(host_dir: Path = HOST_CA_DIR, target: Path = EXTRA_CA_DIR) -> list[str]:
    """Copy this machine's added CA certificates into deploy/ca/ (the app build trusts them); their names."""
    names = []
    for crt in sorted(host_dir.glob("*.crt")) if host_dir.is_dir() else []:
        shutil.copyfile(crt, target / crt.name)
        names.append(crt.name)
    return names


def build_images(podman: Podman, layout: StackLayout, echo: Echo | None = print) -> Images:
    """Every image of the local deployment: the base, Kafka, MinIO and Prometheus, and the app (cached layers)."""
    installed = inst.install(layout, echo=echo)
    base = build_base(podman, layout, echo)
    images = local_images()
    contexts = layout.cache / "containers" / "contexts"
    staged = {
        images.kafka: (
            "kafka",
            {
                "libs": installed.kafka_libs,
                "entrypoint.sh": DEPLOY_DIR / "kafka" / "entrypoint.sh",
                "kafka-run-class.sh": DEPLOY_DIR / "kafka" / "kafka-run-class.sh",
                "log4j2.xml": DEPLOY_DIR / "kafka" / "log4j2.xml",
            },
        ),
        images.minio: ("minio", {"minio": installed.minio}),
        images.prometheus: ("prometheus", {"prometheus": installed.prometheus, "promtool": installed.promtool}),
    }
    for ref, (name, files) in staged.items():
        started = time.monotonic()
        _stage(contexts / name, files)
        _build(podman, layout, ref, contexts / name, DEPLOY_DIR / name / "Dockerfile", {"BASE_IMAGE": base})
        _say(echo, f"image {ref}", "built", started)
    started = time.monotonic()
    stage_extra_ca()
    _build(
        podman,
        layout,
        images.app,
        PROJECT_ROOT,
        PROJECT_ROOT / "Dockerfile",
        {"PYTHON_IMAGE": base, "JDK_IMAGE": base, "JRE_IMAGE": base},
    )
    _say(echo, f"image {images.app}", "built", started)
    return images


# --- compose -------------------------------------------------------------------------------------------


def compose_argv(
    layout: StackLayout, project: str, env_file: Path, profiles: Sequence[str] = (), overrides: Sequence[Path] = ()
) -> list[str]:
    """docker-compose on the project's file plus deploy/compose.local.yml (the local images) and any overrides."""
    argv = [str(compose.compose_binary(layout)), "--project-directory", str(PROJECT_ROOT)]
    for file in (compose.COMPOSE_FILE, LOCAL_COMPOSE_FILE, *overrides):
        argv += ["-f", str(file)]
    argv += ["-p", project, "--env-file", str(env_file)]
    for profile in profiles:
        argv += ["--profile", profile]
    return argv


def compose_env(podman: Podman, images: Images) -> dict[str, str]:
    """The environment compose runs with: podman's socket, the local image names, and none of the generated
    variables (they come from the env file only, never from this process's environment)."""
    env = {k: v for k, v in podman.env().items() if k not in compose.GENERATED_VARS and not k.startswith("COMPOSE_")}
    return {**env, **images.env()}


# Every service of docker-compose.yml but Grafana (no registry serves a Grafana server here) and the profiles'.
CORE_SERVICES = ("minio", "minio-init", "kafka", "kafka-init", "ingest", "maintain", "prometheus")


@dataclass(frozen=True)
class Deployment:
    """One compose project on podman: its name, env file, the images it runs and any override files."""

    layout: StackLayout
    podman: Podman
    project: str
    env_file: Path
    images: Images
    overrides: tuple[Path, ...] = ()

    def argv(self, *args: str, profiles: Sequence[str] = ()) -> list[str]:
        return [*compose_argv(self.layout, self.project, self.env_file, profiles, self.overrides), *args]

    def compose(
        self, *args: str, profiles: Sequence[str] = (), timeout: float = 900, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run docker-compose ARGS against podman; with check, a failure raises a StackError with its output."""
        result = subprocess.run(
            self.argv(*args, profiles=profiles),
            env=compose_env(self.podman, self.images),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise StackError(
                f"`docker-compose {' '.join(args)}` exited {result.returncode}:\n{result.stderr[-4000:]}\n"
                f"Look at the services with `python -m stack deploy compose ps` and `... compose logs SERVICE`."
            )
        return result

    def up(self, *services: str, profiles: Sequence[str] = ()) -> None:
        """`up -d` from the local images, never pulling or building (build_images built them)."""
        self.compose("up", "-d", "--no-build", "--pull", "never", *services, profiles=profiles)

    def down(self, volumes: bool = False) -> None:
        self.compose("down", *(["--volumes"] if volumes else []), "--timeout", "120", profiles=("simulator",))

    def container(self, service: str) -> str:
        """The container id of one service (its first replica)."""
        ids = self.compose("ps", "-q", "--all", service).stdout.split()
        if not ids:
            raise StackError(f"service {service} of {self.project} has no container; is the deployment up?")
        return ids[0]

    def podman_cmd(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return podman_out(self.podman, *args, timeout=timeout)

    def inspect(self, service: str, fmt: str) -> str:
        """One field of a service's container, as `podman inspect --format FMT` prints it."""
        return self.podman_cmd("inspect", "--format", fmt, self.container(service)).stdout.strip()

    def health(self, service: str) -> str:
        """podman's health state of a service's container ('healthy', 'starting', 'unhealthy', '' without one)."""
        return self.inspect(service, "{{.State.Health.Status}}")

    def state(self, service: str) -> str:
        return self.inspect(service, "{{.State.Status}}")

    def simulator(self, out: Path, log: Path, *args: str) -> subprocess.Popen[str]:
        """A one-off run of the simulator profile's container: `sensor-sim ARGS`, with `out` mounted at /out (for
        its --summary-json) and the service's network alias, so Prometheus scrapes it. Its output goes to `log`."""
        argv = self.argv(
            "run", "--rm", "--no-deps", "--use-aliases", "-T", "-v", f"{out}:/out", "simulator", "sensor-sim", *args,
            profiles=("simulator",),
        )  # fmt: skip
        with log.open("w") as handle:
            return subprocess.Popen(
                argv, env=compose_env(self.podman, self.images), stdout=handle, stderr=subprocess.STDOUT, text=True
            )


# The ports a scratch deployment publishes on loopback (docker-compose.yml's defaults are the usual ones).
PUBLISHED_PORTS = ("MINIO_API_PORT", "MINIO_CONSOLE_PORT", "KAFKA_HOST_PORT", "PROMETHEUS_PORT")


@dataclass(frozen=True)
class Scratch:
    """A throwaway deployment: the project, its env file, the ports it publishes and its generated secrets."""

    deployment: Deployment
    env_file: Path
    topic: str
    ports: dict[str, int]
    secrets: dict[str, str] = field(repr=False)
    out: Path  # a folder the simulator's containers (uid 10001) write into

    def host_env(self) -> dict[str, str]:
        """IOTLAKE_* overrides for this machine's view of it: the published Kafka and MinIO, the read-only key."""
        return {
            "IOTLAKE_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{self.ports['KAFKA_HOST_PORT']}",
            "IOTLAKE_KAFKA__TOPIC": self.topic,
            "IOTLAKE_STORAGE__ENDPOINT": f"http://127.0.0.1:{self.ports['MINIO_API_PORT']}",
            "IOTLAKE_STORAGE__ACCESS_KEY": self.secrets[sec.READER_ACCESS_KEY],
            "IOTLAKE_STORAGE__SECRET_KEY": self.secrets[sec.READER_SECRET_KEY],
        }


@contextlib.contextmanager
def scratch_deployment(
    home: Path, topic: str, overrides: Sequence[Path] = (), echo: Echo | None = print
) -> Iterator[Scratch]:
    """A compose project of its own under `home`: the images built, fresh secrets, free loopback ports, the core
    services up (and healthchecks run) for the block; then its logs go to home/compose.log and it is torn down
    with its volumes."""
    layout = StackLayout(home=home, cache=default_cache())
    podman = Podman.at(layout)
    install_tools(echo)
    compose.install_compose(layout, echo)
    write_conf(podman)
    images = build_images(podman, layout, echo)
    env_file = home / "deploy.env"
    compose.write_env(env_file)
    ports: dict[str, int] = {}
    for name in PUBLISHED_PORTS:
        ports[name] = free_port(set(ports.values()))
    with env_file.open("a") as f:  # later lines win
        f.write("".join(f"{k}={v}\n" for k, v in ports.items()))
        f.write(f"KAFKA_TOPIC={topic}\n")
    out = home / "out"
    out.mkdir(exist_ok=True)
    out.chmod(0o777)  # the simulator's containers run as uid 10001
    secrets = compose.read_secret_files(compose.secrets_dir(env_file))
    project = f"iotlake-{home.name}-{os.urandom(4).hex()}".lower()
    deployment = Deployment(layout, podman, project, env_file, images, tuple(overrides))
    with api_service(podman), health_ticker(podman, project):
        try:
            deployment.up(*CORE_SERVICES)
            yield Scratch(deployment, env_file, topic, ports, secrets, out)
        finally:
            logs = deployment.compose("logs", "--no-color", "--timestamps", check=False, profiles=("simulator",))
            (home / "compose.log").write_text(logs.stdout + logs.stderr)
            if echo is not None:
                echo(f"compose logs: {home / 'compose.log'}")
            deployment.down(volumes=True)


def _deploy_build(args: argparse.Namespace) -> int:
    layout = StackLayout.default()
    podman = Podman.at(layout)
    install_tools()
    write_conf(podman)
    print(build_images(podman, layout))
    return 0


def _deploy_compose(args: argparse.Namespace) -> int:
    layout = StackLayout.default()
    podman = Podman.at(layout)
    compose.install_compose(layout)
    write_conf(podman)
    deployment = Deployment(layout, podman, args.project, Path(args.env_file), local_images())
    # The healthchecks run while compose does: a `depends_on: service_healthy` needs them where there is no systemd.
    with api_service(podman), health_ticker(podman, args.project):
        return subprocess.run(
            deployment.argv(*args.args), env=compose_env(podman, deployment.images), check=False
        ).returncode


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    deploy = sub.add_parser("deploy", help="the compose deployment on podman: build the images, run compose")
    verbs = deploy.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs.add_parser(
        "build", help="install podman/runc/mmdebstrap if missing; build the local base and every image"
    ).set_defaults(func=_deploy_build)
    run = verbs.add_parser("compose", help="docker-compose ARGS on podman, with the local images")
    run.add_argument("--project", default="iotlake", help="compose project name (default: iotlake)")
    run.add_argument("--env-file", default=".env", help="the env file `make secrets` wrote (default: .env)")
    run.add_argument("args", nargs=argparse.REMAINDER, help="e.g. up -d minio kafka ... / ps / logs ingest")
    run.set_defaults(func=_deploy_compose)


@contextlib.contextmanager
def health_ticker(podman: Podman, project: str, tick: float = 2.0) -> Iterator[None]:
    """Run each healthcheck of the project's containers at its interval, for the block.

    podman schedules healthchecks with systemd timers; without systemd (containers, CI runners, this
    machine) nothing runs them and a `depends_on: service_healthy` waits forever. This does what the timers
    do: `podman healthcheck run` per container, every `Interval` of its healthcheck.
    """
    stop = threading.Event()
    due: dict[str, float] = {}
    intervals: dict[str, float | None] = {}  # container id -> its healthcheck's interval (None: it has none)

    def interval(cid: str) -> float | None:
        spec = podman_out(podman, "inspect", "--format", "{{json .Config.Healthcheck}}", cid).stdout.strip()
        check = json.loads(spec) if spec.startswith("{") else None
        if check and check.get("Test") and check["Test"][0] != "NONE":
            return max(1.0, (check.get("Interval") or 30_000_000_000) / 1e9)
        return None

    def containers() -> dict[str, float]:
        """The project's running containers that have a healthcheck (each inspected once)."""
        out = podman_out(podman, "ps", "-q", "--filter", f"label=com.docker.compose.project={project}")
        found: dict[str, float] = {}
        for cid in out.stdout.split():
            if cid not in intervals:
                intervals[cid] = interval(cid)
            every = intervals[cid]
            if every is not None:
                found[cid] = every
        return found

    def loop() -> None:
        while not stop.wait(tick):
            now = time.monotonic()
            for cid, every in containers().items():
                if due.setdefault(cid, now) <= now:
                    due[cid] = now + every
                    podman_out(podman, "healthcheck", "run", cid)

    thread = threading.Thread(target=loop, name="health-ticker", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=150)
