"""Simulator throughput: `sensor-sim --rate 0 --count N` per backend, each run to a fresh topic."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.job import run_sim, sim_argv
from bench.stack import BenchStack
from bench.stats import median
from streaming.config import load_settings


@dataclass(frozen=True)
class SimulatorParams:
    counts: dict[str, int] = field(default_factory=lambda: {"confluent": 500_000, "kafka-python": 100_000})
    repeats: int = 3
    timeout_s: float = 900.0


def run_simulator(stack: BenchStack, workdir: Path, params: SimulatorParams, echo: Any = print) -> dict[str, Any]:
    """msgs_per_s of each backend (median of `repeats` runs) and every run's figures."""
    result: dict[str, Any] = {"msgs_per_s": {}, "runs": {}}
    for run in range(params.repeats):  # backends alternate, so both see the same background load
        for backend, count in params.counts.items():
            env = stack.workload(f"sim-{backend}", workdir)
            settings = load_settings(env=env)
            summary = workdir / f"sim-{backend}-{run}.json"
            argv = sim_argv(
                settings.kafka.bootstrap_servers, settings.kafka.topic, summary, rate=0, count=count, backend=backend
            )
            data = run_sim(argv, env, workdir / f"sim-{backend}-{run}.log", summary, params.timeout_s)
            result["runs"].setdefault(backend, []).append(
                {"count": data["sent_total"], "elapsed_s": data["elapsed_s"], "msgs_per_s": data["msgs_per_s"]}
            )
            echo(f"simulator: {backend} run {run + 1}: {data['sent_total']:,} msgs at {data['msgs_per_s']:,.0f} msgs/s")
    for backend, runs in result["runs"].items():
        result["msgs_per_s"][backend] = round(median([r["msgs_per_s"] for r in runs]), 1)
    return result
