"""`make run`'s supervisor with the real streaming job: SIGKILL it mid-stream, see it restarted and catch up.

No `make run` here: the test builds the same supervisor `run_pipeline` uses (streaming.cli.run.supervisor) and
ticks it itself.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from stack import StackLayout, proc
from stack.addresses import free_port
from stack.supervise import RestartPolicy, Supervisor
from streaming.cli import run as stack_run
from streaming.core.config import PROJECT_ROOT, Settings, load_settings
from streaming.core.prometheus import scrape
from streaming.lake.status import stream_status
from tests.helpers import wait_for
from tests.integration.lake import simulate

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START_TIMEOUT_S = 300.0


def _ticking(sup: Supervisor, condition: Callable[[], bool]) -> Callable[[], bool]:
    """A wait_for predicate that supervises while it waits (as run_pipeline's loop does)."""

    def check() -> bool:
        sup.tick()
        return condition()

    return check


def test_a_killed_ingest_job_is_restarted_and_catches_up(
    test_env: dict[str, str], settings: Settings, stack_layout: StackLayout, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **test_env,
        "IOTLAKE_INGEST__METRICS_PORT": str(port),
        "IOTLAKE_INGEST__TRIGGER_INTERVAL": "1 second",
        "IOTLAKE_MAINTENANCE__ENABLED": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), test_env.get("PYTHONPATH")])),
    }
    job_settings = load_settings(env=env)
    layout = StackLayout(home=tmp_path / "home", cache=stack_layout.cache)
    policy = RestartPolicy(base_backoff_s=1.0, max_restarts=2, window_s=600.0)
    sup, ingest = stack_run.supervisor(job_settings, layout, env, policy)
    assert [c.name for c in sup.children] == ["ingest"]
    url = f"http://127.0.0.1:{port}/metrics"

    def query_up() -> bool:
        return ingest.pid is not None and scrape(url).get("iot_ingest_query_up") == 1.0

    def caught_up() -> bool:
        status = stream_status(job_settings)
        return status.last_batch_id is not None and status.total_lag == 0

    simulate(settings, tmp_path, count=2_000, seed=3)
    ingest.start()
    try:
        wait_for(_ticking(sup, query_up), START_TIMEOUT_S, interval=1.0, message="the job's query up")
        wait_for(_ticking(sup, caught_up), START_TIMEOUT_S, interval=1.0, message="the first events committed")
        first = ingest.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)  # the Python driver only: its JVM is left to the supervisor
        wait_for(_ticking(sup, lambda: ingest.restarts == 1), 60, interval=0.5, message="the restart")
        assert ingest.deaths[0].pid == first and ingest.deaths[0].code == -signal.SIGKILL
        assert ingest.pid is not None and ingest.pid != first
        assert not proc.group_alive(first), "the dead driver's JVM outlived it"
        assert sup.deaths_text() == "deaths ingest 1"
        assert sup.summary()[0].startswith("ingest: 1 death, 1 restart (last: killed by SIGKILL (-9)")

        simulate(settings, tmp_path, count=2_000, seed=4)
        wait_for(_ticking(sup, query_up), START_TIMEOUT_S, interval=1.0, message="the restarted job's query up")
        wait_for(_ticking(sup, caught_up), START_TIMEOUT_S, interval=1.0, message="the restarted job caught up")
        assert "restarting ingest" in ingest.log.read_text()
    finally:
        codes = sup.stop(timeout=120)
    assert codes == {"ingest": 0}, proc.tail(ingest.log, 40)
