"""Errors the simulator raises on purpose; each message names the cause and the fix."""

from __future__ import annotations


class SimulatorError(Exception):
    """Root of every error sensor-sim raises on purpose; `exit_code` is what the CLI returns."""

    exit_code = 2


class UsageError(SimulatorError):
    """A flag, environment variable or option is invalid (exit code 2)."""

    exit_code = 2


class BackendUnavailableError(SimulatorError):
    """The chosen Kafka client library cannot be imported (exit code 2)."""

    exit_code = 2


class KafkaUnreachableError(SimulatorError):
    """Kafka did not answer a metadata request in time, or the topic does not exist (exit code 3)."""

    exit_code = 3


class DeliveryReportError(SimulatorError):
    """The Kafka client reported a message the simulator never sent: a bug, not bad input (exit code 4)."""

    exit_code = 4
