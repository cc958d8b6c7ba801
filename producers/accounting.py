"""Exact counts of what Kafka acknowledged, fed one delivery report at a time, and the run summary."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from producers.faults import DUPLICATE, LATE, MALFORMED_KINDS, OUT_OF_ORDER, VALID, VALID_KINDS
from producers.options import SimOptions, iso_utc
from producers.signals import device_ids

if TYPE_CHECKING:
    from producers.stream import Message

UNCONFIRMED = "unconfirmed_at_exit"
COUNTS = ("sent_total", "valid_distinct", "duplicates", "out_of_order", "late", "malformed_total", "delivery_failed")


class Accounting:
    """Counts acknowledged messages by kind and the newest valid event per device.

    A duplicate whose original failed delivery stands in for it: it counts as a distinct valid event,
    not as a duplicate. This relies on the original's report arriving first, which holds because both
    carry the same key and so the same partition, whose reports come in produce order.
    """

    def __init__(self, options: SimOptions) -> None:
        self.options = options
        self._device_ids = device_ids(options.devices)
        self.sent_total = 0
        self.valid_distinct = 0
        self.duplicates = 0
        self.out_of_order = 0
        self.late = 0
        self.malformed_by_kind: dict[str, int] = dict.fromkeys(MALFORMED_KINDS, 0)
        self.delivery_failed = 0
        self.delivery_errors: dict[str, int] = {}
        self._failed_valid: set[int] = set()
        self._latest_time = [-1] * options.devices
        self._latest_seq = [0] * options.devices

    def ack(self, m: Message) -> None:
        """Kafka acknowledged `m`."""
        self.sent_total += 1
        kind = m[2]
        if kind == VALID:
            self.valid_distinct += 1
        elif kind == DUPLICATE:
            failed = self._failed_valid
            if failed and m[3] in failed:
                failed.discard(m[3])
                self.valid_distinct += 1
            else:
                self.duplicates += 1
        elif kind == LATE:
            self.valid_distinct += 1
            self.late += 1
        elif kind == OUT_OF_ORDER:
            self.valid_distinct += 1
            self.out_of_order += 1
        else:
            self.malformed_by_kind[kind] += 1
            return
        dev, t = m[4], m[5]
        latest = self._latest_time[dev]
        if t > latest or (t == latest and m[6] > self._latest_seq[dev]):
            self._latest_time[dev] = t
            self._latest_seq[dev] = m[6]

    def fail(self, m: Message, reason: str) -> None:
        """Kafka refused `m`, or it timed out; `reason` is the client's error name."""
        self.delivery_failed += 1
        self.delivery_errors[reason] = self.delivery_errors.get(reason, 0) + 1
        if m[2] in VALID_KINDS:
            self._failed_valid.add(m[3])

    def unconfirmed(self, count: int) -> None:
        """`count` messages had no delivery report when the run ended: counted as failed."""
        if count > 0:
            self.delivery_failed += count
            self.delivery_errors[UNCONFIRMED] = self.delivery_errors.get(UNCONFIRMED, 0) + count

    @property
    def malformed_total(self) -> int:
        """Acknowledged malformed messages of every kind."""
        return sum(self.malformed_by_kind.values())

    def latest_by_device(self) -> dict[str, dict[str, int]]:
        """The newest acknowledged valid event per device, by (event_time, seq)."""
        return {
            self._device_ids[d]: {"event_time": t, "seq": self._latest_seq[d]}
            for d, t in enumerate(self._latest_time)
            if t >= 0
        }

    def summary(
        self,
        *,
        elapsed_s: float,
        backend: str,
        topic: str | None = None,
        bootstrap_servers: str | None = None,
    ) -> dict[str, Any]:
        """Everything the run sent, as a JSON-ready dict."""
        o = self.options
        return {
            "sent_total": self.sent_total,
            "valid_distinct": self.valid_distinct,
            "duplicates": self.duplicates,
            "out_of_order": self.out_of_order,
            "late": self.late,
            "malformed_total": self.malformed_total,
            "malformed_by_kind": dict(self.malformed_by_kind),
            "delivery_failed": self.delivery_failed,
            "delivery_errors": dict(self.delivery_errors),
            "backend": backend,
            "topic": topic,
            "bootstrap_servers": bootstrap_servers,
            "seed": o.seed,
            "start_time_ms": o.start_time_ms,
            "start_time": iso_utc(o.start_time_ms),
            "devices": o.devices,
            "parcels": o.parcels,
            "added_fields": list(o.added_fields),
            "elapsed_s": round(elapsed_s, 3),
            "msgs_per_s": round(self.sent_total / elapsed_s, 1) if elapsed_s > 0 else 0.0,
            "latest_by_device": self.latest_by_device(),
        }


def merge_summaries(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One run's summary from its workers' (`--workers`): counts added up, devices (disjoint) joined, the longest
    elapsed time."""
    if not parts:
        raise ValueError("no worker summaries to merge")
    merged = dict(parts[0])
    for key in COUNTS:
        merged[key] = sum(p[key] for p in parts)
    for key in ("malformed_by_kind", "delivery_errors"):
        totals: dict[str, int] = {}
        for p in parts:
            for name, count in p[key].items():
                totals[name] = totals.get(name, 0) + count
        merged[key] = totals
    latest: dict[str, dict[str, int]] = {}
    for p in parts:
        latest.update(p["latest_by_device"])
    merged["latest_by_device"] = dict(sorted(latest.items()))
    elapsed = max(p["elapsed_s"] for p in parts)
    merged["elapsed_s"] = elapsed
    merged["msgs_per_s"] = round(merged["sent_total"] / elapsed, 1) if elapsed > 0 else 0.0
    if all("produced_total" in p for p in parts):
        merged["produced_total"] = sum(p["produced_total"] for p in parts)
    merged["interrupted"] = any(p.get("interrupted", False) for p in parts)
    merged["workers"] = len(parts)
    return merged
