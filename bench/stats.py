"""Pure helpers: percentiles, the streaming job's batch log lines, Prometheus text, Delta commit files."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# streaming/pipeline/ingest.py logs: "<asctime> INFO iotlake.ingest: batch 3: 250000 messages {...}, 244000 readings
# inserted, 200 device states, 12.3 s" (asctime like "2026-11-30 12:09:41,486", local time of the job).
BATCH_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ iotlake\.ingest: batch (?P<batch>\d+): "
    r"(?P<messages>\d+) messages (?P<actions>\{.*?\}), (?P<inserted>\d+) readings inserted, "
    r"(?P<devices>\d+) device states, (?P<seconds>[\d.]+) s$"
)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


@dataclass(frozen=True)
class BatchLine:
    """One 'batch N: ...' log line of the streaming job."""

    batch_id: int
    messages: int
    inserted: int
    seconds: float  # wall time of the foreachBatch call
    logged_at: datetime  # naive local time of the job's log record (when the call returned)


def parse_batch_lines(log_text: str) -> list[BatchLine]:
    """Every batch line of a job log, in order."""
    found = []
    for line in log_text.splitlines():
        m = BATCH_LINE.match(line.strip())
        if m:
            found.append(
                BatchLine(
                    batch_id=int(m["batch"]),
                    messages=int(m["messages"]),
                    inserted=int(m["inserted"]),
                    seconds=float(m["seconds"]),
                    logged_at=datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f"),
                )
            )
    return found


def steady_rate(batches: Sequence[BatchLine], skip: int = 1) -> float | None:
    """Messages per second from the end of batch `skip - 1` to the end of the last batch (log times).

    Counts the messages of batches skip.. and the whole wall time between, trigger overhead included.
    """
    if len(batches) <= skip:
        return None
    window = (batches[-1].logged_at - batches[skip - 1].logged_at).total_seconds()
    messages = sum(b.messages for b in batches[skip:])
    return messages / window if window > 0 else None


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page, keyed by (name, sorted labels)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def phases(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    """iot_ingest_batch_phase_seconds by phase (the last progress report's durationMs)."""
    return {
        dict(labels)["phase"]: value
        for (name, labels), value in metrics.items()
        if name == "iot_ingest_batch_phase_seconds" and "phase" in dict(labels)
    }


@dataclass(frozen=True)
class Commit:
    """One Delta commit file: version, commitInfo (timestamp ms, operation, metrics) and txn versions."""

    version: int
    timestamp_ms: int
    operation: str
    metrics: dict[str, str]
    txn_versions: tuple[int, ...]
    written_ms: int | None = None  # when the commit file appeared in the object store (its LastModified)


def parse_commit(version: int, text: str) -> Commit:
    """A _delta_log/<version>.json file (one JSON action per line)."""
    info: dict[str, Any] = {}
    txns: list[int] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"]
        elif "txn" in action:
            txns.append(int(action["txn"]["version"]))
    return Commit(
        version=version,
        timestamp_ms=int(info.get("timestamp", 0)),
        operation=str(info.get("operation", "")),
        metrics={k: str(v) for k, v in (info.get("operationMetrics") or {}).items()},
        txn_versions=tuple(txns),
    )


def summarize(values: Iterable[float], digits: int = 3) -> dict[str, float | int]:
    """count, mean, p50, p90, p99, max of some values."""
    vals = list(values)
    if not vals:
        return {"count": 0}
    return {
        "count": len(vals),
        "mean": round(sum(vals) / len(vals), digits),
        "p50": round(percentile(vals, 50), digits),
        "p90": round(percentile(vals, 90), digits),
        "p99": round(percentile(vals, 99), digits),
        "max": round(max(vals), digits),
    }


def least_squares(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> tuple[list[float], float]:
    """Ordinary least squares y ~ x (each row of `xs` holds every regressor; put a 1 first for an intercept):
    the coefficients and R². Raises ValueError with fewer rows than regressors or collinear regressors."""
    k = len(xs[0]) if xs else 0
    if k == 0 or len(xs) < k or len(xs) != len(ys):
        raise ValueError(f"least squares needs at least {max(k, 1)} rows of {k} regressors and one y each")
    # The normal equations (X'X) c = X'y, solved by Gauss-Jordan elimination with partial pivoting.
    pairs = list(zip(xs, ys, strict=True))
    m = [[sum(r[i] * r[j] for r in xs) for j in range(k)] + [sum(r[i] * y for r, y in pairs)] for i in range(k)]
    for i in range(k):
        pivot = max(range(i, k), key=lambda row: abs(m[row][i]))
        if abs(m[pivot][i]) < 1e-12:
            raise ValueError("least squares: the regressors are collinear")
        m[i], m[pivot] = m[pivot], m[i]
        m[i] = [v / m[i][i] for v in m[i]]
        for r in range(k):
            if r != i:
                m[r] = [a - m[r][i] * b for a, b in zip(m[r], m[i], strict=True)]
    coef = [m[i][k] for i in range(k)]
    mean = sum(ys) / len(ys)
    total = sum((y - mean) ** 2 for y in ys)
    residual = sum((y - sum(c * x for c, x in zip(coef, r, strict=True))) ** 2 for r, y in pairs)
    return coef, (1 - residual / total) if total else 1.0


# The parts of a foreachBatch call batch_breakdown() returns, in the order they run; they add up to its time.
BREAKDOWN_KEYS = (
    "validate_count_quarantine_s",  # sequential writer: Kafka read, parse, validate, count, quarantine append
    "readings_rows_span_s",  # sequential writer: dedup rows and their dates / time span
    "before_readings_merge_s",  # otherwise: everything before the readings MERGE starts
    "readings_merge_s",
    "between_merges_s",
    "device_state_merge_s",
    "after_merges_s",  # cleanup, and waiting for a quarantine append that runs beside the MERGEs
)


def batch_breakdown(
    line: BatchLine,
    quarantine: Commit | None,
    readings: Commit | None,
    device_state: Commit | None,
) -> dict[str, float]:
    """Where one foreachBatch call's wall time went, from its log line and its three Delta commits.

    MERGE times are Delta's executionTimeMs, each ending at its commit's timestamp (ms, same clock as the
    log). When the quarantine commit lands before the readings MERGE starts, the writer ran sequentially
    (validate -> quarantine append -> rows -> MERGEs) and the time before the MERGE is split there; when it
    lands later, the append ran beside the MERGEs and only its commit time is given
    (quarantine_committed_at_s, not part of the sum).
    """
    end = line.logged_at.timestamp()
    start = end - line.seconds
    out: dict[str, float] = {"foreach_batch_s": line.seconds}
    cursor = start
    q = quarantine.timestamp_ms / 1000 if quarantine is not None else None
    if readings is not None:
        merge_s = float(readings.metrics.get("executionTimeMs", 0)) / 1000
        committed = readings.timestamp_ms / 1000
        merge_start = committed - merge_s
        if q is not None and q <= merge_start:
            out["validate_count_quarantine_s"] = q - start
            out["readings_rows_span_s"] = merge_start - q
        else:
            out["before_readings_merge_s"] = merge_start - start
        out["readings_merge_s"] = merge_s
        cursor = committed
    if device_state is not None:
        merge_s = float(device_state.metrics.get("executionTimeMs", 0)) / 1000
        committed = device_state.timestamp_ms / 1000
        out["between_merges_s"] = committed - merge_s - cursor
        out["device_state_merge_s"] = merge_s
        cursor = committed
    out["after_merges_s"] = end - cursor
    if q is not None and "validate_count_quarantine_s" not in out:
        out["quarantine_committed_at_s"] = q - start
    return {k: round(v, 3) for k, v in out.items()}
