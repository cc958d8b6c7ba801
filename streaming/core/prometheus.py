"""Prometheus over HTTP: serve a registry's /metrics, and read one back (fetch, samples, scrape).

Each process has its own registry and metrics, in its own package: `streaming.pipeline.metrics` (the job),
`streaming.lake.metrics` (the sidecar), `producers.metrics` (sensor-sim). Names: iot_<area>_<name>_<unit>,
counters end in _total.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from streaming.core.errors import ConfigError
from streaming.core.http import Unanswered, get


def fetch(url: str, timeout: float = 2.0) -> str | None:
    """The text of a /metrics page, or None when nothing answers."""
    try:
        answer = get(url, timeout)
    except Unanswered:
        return None
    return answer.text() if answer.ok else None


def samples(text: str) -> dict[str, float]:
    """Every sample of a /metrics page by `name{k=v,...}` (labels sorted), and by `name` (its samples summed)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
            if sample.labels:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def scrape(url: str, timeout: float = 2.0) -> dict[str, float]:
    """samples() of a /metrics page; {} while nothing answers."""
    text = fetch(url, timeout)
    return samples(text) if text is not None else {}


def serve(registry: CollectorRegistry, host: str, port: int, setting: str | None = None) -> Callable[[], None]:
    """Expose a registry's /metrics over HTTP (port 0 = don't); returns a function that stops the server.

    With `setting` (the config key of the port), a port that can't be bound is a ConfigError naming it.
    """
    if not port:
        return lambda: None
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        if setting is None:
            raise
        raise ConfigError(
            f"{setting}: can't serve /metrics on {host}:{port} ({e.strerror or e}). Another process holds the "
            f"port: stop it, choose a free port (env IOTLAKE_{setting.upper().replace('.', '__')}), or 0 for none."
        ) from e

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
