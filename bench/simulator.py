"""Simulator throughput: `sensor-sim --rate 0 --count N` per backend, each run to a fresh topic."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.job import run_sim, sim_argv
from bench.procs import ProcSampler
from bench.stack import BenchStack
from bench.stats import median
from streaming.core.config import load_settings


@dataclass(frozen=True)
class SimulatorParams:
    counts: dict[str, int] = field(default_factory=lambda: {"confluent": 500_000, "kafka-python": 100_000})
    repeats: int = 3
    timeout_s: float = 900.0
    workers: int = 2  # a confluent run with `--workers N` beside the one-process runs (1: none)


def run_simulator(stack: BenchStack, workdir: Path, params: SimulatorParams, echo: Any = print) -> dict[str, Any]:
    """msgs_per_s of each backend (median of `repeats` runs), every run's figures and the CPU it used.

    A `--dry-run` of the confluent count (generator only, no Kafka) runs beside them: it tells whether the
    generator or the client bounds the rate. So does `confluent-workers-N`: `--workers N` processes.
    """
    result: dict[str, Any] = {"msgs_per_s": {}, "runs": {}}
    confluent = params.counts.get("confluent", max(params.counts.values()))
    kinds: list[tuple[str, str, int, tuple[str, ...]]] = [(b, b, c, ()) for b, c in params.counts.items()]
    kinds.append(("dry-run", "confluent", confluent, ("--dry-run",)))
    if params.workers > 1:
        workers = str(params.workers)
        kinds.append((f"confluent-workers-{workers}", "confluent", confluent, ("--workers", workers)))
    for run in range(params.repeats):  # backends alternate, so both see the same background load
        for kind, backend, count, extra in kinds:
            env = stack.workload(f"sim-{kind}", workdir, topic=kind != "dry-run")
            settings = load_settings(env=env)
            summary = workdir / f"sim-{kind}-{run}.json"
            argv = sim_argv(
                settings.kafka.bootstrap_servers,
                settings.kafka.topic,
                summary,
                rate=0,
                count=count,
                backend=backend,
                extra=extra,
            )
            sampler = ProcSampler(interval=0.5)
            for name, pid in stack.service_pids().items():
                sampler.track(name, pid)
            with sampler:
                data = run_sim(argv, env, workdir / f"sim-{kind}-{run}.log", summary, params.timeout_s, sampler)
            result["runs"].setdefault(kind, []).append(
                {
                    "count": data["sent_total"],
                    "elapsed_s": data["elapsed_s"],
                    "msgs_per_s": data["msgs_per_s"],
                    "cpu_cores": sampler.mean_cpu("simulator"),
                    "kafka_cpu_cores": sampler.mean_cpu("kafka"),
                    "machine_busy_cores": sampler.mean_machine_busy(),
                }
            )
            echo(
                f"simulator: {kind} run {run + 1}: {data['sent_total']:,} msgs at {data['msgs_per_s']:,.0f} msgs/s "
                f"(simulator {sampler.mean_cpu('simulator'):.2f} cores, broker {sampler.mean_cpu('kafka'):.2f}, "
                f"machine {sampler.mean_machine_busy():.2f} busy)"
            )
    for backend, runs in result["runs"].items():
        key = "generator_msgs_per_s" if backend == "dry-run" else backend
        target = result if backend == "dry-run" else result["msgs_per_s"]
        target[key] = round(median([r["msgs_per_s"] for r in runs]), 1)
    return result
