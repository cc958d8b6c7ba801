"""A Spark standalone cluster on loopback: one master and one worker, run by the pyspark package's own
`bin/spark-class`, so the ingest job runs on executors unchanged (spark.master = spark://127.0.0.1:PORT).

Ports: the master on spark_cluster.master_port, its web UI (and /json/ status) on spark_cluster.webui_port;
the worker's own RPC and UI ports are picked at random, on loopback too. Pid files in <home>/run, logs in
<home>/logs (spark-master.log, spark-worker.log), executor logs in <home>/spark/work/<app-id>/<executor>/.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from stack import proc
from stack.addresses import HostPort
from stack.layout import StackLayout
from stack.secrets import write_private
from streaming.core import http
from streaming.core.config import Settings
from streaming.core.errors import StackError

HOST = "127.0.0.1"
DAEMON_MEMORY = "512m"  # heap of the master and of the worker daemon; executors get spark.executor.memory
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
SETTING = "spark_cluster.master_port / spark_cluster.webui_port (IOTLAKE_SPARK_CLUSTER__MASTER_PORT, ...)"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

# Written to <home>/spark/<role>.conf (mode 0600: it holds the auth secret) and passed with --properties-file
# (which also marks our processes). Both also get spark.authenticate and its secret (auth_properties).
MASTER_PROPERTIES = {
    "spark.master.rest.enabled": "false",  # no REST submission server (it would listen on 6066)
}
WORKER_PROPERTIES = {
    # Delete the dirs of finished applications (executor logs; the jars too, for a driver that sends them:
    # ~750 MB without spark.preinstalled_jars) after a day (Spark's default: 7 days).
    "spark.worker.cleanup.enabled": "true",
    "spark.worker.cleanup.appDataTtl": str(24 * 3600),
}


@dataclass(frozen=True)
class Cluster:
    """The running cluster: pids, whether they were running already, and where to reach it."""

    master_pid: int
    worker_pid: int
    reused: bool
    master_url: str
    webui_url: str


def spark_home() -> Path:
    """The pyspark package (found, not imported): it carries bin/spark-class and every jar the daemons need."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise StackError("The pyspark package is not installed. Run `make install`.")
    return Path(spec.origin).resolve().parent


def spark_class() -> Path:
    path = spark_home() / "bin" / "spark-class"
    if not os.access(path, os.X_OK):
        raise StackError(
            f"{path} is missing or not executable; the pyspark package is incomplete. Reinstall it with "
            "`make install` (or `pip install --force-reinstall pyspark`)."
        )
    return path


def master_address(settings: Settings) -> HostPort:
    return HostPort(HOST, settings.spark_cluster.master_port)


def webui_address(settings: Settings) -> HostPort:
    return HostPort(HOST, settings.spark_cluster.webui_port)


def master_url(settings: Settings) -> str:
    return f"spark://{master_address(settings)}"


def webui_url(settings: Settings) -> str:
    return f"http://{webui_address(settings)}"


def job_env(settings: Settings) -> dict[str, str]:
    """The environment overrides that point `iotlake ingest` at this cluster, its driver on loopback too."""
    return {
        "IOTLAKE_SPARK__MASTER": master_url(settings),
        # The worker is on this host: its executors load the jars from the same Ivy cache, nothing is copied.
        "IOTLAKE_SPARK__PREINSTALLED_JARS": "true",
        "IOTLAKE_SPARK__CONF__spark.driver.host": HOST,
        "IOTLAKE_SPARK__CONF__spark.driver.bindAddress": HOST,
    }


def master_service(layout: StackLayout) -> proc.Service:
    return proc.Service(
        name="spark-master",
        pidfile=layout.pidfile("spark-master"),
        log=layout.log("spark-master"),
        marker=str(layout.spark_home / "master.conf"),
    )


def worker_service(layout: StackLayout) -> proc.Service:
    return proc.Service(
        name="spark-worker",
        pidfile=layout.pidfile("spark-worker"),
        log=layout.log("spark-worker"),
        marker=str(layout.spark_home / "worker.conf"),
    )


def work_dir(layout: StackLayout) -> Path:
    """Where the worker runs executors: <work_dir>/<app-id>/<executor-id>/{stdout,stderr}."""
    return layout.spark_home / "work"


def master_argv(settings: Settings, layout: StackLayout) -> list[str]:
    return [
        str(spark_class()),
        MASTER_CLASS,
        "--host",
        HOST,
        "--port",
        str(settings.spark_cluster.master_port),
        "--webui-port",
        str(settings.spark_cluster.webui_port),
        "--properties-file",
        str(layout.spark_home / "master.conf"),
    ]


def worker_argv(settings: Settings, layout: StackLayout) -> list[str]:
    c = settings.spark_cluster
    return [
        str(spark_class()),
        WORKER_CLASS,
        "--host",
        HOST,
        "--cores",
        str(c.worker_cores),
        "--memory",
        c.worker_memory,
        "--webui-port",
        "0",  # random free port: the UI is reachable through the master's
        "--work-dir",
        str(work_dir(layout)),
        "--properties-file",
        str(layout.spark_home / "worker.conf"),
        master_url(settings),
    ]


# The container entry point's source of the secret (docker-compose.yml sets it from .env); the daemon never gets it.
AUTH_SECRET_ENV = "IOTLAKE_SPARK__AUTH_SECRET"
AUTH_SECRET_FILE_ENV = "IOTLAKE_SPARK_AUTH_SECRET_FILE"  # compose: the mounted secret file
ROLE_CLASSES = {"master": MASTER_CLASS, "worker": WORKER_CLASS}
ROLE_PROPERTIES = {"master": MASTER_PROPERTIES, "worker": WORKER_PROPERTIES}


def write_role_properties(path: Path, role: str, secret: str) -> None:
    """A daemon's 0600 properties file: its role's settings plus spark.authenticate and the secret."""
    _write_properties(path, {**ROLE_PROPERTIES[role], **auth_properties(secret)})


def container_daemon(
    role: str, args: Sequence[str], env: Mapping[str, str], folder: Path
) -> tuple[list[str], dict[str, str]]:
    """The compose spark-master / spark-worker command: (argv, environment) for spark-class with
    spark.authenticate on, its secret (from the environment, or the file compose mounts) copied into a 0600
    properties file in `folder`.

    The secret is on no command line and not in the daemon's environment; the worker hands it to its
    executors as Spark does. Without a secret the daemon does not start: it would run any local user's code.
    """
    secret = env.get(AUTH_SECRET_ENV) or _read_secret(env.get(AUTH_SECRET_FILE_ENV))
    if not secret:
        raise StackError(
            f"Neither {AUTH_SECRET_ENV} nor {AUTH_SECRET_FILE_ENV} (a file holding the secret) is set: the Spark "
            f"{role} refuses to run without spark.authenticate. Run `make secrets` (it generates the secrets "
            "folder compose mounts) and start the spark-cluster profile again."
        )
    path = folder / f"{role}.conf"
    write_role_properties(path, role, secret)
    argv = [str(spark_class()), ROLE_CLASSES[role], "--properties-file", str(path), *args]
    return argv, {k: v for k, v in env.items() if k not in (AUTH_SECRET_ENV, AUTH_SECRET_FILE_ENV)}


def _read_secret(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError as e:
        raise StackError(f"{AUTH_SECRET_FILE_ENV}={path} can't be read ({e.strerror}); run `make secrets`.") from e


def exec_container_daemon(role: str, args: Sequence[str]) -> NoReturn:
    """Replace this process with the authenticated Spark daemon (container_daemon)."""
    folder = Path(tempfile.mkdtemp(prefix="iotlake-spark-"))  # mode 0700
    try:
        argv, env = container_daemon(role, args, os.environ, folder)
    except StackError:
        folder.rmdir()
        raise
    os.execve(argv[0], argv, env)


def daemon_env(layout: StackLayout, java: Path) -> dict[str, str]:
    """The daemons' environment: loopback only, small heaps, no SPARK_* settings leaking in from the shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(
        JAVA_HOME=str(java.resolve().parent.parent),
        SPARK_LOCAL_IP=HOST,  # the web UIs bind here instead of 0.0.0.0
        SPARK_DAEMON_MEMORY=DAEMON_MEMORY,
        SPARK_CONF_DIR=str(layout.spark_home / "conf"),  # empty: nothing from the pyspark package's conf
        SPARK_LOCAL_DIRS=str(layout.spark_home / "local"),  # executors' scratch space
    )
    return env


def auth_properties(secret: str) -> dict[str, str]:
    """Shared-secret authentication of every connection: the master and the worker refuse a driver (any local
    user's code) that doesn't hold the secret. The worker hands it to its executors in their environment."""
    return {"spark.authenticate": "true", "spark.authenticate.secret": secret}


def _write_properties(path: Path, props: dict[str, str]) -> None:
    lines = ["# Generated by iotlake (stack/spark_cluster.py) at each start; edits are overwritten."]
    write_private(path, "\n".join([*lines, *(f"{k} {v}" for k, v in props.items())]) + "\n")


def master_json(settings: Settings, timeout: float = 2.0) -> dict[str, Any] | None:
    """The master's status (workers, apps) from GET /json/ on its web UI; None if it doesn't answer."""
    data = http.get_json(f"{webui_url(settings)}/json/", timeout)
    return data if isinstance(data, dict) else None


def alive_workers(settings: Settings) -> int:
    info = master_json(settings)
    return int(info.get("aliveworkers", 0)) if info and info.get("status") == "ALIVE" else 0


def check_can_start(settings: Settings, layout: StackLayout) -> bool:
    """True if our master and worker run already with these settings; else check the master's ports are free.

    A master or worker of this layout that runs with other settings is an error naming the fix.
    """
    master_pid = proc.read_pid(master_service(layout))
    worker_pid = proc.read_pid(worker_service(layout))
    for name, pid, argv in (
        ("master", master_pid, master_argv(settings, layout)),
        ("worker", worker_pid, worker_argv(settings, layout)),
    ):
        cmdline = proc.cmdline(pid) if pid is not None else None
        if cmdline is not None and " ".join(argv[1:]) not in cmdline:
            raise StackError(
                f"The Spark {name} is already running (pid {pid}) with other settings than now "
                f"(spark_cluster.*). Stop it with `python -m stack down`, then run "
                "`python -m stack up --cluster` again."
            )
    if master_pid is not None:
        return worker_pid is not None
    if worker_pid is not None:
        raise StackError(
            f"A Spark worker runs (pid {worker_pid}) without its master. Stop it with `python -m stack down`, "
            "then run `python -m stack up --cluster` again."
        )
    proc.require_free_ports(
        "the Spark master", {"master": master_address(settings), "web UI": webui_address(settings)}, SETTING
    )
    return False


def start(
    settings: Settings, layout: StackLayout, java: Path, auth_secret: str, timeout: float = START_TIMEOUT_S
) -> Cluster:
    """Start the master, wait for its /json/ to answer, start the worker, wait until it is registered.

    Both authenticate every connection with `auth_secret` (drivers get it through streaming.core.session).
    Reuses a master and worker of this layout that run with the same settings.
    """
    reused = check_can_start(settings, layout)
    spark_dir = layout.spark_home
    for d in (spark_dir / "conf", spark_dir / "local", work_dir(layout)):
        d.mkdir(parents=True, exist_ok=True)
    layout.make_dirs()
    for role in ROLE_PROPERTIES:
        write_role_properties(spark_dir / f"{role}.conf", role, auth_secret)
    env = daemon_env(layout, java)

    master_svc, worker_svc = master_service(layout), worker_service(layout)
    master_pid = proc.read_pid(master_svc)
    if master_pid is None:
        master_pid = proc.start(master_svc, master_argv(settings, layout), env=env, cwd=spark_dir)
    proc.wait_ready(
        master_svc, master_pid, lambda: master_json(settings) is not None, timeout, f"GET {webui_url(settings)}/json/"
    )
    worker_pid = proc.read_pid(worker_svc)
    if worker_pid is None:
        worker_pid = proc.start(worker_svc, worker_argv(settings, layout), env=env, cwd=spark_dir)
    proc.wait_ready(
        worker_svc,
        worker_pid,
        lambda: alive_workers(settings) >= 1,
        timeout,
        f"the master at {master_url(settings)} lists an alive worker",
    )
    return Cluster(master_pid, worker_pid, reused, master_url(settings), webui_url(settings))


def stop(layout: StackLayout, timeout: float = STOP_TIMEOUT_S) -> tuple[int | None, int | None]:
    """Stop the worker (with its executors: same process group) and then the master. Returns their pids."""
    return proc.stop(worker_service(layout), timeout), proc.stop(master_service(layout), timeout)


def status(settings: Settings, layout: StackLayout) -> dict[str, Any]:
    """State, pids, addresses and logs of the master and the worker."""
    master_pid = proc.read_pid(master_service(layout))
    worker_pid = proc.read_pid(worker_service(layout))
    info = master_json(settings) if master_pid is not None else None
    alive = int(info.get("aliveworkers", 0)) if info else 0

    def state(pid: int | None, ok: bool) -> str:
        return "stopped" if pid is None else ("running" if ok else "not answering")

    return {
        "spark-master": {
            "state": state(master_pid, info is not None),
            "pid": master_pid,
            "address": master_url(settings),
            "console": f"{webui_url(settings)}",
            "log": str(master_service(layout).log),
        },
        "spark-worker": {
            "state": state(worker_pid, alive >= 1),
            "pid": worker_pid,
            "address": f"{settings.spark_cluster.worker_cores} core(s), {settings.spark_cluster.worker_memory}",
            "work_dir": str(work_dir(layout)),
            "log": str(worker_service(layout).log),
        },
    }
