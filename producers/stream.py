"""The generated stream: a pure, deterministic iterator of Messages for given options and seed."""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from producers.accounting import Accounting
from producers.encoding import EVENT_TEMPLATE, added_fields_fragment, event_id, event_id_prefix, ids_fragment
from producers.faults import (
    DUPLICATE,
    DUPLICATE_HISTORY,
    LATE,
    MALFORMED,
    OUT_OF_ORDER,
    VALID,
    FaultPlan,
    late_lag_ms,
    malformed_payload,
)
from producers.options import SimOptions
from producers.signals import Fleet

WallClock = Callable[[], int]


class Message(NamedTuple):
    """One Kafka message to send, with what the accounting needs to know about it."""

    key: bytes  # device_id as UTF-8
    value: bytes  # the JSON event (or a malformed payload)
    kind: str  # valid | late | out_of_order | duplicate | one of MALFORMED_KINDS
    valid_id: int  # index of the distinct valid event carried (duplicates: the original's); -1: malformed
    device: int  # device index (0-based)
    event_time: int  # epoch ms as written in the value (malformed: the clock, not the payload's)
    seq: int  # seq as written in the value (malformed: the seq it would carry, not consumed)


def wall_clock_ms() -> int:
    """Now, in epoch milliseconds."""
    return time.time_ns() // 1_000_000


class EventStream:
    """Iterating yields the run's messages; only the wall-clock cap on event time depends on `wall_clock`.

    Each iteration starts afresh from the seed. `stop()` ends an endless (or any) run early: held-back
    out-of-order events are still emitted, so every generated valid event is sent.
    """

    def __init__(self, options: SimOptions, wall_clock: WallClock = wall_clock_ms) -> None:
        self.options = options
        self._wall_clock = wall_clock
        self._stopped = False

    def stop(self) -> None:
        """Generate no new events; the iterator flushes held-back events, then ends."""
        self._stopped = True

    def __iter__(self) -> Iterator[Message]:
        return self._generate()

    def _generate(self) -> Iterator[Message]:  # one hot loop, kept flat for speed
        o = self.options
        fleet = Fleet(o.devices, o.parcels, o.seed, o.start_time_ms)
        sample = fleet.sample
        devices = o.devices
        device_ids = fleet.device_ids
        parcel_of_device = [fleet.parcel_ids[fleet.parcel_of[d]] for d in range(devices)]
        keys = [d.encode() for d in device_ids]
        ids = [ids_fragment(device_ids[d], parcel_of_device[d]) for d in range(devices)]
        prefix = event_id_prefix(o.seed, o.start_time_ms)
        worker, workers = o.worker, o.workers
        mine = list(range(worker, devices, workers))  # this worker's devices, in round-robin order
        shard = len(mine)
        prefix_bytes = prefix.encode()
        template = EVENT_TEMPLATE
        new = tuple.__new__  # Message(...) through its Python-level __new__ costs twice as much
        plan = FaultPlan(o.duplicate_rate, o.malformed_rate, o.late_rate, o.out_of_order_rate)
        any_fault = plan.any_fault
        kinds = o.malformed_kinds
        added = o.added_fields
        rnd = random.Random(f"sensor-sim:{o.seed}:faults" + (f":{worker}" if workers > 1 else "")).random
        clock = self._wall_clock
        start, step = o.start_time_ms, o.step_ms
        limit = sys.maxsize if o.count is None else o.count
        seqs = [0] * devices
        held: dict[int, Message] = {}  # out-of-order events waiting for their device's next valid event
        keep_history = o.duplicate_rate > 0
        history: list[Message] = []  # ring buffer of recently sent valid messages
        sent_valid = 0
        wall = -1  # last wall-clock reading; event time never exceeds it
        n = 0  # events this worker generated: drives the device round-robin
        g = worker  # the same event's number in the whole run (n * workers + worker): its clock and its id
        emitted = 0
        held_count = 0  # len(held), kept by hand: cheaper in the loop
        valid_id = 0
        extra = b""

        while emitted + held_count < limit and not self._stopped:
            u = rnd()
            fate = VALID
            if u < any_fault:
                fate = plan.pick(u)
                if fate == DUPLICATE:
                    if history:
                        orig = history[int(rnd() * len(history))]
                        yield new(Message, (orig[0], orig[1], DUPLICATE, *orig[3:]))
                        emitted += 1
                        continue
                    fate = VALID  # nothing sent yet to duplicate
            dev = mine[n % shard]
            t = start + int(g * step)
            if t > wall:
                wall = max(wall, clock())
                if t > wall:
                    t = wall
            if fate == MALFORMED:
                kind = kinds[int(rnd() * len(kinds))]
                eid = event_id(prefix, g)
                payload = malformed_payload(
                    kind, eid, device_ids[dev], parcel_of_device[dev], seqs[dev] + 1, t, sample(dev, t)
                )
                n += 1
                g += workers
                yield Message(keys[dev], payload, kind, -1, dev, t, seqs[dev] + 1)
                emitted += 1
                continue
            seq = seqs[dev] + 1
            seqs[dev] = seq
            if fate == LATE:
                t -= late_lag_ms(rnd())
            elif fate == OUT_OF_ORDER and dev in held:
                fate = VALID  # one held event per device at a time
            if added:
                extra = added_fields_fragment(added, seq)
            temp, humidity, nitrogen, salinity, battery = sample(dev, t)
            value = template % (
                prefix_bytes,
                g,
                ids[dev],
                seq,
                t,
                temp,
                humidity,
                nitrogen,
                salinity,
                battery,
                extra,
            )
            msg = new(Message, (keys[dev], value, fate, valid_id, dev, t, seq))
            n += 1
            g += workers
            valid_id += 1
            if fate == OUT_OF_ORDER:
                held[dev] = msg
                held_count += 1
                continue
            yield msg
            emitted += 1
            if keep_history:
                if sent_valid < DUPLICATE_HISTORY:
                    history.append(msg)
                else:
                    history[sent_valid % DUPLICATE_HISTORY] = msg
                sent_valid += 1
            if held:
                released = held.pop(dev, None)
                if released is not None:
                    held_count -= 1
                    yield released
                    emitted += 1
                    if keep_history:
                        if sent_valid < DUPLICATE_HISTORY:
                            history.append(released)
                        else:
                            history[sent_valid % DUPLICATE_HISTORY] = released
                        sent_valid += 1

        # Held events whose device sent nothing newer: in order after all, so plain valid events.
        for msg in held.values():
            yield msg._replace(kind=VALID)


def simulate(options: SimOptions, wall_clock: WallClock = wall_clock_ms, **run_info: Any) -> dict[str, Any]:
    """Generate the whole run without Kafka, as if every message were acknowledged; return the summary."""
    accounting = Accounting(options)
    ack = accounting.ack
    began = time.perf_counter()
    for msg in EventStream(options, wall_clock):
        ack(msg)
    run_info.setdefault("backend", "none")
    return accounting.summary(elapsed_s=time.perf_counter() - began, **run_info)
