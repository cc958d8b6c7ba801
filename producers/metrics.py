"""sensor-sim's metrics (iot_sim_*), on their own registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

from streaming.core.prometheus import serve

# Produce-to-acknowledgement times: a local broker answers in milliseconds, a loaded one in seconds.
DELIVERY_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass
class SimulatorMetrics:
    """sensor-sim's metrics on their own registry (names: iot_sim_<name>_<unit>)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.sent = Counter(
            "iot_sim_messages_sent_total",
            "Messages Kafka acknowledged, by kind (valid, duplicate, out_of_order, late, or a malformed kind)",
            ["kind"],
            registry=r,
        )
        self.failed = Counter(
            "iot_sim_messages_failed_total",
            "Messages Kafka refused or never acknowledged, by kind (unconfirmed_at_exit: no report at exit)",
            ["kind"],
            registry=r,
        )
        self.delivery_latency = Histogram(
            "iot_sim_delivery_latency_seconds",
            "Time from handing a message to the client to its successful delivery report",
            buckets=DELIVERY_LATENCY_BUCKETS,
            registry=r,
        )

    def serve(self, host: str, port: int) -> Callable[[], None]:
        return serve(self.registry, host, port)
