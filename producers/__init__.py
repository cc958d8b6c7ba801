"""Sensor simulator: a deterministic stream of IoT readings with injected faults, produced to Kafka."""

from producers.options import MALFORMED_KINDS, SimOptions
from producers.stream import EventStream, Message, simulate

__all__ = ["MALFORMED_KINDS", "EventStream", "Message", "SimOptions", "simulate"]
