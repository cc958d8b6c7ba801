"""Host and port parsing for the services the stack runs on loopback."""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from streaming.core.errors import StackError

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost"})


@dataclass(frozen=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def _port(text: str, where: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise StackError(f"{where}: port {text!r} is not a number. Use host:port, e.g. 127.0.0.1:9092.") from None
    if not 1 <= port <= 65534:
        raise StackError(f"{where}: port {port} is out of range; use 1..65534 (the next port is used too).")
    return port


def _require_loopback(host: str, where: str) -> None:
    if host not in LOOPBACK_HOSTS and not host.startswith("127."):
        raise StackError(
            f"{where}: host {host!r} is not loopback. The native stack only runs services on this machine; "
            "use 127.0.0.1 (or localhost), or point the pipeline at your own services and skip `stack up`."
        )


MAX_KAFKA_NODES = 2


def _kafka_server(text: str, where: str) -> HostPort:
    server = text.strip()
    if "://" in server:
        server = server.split("://", 1)[1]
    host, sep, port = server.rpartition(":")
    if not sep or not host:
        raise StackError(f"{where}: {server!r} is not host:port. Use e.g. 127.0.0.1:9092.")
    _require_loopback(host, where)
    return HostPort(host, _port(port, where))


def kafka_listener(bootstrap_servers: str) -> HostPort:
    """The broker listener of node 1: the first host:port of kafka.bootstrap_servers (must be loopback)."""
    return _kafka_server(bootstrap_servers.split(",")[0], "kafka.bootstrap_servers")


def kafka_listeners(bootstrap_servers: str) -> list[HostPort]:
    """One broker listener per host:port of kafka.bootstrap_servers: the native stack runs one Kafka node
    for each (node 1 broker + controller, node 2 broker only). At most MAX_KAFKA_NODES, all loopback."""
    where = "kafka.bootstrap_servers"
    servers = [_kafka_server(part, where) for part in bootstrap_servers.split(",") if part.strip()]
    if len(servers) > MAX_KAFKA_NODES:
        raise StackError(
            f"{where}: {len(servers)} brokers listed; the native stack runs at most {MAX_KAFKA_NODES} "
            "(node 1 broker + controller, node 2 broker only). List one or two loopback addresses."
        )
    ports = [s.port for s in servers] + [kafka_controller(servers[0]).port] if servers else []
    if len(set(ports)) < len(ports):
        raise StackError(
            f"{where}: {bootstrap_servers!r} uses a port twice (node 1's controller listens on its broker "
            "port + 1). Give each broker its own port, e.g. 127.0.0.1:9092,127.0.0.1:9094."
        )
    return servers


def kafka_controller(listener: HostPort) -> HostPort:
    """The KRaft controller listens on the broker port + 1."""
    return HostPort(listener.host, listener.port + 1)


def minio_api(endpoint: str) -> HostPort:
    """The MinIO S3 API address from storage.endpoint (http://host:port, loopback)."""
    where = "storage.endpoint"
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    if parts.scheme != "http":
        raise StackError(
            f"{where}: {endpoint!r} uses {parts.scheme!r}; the native MinIO serves plain http on loopback. "
            "Use http://127.0.0.1:9000."
        )
    try:
        port = parts.port
    except ValueError:
        raise StackError(f"{where}: {endpoint!r} has an invalid port. Use e.g. http://127.0.0.1:9000.") from None
    if not parts.hostname or port is None:
        raise StackError(f"{where}: {endpoint!r} needs a host and a port, e.g. http://127.0.0.1:9000.")
    _require_loopback(parts.hostname, where)
    return HostPort(parts.hostname, _port(str(port), where))


def minio_console(api: HostPort) -> HostPort:
    """The MinIO console listens on the API port + 1."""
    return HostPort(api.host, api.port + 1)


def bind_host(address: HostPort) -> str:
    """The numeric address to bind: localhost binds 127.0.0.1."""
    return "127.0.0.1" if address.host == "localhost" else address.host


PORT_RANGE = (20000, 32000)  # below Linux's ephemeral range, so outgoing connections don't take them


def loopback_port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if nothing listens on host:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(exclude: set[int] | None = None, pair: bool = False) -> int:
    """A free loopback port p (with pair: p + 1 free too; the stack's services also listen on port + 1)."""
    exclude = exclude or set()
    rng = random.Random()
    for _ in range(500):
        port = rng.randrange(*PORT_RANGE)
        wanted = {port, port + 1} if pair else {port}
        if not wanted & exclude and all(loopback_port_free(p) for p in wanted):
            return port
    raise StackError(f"No free loopback port found in {PORT_RANGE}; stop some services and try again.")


def prometheus_web(host: str, port: int) -> HostPort:
    """The native Prometheus' web address from monitoring.prometheus_host/_port (loopback)."""
    where = "monitoring.prometheus_host/prometheus_port"
    _require_loopback(host, where)
    return HostPort(host, _port(str(port), where))
