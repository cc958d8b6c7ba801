"""Kafka (KRaft) on loopback: node 1 broker + controller, optionally node 2 broker only; idempotent topics.

With kafka.sasl_listener_port, node 1 also offers a SASL_PLAINTEXT listener (mechanism PLAIN) for user
SASL_USER, whose password is generated into the secrets file; server.properties, which holds it, is mode 0600.
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from stack import proc
from stack import secrets as sec
from stack.addresses import MAX_KAFKA_NODES, HostPort, bind_host, kafka_controller, kafka_listeners
from stack.install import Installed
from stack.layout import StackLayout
from streaming.core.config import Settings
from streaming.core.errors import ServiceUnreachableError, StackError

HEAP = "-Xmx512m"
MESSAGE_MAX_BYTES = 2 * 1024 * 1024
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
SETTING = "kafka.bootstrap_servers (IOTLAKE_KAFKA__BOOTSTRAP_SERVERS)"
SASL_SETTING = "kafka.sasl_listener_port (IOTLAKE_KAFKA__SASL_LISTENER_PORT)"
SASL_LISTENER = "SASL"
SASL_USER = "iotlake"
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


def _quiet_logger() -> logging.Logger:
    """librdkafka logs every refused connection while a broker starts; probes don't want that noise."""
    logger = logging.getLogger("stack.kafka.probe")
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


def admin_client(bootstrap_servers: str, quiet: bool = True) -> AdminClient:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "socket.timeout.ms": 5000}
    if quiet:
        conf["logger"] = _quiet_logger()
    return AdminClient(conf)


@dataclass(frozen=True)
class Node:
    """One Kafka node of the native stack, for one address of kafka.bootstrap_servers.

    Node 1 is broker + controller, the quorum's only voter. Node 2 (when a second address is listed) is a
    broker only: losing it leaves the quorum whole, so the cluster keeps a controller and elects new
    leaders for its partitions (a two-voter quorum would stop when either voter dies).
    """

    node_id: int
    listener: HostPort
    controller: HostPort  # node 1's controller listener (broker port + 1)
    home: Path
    count: int  # how many nodes the stack runs

    @property
    def name(self) -> str:
        return "kafka" if self.node_id == 1 else f"kafka-{self.node_id}"

    @property
    def is_controller(self) -> bool:
        return self.node_id == 1

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def properties_path(self) -> Path:
        return self.home / "server.properties"


def node_home(layout: StackLayout, node_id: int) -> Path:
    """Node 1 keeps the one-node layout (home/kafka); node N lives in home/kafka-N."""
    return layout.kafka_home if node_id == 1 else layout.home / f"kafka-{node_id}"


def nodes(settings: Settings, layout: StackLayout) -> list[Node]:
    """The nodes the settings ask for: one per address in kafka.bootstrap_servers (one or two)."""
    listeners = kafka_listeners(settings.kafka.bootstrap_servers)
    controller = kafka_controller(listeners[0])
    return [
        Node(i, listener, controller, node_home(layout, i), len(listeners))
        for i, listener in enumerate(listeners, start=1)
    ]


def sasl_listener(settings: Settings) -> HostPort | None:
    """Node 1's SASL_PLAINTEXT listener (kafka.sasl_listener_port on node 1's host), or None when not asked for."""
    port = settings.kafka.sasl_listener_port
    if not port:
        return None
    listeners = kafka_listeners(settings.kafka.bootstrap_servers)
    if len(listeners) > 1:
        raise StackError(
            f"{SASL_SETTING}: the SASL listener is offered only on a one-node stack (clients of a listener must "
            "reach every broker through it). List one broker in kafka.bootstrap_servers, or set the port to 0."
        )
    if port in {listener.port for listener in listeners}:
        raise StackError(f"kafka.sasl_listener_port {port} is a broker port. Give the SASL listener a port of its own.")
    if port == kafka_controller(listeners[0]).port:
        raise StackError(
            f"kafka.sasl_listener_port {port} is the controller port (broker port + 1). Give the SASL listener "
            "a port of its own."
        )
    return HostPort(listeners[0].host, port)


def jaas_quote(value: str) -> str:
    """A JAAS option value in double quotes, backslash-escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def server_properties(
    settings: Settings, layout: StackLayout, node_id: int = 1, sasl_password: str | None = None
) -> str:
    """server.properties of one KRaft node on loopback (node 1: broker + controller on broker port + 1;
    node 2: broker only, voting with node 1's controller).

    With kafka.sasl_listener_port, node 1 also listens for SASL_PLAINTEXT; its PLAIN user SASL_USER is written
    only when `sasl_password` is given (comparing the addresses of a running node doesn't need it).
    """
    node = nodes(settings, layout)[node_id - 1]
    host = bind_host(node.listener)
    controller_host = bind_host(node.controller)
    listeners = f"PLAINTEXT://{host}:{node.listener.port}"
    advertised = f"PLAINTEXT://{node.listener}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    sasl = sasl_listener(settings) if node.is_controller else None
    if node.is_controller:
        listeners += f",CONTROLLER://{controller_host}:{node.controller.port}"
    if sasl is not None:
        listeners += f",{SASL_LISTENER}://{bind_host(sasl)}:{sasl.port}"
        advertised += f",{SASL_LISTENER}://{sasl}"
        protocols += f",{SASL_LISTENER}:SASL_PLAINTEXT"
    replicas = str(node.count)  # internal topics on every node, so they survive losing node 2
    props = {
        "process.roles": "broker,controller" if node.is_controller else "broker",
        "node.id": str(node.node_id),
        "controller.quorum.voters": f"1@{controller_host}:{node.controller.port}",
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": protocols,
        "log.dirs": str(node.data),
        "num.partitions": str(settings.kafka.partitions),
        "auto.create.topics.enable": "false",
        "message.max.bytes": str(MESSAGE_MAX_BYTES),
        # Internal topics get one replica per node; one in-sync replica is enough to keep working.
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": "6",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    if sasl is not None:
        props["sasl.enabled.mechanisms"] = "PLAIN"
        if sasl_password is not None:
            user = f"user_{SASL_USER}={jaas_quote(sasl_password)}"
            props[f"listener.name.{SASL_LISTENER.lower()}.plain.sasl.jaas.config"] = (
                f"{PLAIN_LOGIN_MODULE} required {user};"
            )
    lines = ["# Generated by `python -m stack up` from the iotlake settings; edits are overwritten."]
    lines += [f"{k}={_properties_value(v)}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


def _properties_value(value: str) -> str:
    """A value as java.util.Properties reads it back (backslash is its escape character)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


ADDRESS_KEYS = ("listeners", "advertised.listeners", "controller.quorum.voters", "log.dirs")


def _parse_properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def node_service(layout: StackLayout, node_id: int) -> proc.Service:
    """The process of one node: pid file run/<name>.pid, stdout in logs/<name>.out, log4j in logs/<name>.log."""
    name = "kafka" if node_id == 1 else f"kafka-{node_id}"
    return proc.Service(
        name=name,
        pidfile=layout.pidfile(name),
        log=layout.logs / f"{name}.out",
        marker=str(node_home(layout, node_id) / "server.properties"),
        extra_logs=(layout.log(name),),
    )


def service(layout: StackLayout) -> proc.Service:
    """Node 1's process (the only one of a one-node stack)."""
    return node_service(layout, 1)


def running_nodes(layout: StackLayout) -> dict[int, int]:
    """Node id -> pid of every node of this layout that runs now."""
    found = {}
    for node_id in range(1, MAX_KAFKA_NODES + 1):
        pid = proc.read_pid(node_service(layout, node_id))
        if pid is not None:
            found[node_id] = pid
    return found


def new_cluster_id() -> str:
    """A Kafka cluster id: a random UUID in URL-safe base64 without padding (never starting with '-')."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _cluster_id(layout: StackLayout) -> str:
    """The cluster id kept in home (made once, shared by every node)."""
    path = layout.kafka_home / "cluster.id"
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    cid = new_cluster_id()
    path.write_text(cid + "\n")
    return cid


def _jvm(inst: Installed, layout: StackLayout, heap: str, name: str = "kafka") -> list[str]:
    return [
        str(inst.java),
        heap,
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        f"-Dkafka.logs.dir={layout.logs}",
        f"-Diotlake.kafka.log={name}",
        f"-Dlog4j2.configurationFile={layout.kafka_home / 'log4j2.xml'}",
        "-cp",
        inst.kafka_classpath,
    ]


def _prepare(
    settings: Settings, layout: StackLayout, inst: Installed, node: Node, sasl_password: str | None = None
) -> Path:
    """Write the node's server.properties (mode 0600: it may hold the SASL user's password) and log4j2.xml
    into home/kafka; format its storage once."""
    layout.make_dirs()
    node.data.mkdir(parents=True, exist_ok=True)
    props = node.properties_path
    if node.is_controller and sasl_listener(settings) is not None and not sasl_password:
        raise StackError(
            f"{SASL_SETTING} asks for a SASL listener but no password was given for it. Start the stack with "
            f"`python -m stack up`, which generates {sec.KAFKA_SASL_PASSWORD} into the secrets file."
        )
    sec.write_private(props, server_properties(settings, layout, node.node_id, sasl_password))
    (layout.kafka_home / "log4j2.xml").write_bytes(
        resources.files("stack").joinpath("resources", "kafka-log4j2.xml").read_bytes()
    )
    if not (node.data / "meta.properties").exists():
        proc.run_checked(
            [
                *_jvm(inst, layout, "-Xmx256m", node.name),
                "kafka.tools.StorageTool",
                "format",
                "-t",
                _cluster_id(layout),
                "-c",
                str(props),
                "--ignore-formatted",
            ],
            what=f"Formatting the Kafka storage of {node.name}",
            fix=f"Check {node.data} is writable; to start afresh, run `python -m stack down` and delete it.",
            timeout=120,
            log=layout.logs / f"{node.name}-format.log",
            umask=proc.PRIVATE_UMASK,
        )
    return props


def answers(bootstrap_servers: str, timeout: float = 1.0, brokers: int = 1) -> bool:
    """True if a broker answers a metadata request listing at least `brokers` brokers."""
    try:
        md = admin_client(bootstrap_servers).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return len(md.brokers) >= brokers


def check_can_start(settings: Settings, layout: StackLayout) -> int | None:
    """The pid of our running node 1 (same settings), or None after checking the ports of every node are free.

    Every node is checked: one that runs with other addresses, or runs although the settings no longer
    list it, is an error naming the fix; a node that doesn't run must find its ports free.
    """
    wanted_nodes = nodes(settings, layout)
    running = running_nodes(layout)
    extra = sorted(set(running) - {n.node_id for n in wanted_nodes})
    if extra:
        raise StackError(
            f"Kafka node(s) {extra} run (pid {', '.join(str(running[i]) for i in extra)}) but "
            f"kafka.bootstrap_servers lists {len(wanted_nodes)} broker(s). Stop the stack with "
            "`python -m stack down`, then run `python -m stack up` again."
        )
    for node in wanted_nodes:
        pid = running.get(node.node_id)
        if pid is not None:
            props_path = node.properties_path
            current = _parse_properties(props_path.read_text()) if props_path.exists() else {}
            wanted = _parse_properties(server_properties(settings, layout, node.node_id))
            changed = sorted(k for k in ADDRESS_KEYS if current and current.get(k) != wanted[k])
            if changed:
                raise StackError(
                    f"Kafka {node.name} is already running (pid {pid}) with other addresses than the settings "
                    f"ask for ({', '.join(f'{k}={current.get(k)}' for k in changed)}). Stop it with "
                    "`python -m stack down`, then run `python -m stack up` again."
                )
            continue
        ports = {"broker": node.listener}
        if node.is_controller:
            ports["controller"] = node.controller
        sasl = sasl_listener(settings) if node.is_controller else None
        if sasl is not None:
            ports["SASL"] = sasl
        setting = SETTING if sasl is None else f"{SETTING} and {SASL_SETTING}"
        proc.require_free_ports(f"Kafka {node.name}", ports, setting)
    return running.get(1)


def launch(
    settings: Settings, layout: StackLayout, inst: Installed, sasl_password: str | None = None
) -> tuple[int, bool]:
    """Start every node detached unless it already runs (node 1 first: it holds the quorum).

    `sasl_password` (from the secrets file) is needed when kafka.sasl_listener_port is set; it goes into the
    0600 server.properties, never onto a command line. Returns node 1's (pid, reused); `wait_ready` then
    waits for all nodes.
    """
    check_can_start(settings, layout)
    first: tuple[int, bool] | None = None
    for node in nodes(settings, layout):
        svc = node_service(layout, node.node_id)
        pid = proc.read_pid(svc)
        reused = pid is not None
        if pid is None:
            props = _prepare(settings, layout, inst, node, sasl_password)
            argv = [*_jvm(inst, layout, HEAP, node.name), "kafka.Kafka", str(props)]
            pid = proc.start(svc, argv, cwd=node.home)
        if first is None:
            first = (pid, reused)
    assert first is not None  # nodes() returns at least one
    return first


def wait_ready(settings: Settings, layout: StackLayout, pid: int, timeout: float = START_TIMEOUT_S) -> float:
    """Wait until node 1 (`pid`) answers metadata requests, then until every other node has registered
    (each answers on its own listener and node 1 lists them all); seconds waited."""
    all_nodes = nodes(settings, layout)
    started = time.monotonic()
    for node in all_nodes:
        svc = node_service(layout, node.node_id)
        node_pid = pid if node.node_id == 1 else proc.read_pid(svc)
        if node_pid is None:
            raise StackError(f"Kafka {node.name} is not running. Start the stack with `python -m stack up`.")
        listener = str(node.listener)

        def registered(bootstrap: str = listener) -> bool:
            return answers(bootstrap, brokers=len(all_nodes))

        left = max(1.0, timeout - (time.monotonic() - started))
        what = f"metadata on {listener} listing {len(all_nodes)} broker(s)"
        proc.wait_ready(svc, node_pid, registered, left, what)
    return time.monotonic() - started


def stop(layout: StackLayout, timeout: float = STOP_TIMEOUT_S) -> int | None:
    """Stop every node of this layout (brokers first, node 1 last). Returns node 1's pid if it ran."""
    for node_id in range(MAX_KAFKA_NODES, 1, -1):
        proc.stop(node_service(layout, node_id), timeout)
    return proc.stop(service(layout), timeout)


def address(settings: Settings) -> HostPort:
    """Node 1's broker listener (validates every address of kafka.bootstrap_servers)."""
    return kafka_listeners(settings.kafka.bootstrap_servers)[0]


def ensure_topic(
    settings: Settings,
    topic: str | None = None,
    partitions: int | None = None,
    timeout: float = 60.0,
    replication_factor: int | None = None,
    min_insync_replicas: int = 1,
    config: Mapping[str, str] | None = None,
) -> int:
    """Create the topic (default: settings.kafka.topic with settings.kafka.partitions) unless it exists,
    then wait until every partition has a leader in the metadata of every broker listed in bootstrap_servers.
    Returns the topic's partition count.

    KRaft answers CreateTopics once the controller has committed the topic; each broker applies it a moment
    later. Until then, a request that reaches that broker (a producer's metadata, DescribeConfigs) gets
    UNKNOWN_TOPIC_OR_PART. A fresh client with one bootstrap address asks that broker first.

    `replication_factor` defaults to one replica per broker listed in kafka.bootstrap_servers (at most
    3). `min_insync_replicas` 1 lets producers with acks=all carry on while a single replica is left.
    `config` adds topic configs (e.g. max.message.bytes) to a topic this call creates.
    """
    topic = topic or settings.kafka.topic
    partitions = partitions or settings.kafka.partitions
    bootstrap = settings.kafka.bootstrap_servers
    brokers = [b.strip() for b in bootstrap.split(",") if b.strip()]
    if replication_factor is None:
        replication_factor = min(3, len(brokers))
    admin = admin_client(bootstrap)
    deadline = time.monotonic() + timeout
    new_topic = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config={"min.insync.replicas": str(min_insync_replicas), **(config or {})},
    )
    future = admin.create_topics(
        [new_topic],
        operation_timeout=max(1.0, timeout / 2),
        request_timeout=timeout,
    )[topic]
    try:
        future.result(timeout=timeout)
    except KafkaException as e:
        err = e.args[0]
        if not (isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS):
            raise _topic_error(topic, bootstrap, err) from e
    except Exception as e:  # timeouts of the future
        raise ServiceUnreachableError(
            f"Creating Kafka topic {topic!r} on {bootstrap} got no answer within {timeout:.0f}s ({e}). "
            "Is the broker up? Start it with `python -m stack up` or fix kafka.bootstrap_servers."
        ) from e
    pending = brokers if len(brokers) > 1 else []
    while True:
        count = _leaders_ready(admin, topic)
        pending = [b for b in pending if not _leaders_ready(admin_client(b), topic)]
        if count and not pending:
            return count
        if time.monotonic() >= deadline:
            where = f" in the metadata of {', '.join(pending)}" if count else ""
            raise StackError(
                f"Kafka topic {topic!r} exists on {bootstrap} but not all its partitions have a leader{where} "
                f"after {timeout:.0f}s. Check the broker log (python -m stack status shows where)."
            )
        time.sleep(0.1)


def _leaders_ready(admin: AdminClient, topic: str) -> int:
    try:
        md = admin.list_topics(topic=topic, timeout=2).topics.get(topic)
    except KafkaException:
        return 0
    if md is None or md.error is not None or not md.partitions:
        return 0
    if all(p.leader >= 0 and p.error is None for p in md.partitions.values()):
        return len(md.partitions)
    return 0


def _topic_error(topic: str, bootstrap: str, err: object) -> StackError:
    return StackError(
        f"Kafka refused to create topic {topic!r} on {bootstrap}: {err}. Check the topic name "
        "(letters, digits, '.', '_', '-') and that kafka.partitions is valid."
    )
