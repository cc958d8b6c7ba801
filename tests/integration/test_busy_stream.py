"""A busy stream upserts device_state inside its batches, after their readings commit, never between two batches.

The job's loop also upserts the folded device states between batches, for a stream that has gone idle and runs no
batch that would. Between two batches of a busy stream the upsert holds the next batch back by a whole MERGE: in the
benchmark's latency run at 5,000 events/s (`bench/results/2026-12-07-full-af52808.json`, batches 11 and 13) the loop
took the gap between two batches for it, and each of those batches started 1.8-3.0 s late.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streaming.core.config import Settings
from tests.helpers import wait_for
from tests.integration.lake import (
    assert_tables_match,
    batch_ids,
    combine_summaries,
    committed_offsets_sum,
    delta_log_commits,
    simulate,
    start_ingest,
    stop_job,
    wait_for_first_batch,
)
from tests.integration.test_pipeline import FAULTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PRIMING = 200  # the job's first batch, before the measured traffic: the job is up when the traffic starts
MESSAGES = 9_000  # 60 s at 150 messages/s: every trigger finds data


def test_a_busy_stream_never_upserts_device_state_between_batches(
    settings: Settings, test_env: dict[str, str], stack_secrets: dict[str, str], tmp_path: Path
) -> None:
    """A 10 s trigger leaves seconds between batches that take 2-6 s, and device_state comes due every 25 s, so
    folded device states fall due in those gaps. An upsert carrying batch v's transaction version that commits after
    batch v ended (its commit file written) while batch v + 1 followed ran between two batches of a busy stream."""
    env = {
        **test_env,
        "IOTLAKE_INGEST__TRIGGER_INTERVAL": "10 seconds",
        "IOTLAKE_INGEST__DEVICE_STATE_INTERVAL": "25 seconds",
    }
    checkpoint = Path(env["IOTLAKE_INGEST__CHECKPOINT_LOCATION"])
    log = tmp_path / "ingest.log"
    job = start_ingest(env, log)
    try:
        priming = simulate(settings, tmp_path, count=PRIMING, seed=1)
        wait_for_first_batch(job, checkpoint, log)
        traffic = simulate(settings, tmp_path, *FAULTS, "--rate", "150", count=MESSAGES, seed=2)
        wait_for(
            lambda: (
                job.poll() is not None or committed_offsets_sum(checkpoint, settings.kafka.topic) >= PRIMING + MESSAGES
            ),
            300,
            interval=1.0,
            message="the job to commit every message",
        )
        assert job.poll() is None, log.read_text()[-3000:]
    finally:
        code = stop_job(job)
    assert code == 0, log.read_text()[-3000:]

    ended = {b: (checkpoint / "commits" / str(b)).stat().st_mtime * 1000 for b in batch_ids(checkpoint)}
    upserts = []  # (the newest batch folded into the upsert: its transaction version, its commit time in epoch ms)
    for actions in delta_log_commits(settings, "device_state"):
        txn = next((a["txn"] for a in actions if "txn" in a), None)
        if txn is not None:
            upserts.append(
                (int(txn["version"]), next(int(a["commitInfo"]["timestamp"]) for a in actions if "commitInfo" in a))
            )
    busy = sorted(ended)[1:]  # batch 0 is the priming one, and the stream idles after it until the traffic starts
    assert len(busy) >= 4, f"too few batches of the traffic to tell anything: {busy}"
    assert len({v for v, _ in upserts if v in busy}) < len(busy), f"every batch upserted, none folded: {upserts}"
    between = [(v, t) for v, t in upserts if v in busy and v + 1 in ended and t > ended[v]]
    assert not between, (
        "device_state upserted between two batches of a busy stream (batch, ms after it ended): "
        f"{[(v, round(t - ended[v])) for v, t in between]}"
    )
    assert_tables_match(settings, stack_secrets, combine_summaries(priming, traffic))
