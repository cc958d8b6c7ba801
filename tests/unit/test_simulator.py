"""The sensor simulator's generator, faults and accounting, checked by re-parsing what it emits."""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
from collections import Counter, defaultdict
from typing import Any

import pytest

from producers import MALFORMED_KINDS, EventStream, Message, SimOptions, simulate
from producers.accounting import Accounting
from producers.backends import InFlight
from producers.errors import DeliveryReportError, UsageError
from producers.faults import REASON_BY_KIND
from producers.options import parse_start_time

pytestmark = pytest.mark.unit

START = 1_764_500_000_000  # 2025-11-30T10:53:20Z
NOW = START + 3_600_000  # the fake wall clock: an hour after the start, so event times are never capped
MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
REQUIRED = ("event_id", "device_id", "parcel_id", "seq", "event_time", "schema_version")
RANGES = {
    "air_temperature_c": (-60, 70),
    "air_humidity_pct": (0, 100),
    "soil_nitrogen_mg_kg": (0, 2000),
    "soil_salinity_ds_m": (0, 60),
    "battery_v": (0, 5),
}
TYPES: dict[str, tuple[type, ...]] = {
    "event_id": (str,),
    "device_id": (str,),
    "parcel_id": (str,),
    "seq": (int,),
    "event_time": (int,),
    "schema_version": (int,),
    **dict.fromkeys(RANGES, (int, float)),
}
ALL_FAULTS = {"duplicate_rate": 0.06, "out_of_order_rate": 0.05, "late_rate": 0.04, "malformed_rate": 0.06}


def options(**overrides: Any) -> SimOptions:
    base: dict[str, Any] = {"seed": 42, "start_time_ms": START, "devices": 20, "parcels": 4, "count": 4000}
    return SimOptions(**{**base, **overrides})


def generate(opts: SimOptions, clock_ms: int = NOW) -> list[Message]:
    return list(EventStream(opts, wall_clock=lambda: clock_ms))


def violations(value: bytes, now_ms: int = NOW, allowed_extra: tuple[str, ...] = ()) -> list[str]:
    """The streaming job's rules, re-implemented independently of the producer code."""
    try:
        event = json.loads(value)
    except ValueError:
        return ["malformed_json"]
    if not isinstance(event, dict):
        return ["malformed_json"]
    found = [f"missing_field:{f}" for f in REQUIRED if event.get(f) is None]
    for name, v in event.items():
        if name not in TYPES and name not in allowed_extra:
            found.append(f"unexpected_field:{name}")
        expected = TYPES.get(name, (int, float))
        if v is not None and (isinstance(v, bool) or not isinstance(v, expected)):
            found.append(f"wrong_type:{name}")
    if isinstance(event.get("schema_version"), int) and event["schema_version"] != 1:
        found.append("unknown_schema_version")
    for name, (low, high) in RANGES.items():
        v = event.get(name)
        if isinstance(v, int | float) and not isinstance(v, bool) and not low <= v <= high:
            found.append(f"out_of_range:{name}")
    t = event.get("event_time")
    if isinstance(t, int) and not isinstance(t, bool):
        if t > now_ms + 5 * MINUTE:
            found.append("event_time_in_future")
        if t < now_ms - 7 * DAY:
            found.append("event_time_too_old")
    return found


def event_number(event_id: str) -> int:
    """The generated-event counter in the id's last 12 hex digits (documented id scheme)."""
    return int(event_id.rsplit("-", 1)[1], 16)


def recount(msgs: list[Message], opts: SimOptions) -> dict[str, Any]:
    """Classify every message from its bytes alone and count like the summary should."""
    first_seen: dict[str, int] = {}
    counts: Counter[str] = Counter()
    malformed: Counter[str] = Counter({k: 0 for k in MALFORMED_KINDS})
    latest: dict[str, tuple[int, int]] = {}
    max_seq: dict[str, int] = defaultdict(int)
    for i, m in enumerate(msgs):
        reasons = violations(m.value)
        if reasons:
            kind = {v: k for k, v in REASON_BY_KIND.items()}[reasons[0]]
            malformed[kind] += 1
            continue
        event = json.loads(m.value)
        eid = event["event_id"]
        if eid in first_seen:
            counts["duplicates"] += 1
            continue
        first_seen[eid] = i
        counts["valid_distinct"] += 1
        dev, seq, t = event["device_id"], event["seq"], event["event_time"]
        clock = opts.start_time_ms + int(event_number(eid) * opts.step_ms)
        if clock - t >= 5 * MINUTE:
            counts["late"] += 1
        if seq < max_seq[dev]:
            counts["out_of_order"] += 1
        max_seq[dev] = max(max_seq[dev], seq)
        latest[dev] = max(latest.get(dev, (-1, 0)), (t, seq))
    return {
        "sent_total": len(msgs),
        "valid_distinct": counts["valid_distinct"],
        "duplicates": counts["duplicates"],
        "late": counts["late"],
        "out_of_order": counts["out_of_order"],
        "malformed_total": sum(malformed.values()),
        "malformed_by_kind": dict(malformed),
        "latest_by_device": {d: {"event_time": t, "seq": s} for d, (t, s) in latest.items()},
    }


# --- determinism ---------------------------------------------------------------------------------


def test_same_seed_and_start_give_identical_bytes() -> None:
    a = generate(options(**ALL_FAULTS))
    b = generate(options(**ALL_FAULTS))
    assert [(m.key, m.value) for m in a] == [(m.key, m.value) for m in b]


def test_a_different_seed_gives_different_bytes_and_ids() -> None:
    a = generate(options(seed=1))
    b = generate(options(seed=2))
    assert [m.value for m in a] != [m.value for m in b]
    ids_a = {json.loads(m.value)["event_id"] for m in a}
    ids_b = {json.loads(m.value)["event_id"] for m in b}
    assert not ids_a & ids_b


def test_the_same_seed_from_another_start_gets_new_event_ids() -> None:
    ids_a = {json.loads(m.value)["event_id"] for m in generate(options())}
    ids_b = {json.loads(m.value)["event_id"] for m in generate(options(start_time_ms=START + 1))}
    assert not ids_a & ids_b


def test_each_iteration_restarts_from_the_seed() -> None:
    stream = EventStream(options(**ALL_FAULTS), wall_clock=lambda: NOW)
    assert [m.value for m in stream] == [m.value for m in stream]


# --- the event -----------------------------------------------------------------------------------


def test_a_valid_event_has_exactly_the_documented_fields_and_types() -> None:
    msg = generate(options(count=1))[0]
    event = json.loads(msg.value)
    assert set(event) == set(TYPES)
    assert event["schema_version"] == 1
    assert event["device_id"] == "dev-00001" and event["parcel_id"] == "parcel-001"
    assert event["seq"] == 1 and event["event_time"] == START
    assert msg.key == b"dev-00001"
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", event["event_id"])
    assert violations(msg.value) == []


def test_every_valid_event_passes_every_rule_and_keys_by_device() -> None:
    for m in generate(options(**ALL_FAULTS)):
        if m.kind in MALFORMED_KINDS:
            continue
        assert violations(m.value) == [], m.value
        assert m.key == json.loads(m.value)["device_id"].encode()


def test_values_stay_in_range_with_two_decimals_over_a_year_of_simulated_time() -> None:
    opts = options(devices=50, parcels=7, count=60_000, step_ms=10 * MINUTE, late_rate=0.1)
    msgs = generate(opts, clock_ms=START + 400 * DAY)
    assert msgs[-1].event_time - START > 300 * DAY
    decimals = re.compile(
        rb'"(air_temperature_c|air_humidity_pct|soil_nitrogen_mg_kg|soil_salinity_ds_m|battery_v)'
        rb'":(-?\d+\.\d\d)[,}]'
    )
    for m in msgs:
        event = json.loads(m.value)
        for name, (low, high) in RANGES.items():
            assert low <= event[name] <= high, (name, event)
        assert len(decimals.findall(m.value)) == 5, m.value


def test_devices_sit_on_parcels_round_robin() -> None:
    msgs = generate(options(devices=7, parcels=3, count=700))
    parcel_of = {json.loads(m.value)["device_id"]: json.loads(m.value)["parcel_id"] for m in msgs}
    assert len(parcel_of) == 7
    assert parcel_of["dev-00001"] == parcel_of["dev-00004"] == parcel_of["dev-00007"] == "parcel-001"
    assert parcel_of["dev-00003"] == "parcel-003"
    assert set(Counter(json.loads(m.value)["device_id"] for m in msgs).values()) == {100}


def test_signals_follow_a_daily_cycle_and_humidity_opposes_temperature() -> None:
    opts = options(devices=1, parcels=1, count=2 * 1440, step_ms=MINUTE)
    events = [json.loads(m.value) for m in generate(opts, clock_ms=START + 10 * DAY)]
    hour = [(e["event_time"] // HOUR) % 24 for e in events]
    temps = [e["air_temperature_c"] for e in events]
    afternoon = statistics.mean(t for t, h in zip(temps, hour, strict=True) if h == 15)
    night = statistics.mean(t for t, h in zip(temps, hour, strict=True) if h == 3)
    assert afternoon - night > 10
    humid = [e["air_humidity_pct"] for e in events]
    assert statistics.correlation(temps, humid) < -0.8
    steps = [abs(b - a) for a, b in itertools.pairwise(temps)]
    assert max(steps) < 1.0  # smooth from one minute to the next


def test_battery_discharges_and_nitrogen_drifts_slowly() -> None:
    opts = options(devices=1, parcels=1, count=25, step_ms=6 * HOUR)
    events = [json.loads(m.value) for m in generate(opts, clock_ms=START + 10 * DAY)]
    battery = [e["battery_v"] for e in events]
    drops = [a - b for a, b in itertools.pairwise(battery)]
    assert sum(d > 0 for d in drops) >= 22  # falls step after step, but for at most two battery swaps
    nitrogen = [e["soil_nitrogen_mg_kg"] for e in events]
    assert max(abs(b - a) for a, b in itertools.pairwise(nitrogen)) < 4
    assert len(set(nitrogen)) > 10


def test_event_time_steps_from_the_start_and_never_passes_the_wall_clock() -> None:
    msgs = generate(options(count=1000, step_ms=2.5), clock_ms=START + 1000)
    times = [m.event_time for m in msgs]
    assert times[:3] == [START, START + 2, START + 5]
    assert max(times) == START + 1000
    assert times == sorted(times)
    assert all(json.loads(m.value)["event_time"] == m.event_time for m in msgs)


def test_the_wall_clock_is_read_again_once_the_simulation_catches_up() -> None:
    readings = iter(range(START, START + 10**9, 10))  # advances 10 ms per reading

    msgs = list(EventStream(options(count=300, step_ms=1.0), wall_clock=lambda: next(readings)))
    times = [m.event_time for m in msgs]
    assert times == sorted(times)
    assert times[-1] > START + 250  # not stuck at the first reading


# --- faults: exact accounting --------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_summary_counts_match_an_independent_recount_of_the_stream(seed: int) -> None:
    opts = options(seed=seed, count=30_000, **ALL_FAULTS)
    msgs = generate(opts)
    summary = simulate(opts, wall_clock=lambda: NOW)
    expected = recount(msgs, opts)
    for key, value in expected.items():
        assert summary[key] == value, key
    assert summary["duplicates"] > 1000 and summary["late"] > 800 and summary["out_of_order"] > 1000
    assert min(summary["malformed_by_kind"].values()) > 200
    assert summary["delivery_failed"] == 0
    assert summary["sent_total"] == summary["valid_distinct"] + summary["duplicates"] + summary["malformed_total"]


def test_message_kinds_agree_with_what_the_bytes_show() -> None:
    msgs = generate(options(count=20_000, **ALL_FAULTS))
    seen: set[str] = set()
    for m in msgs:
        reasons = violations(m.value)
        if m.kind in MALFORMED_KINDS:
            assert reasons == [REASON_BY_KIND[m.kind]]
            continue
        assert reasons == []
        eid = json.loads(m.value)["event_id"]
        assert (m.kind == "duplicate") == (eid in seen)
        seen.add(eid)


def test_rates_are_roughly_the_fraction_of_messages() -> None:
    msgs = generate(options(count=40_000, **ALL_FAULTS))
    kinds = Counter(m.kind for m in msgs)
    assert kinds["duplicate"] / 40_000 == pytest.approx(0.06, abs=0.01)
    assert kinds["late"] / 40_000 == pytest.approx(0.04, abs=0.01)
    assert sum(kinds[k] for k in MALFORMED_KINDS) / 40_000 == pytest.approx(0.06, abs=0.01)


def test_zero_rates_give_a_clean_stream() -> None:
    msgs = generate(options(count=5000))
    assert {m.kind for m in msgs} == {"valid"}
    assert len({json.loads(m.value)["event_id"] for m in msgs}) == 5000


def test_count_is_exact_even_with_held_back_events() -> None:
    for count in (1, 2, 7, 999):
        assert len(generate(options(count=count, out_of_order_rate=0.5, duplicate_rate=0.2))) == count


def test_seq_runs_from_one_without_gaps_per_device_and_only_reordered_events_go_back() -> None:
    msgs = generate(options(count=20_000, **ALL_FAULTS))
    seqs: dict[str, list[int]] = defaultdict(list)
    for m in msgs:
        if m.kind in MALFORMED_KINDS or m.kind == "duplicate":
            continue
        event = json.loads(m.value)
        previous = seqs[event["device_id"]]
        if previous and event["seq"] < previous[-1]:
            assert m.kind == "out_of_order"
        else:
            assert m.kind != "out_of_order"
        previous.append(event["seq"])
    for device, values in seqs.items():
        assert sorted(values) == list(range(1, len(values) + 1)), device


def test_out_of_order_events_arrive_right_after_their_device_s_next_event() -> None:
    msgs = generate(options(count=20_000, out_of_order_rate=0.1))
    reordered = [i for i, m in enumerate(msgs) if m.kind == "out_of_order"]
    assert len(reordered) > 1000
    for i in reordered:
        held, newer = json.loads(msgs[i].value), json.loads(msgs[i - 1].value)
        assert newer["device_id"] == held["device_id"]
        assert newer["seq"] == held["seq"] + 1
        assert newer["event_time"] > held["event_time"]  # a newer event arrived first


def test_held_events_left_at_the_end_are_flushed_as_plain_valid_events() -> None:
    opts = options(devices=50, parcels=5, count=60, out_of_order_rate=0.9)
    msgs = generate(opts)
    ids = [json.loads(m.value)["event_id"] for m in msgs]
    assert len(ids) == len(set(ids)) == 60
    # 50 devices, 60 messages: most held events never see a newer event of their device.
    assert sum(m.kind == "valid" for m in msgs) > 30
    assert 0 < sum(m.kind == "out_of_order" for m in msgs) == recount(msgs, opts)["out_of_order"]


def test_late_events_are_5_minutes_to_6_hours_behind_the_clock_and_take_the_next_seq() -> None:
    opts = options(count=20_000, late_rate=0.2)
    msgs = generate(opts)
    lags = []
    last_seq: dict[int, int] = defaultdict(int)
    for m in msgs:
        event = json.loads(m.value)
        lag = START + event_number(event["event_id"]) - event["event_time"]
        if m.kind == "late":
            lags.append(lag)
        else:
            assert lag == 0
        assert event["seq"] == last_seq[m.device] + 1
        last_seq[m.device] = event["seq"]
    assert len(lags) > 3000
    assert min(lags) >= 5 * MINUTE and max(lags) <= 6 * HOUR
    assert max(lags) - min(lags) > 5 * HOUR  # spread over the whole window


def test_duplicates_are_byte_identical_resends_of_earlier_valid_messages_from_far_back() -> None:
    msgs = generate(options(count=40_000, duplicate_rate=0.1, late_rate=0.05, out_of_order_rate=0.05))
    first: dict[str, tuple[int, Message]] = {}
    distances = []
    for i, m in enumerate(msgs):
        eid = json.loads(m.value)["event_id"]
        if m.kind == "duplicate":
            j, original = first[eid]
            assert original.kind in ("valid", "late", "out_of_order")
            assert (m.key, m.value) == (original.key, original.value)
            distances.append(i - j)
        else:
            assert eid not in first
            first[eid] = (i, m)
    assert len(distances) > 3000
    assert max(distances) > 5000  # from a long history, not just the previous message
    assert max(distances) <= 10_000 * 1.25  # bounded: the last 10k valid messages (plus interleaved others)
    q1, _, q3 = statistics.quantiles(distances, n=4)
    assert 1500 < q1 < 4500 and 6000 < q3 < 10_000  # spread over that history
    originals = {json.loads(m.value)["event_id"] for m in msgs if m.kind == "duplicate"}
    assert len(originals) > 0.8 * len(distances)  # rarely the same one twice


def test_duplicates_wait_for_something_to_duplicate() -> None:
    msgs = generate(options(count=50, duplicate_rate=1.0))
    assert msgs[0].kind == "valid"
    assert all(m.kind == "duplicate" and m.value == msgs[0].value for m in msgs[1:])


# --- malformed kinds -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", MALFORMED_KINDS)
def test_each_malformed_kind_breaks_exactly_one_rule(kind: str) -> None:
    msgs = generate(options(count=200, malformed_rate=1.0, malformed_kinds=(kind,)))
    assert {m.kind for m in msgs} == {kind}
    ids = set()
    for m in msgs:
        assert violations(m.value) == [REASON_BY_KIND[kind]], m.value
        m.value.decode("utf-8")
        ids.add(re.search(rb'"event_id": ?"([^"]+)"', m.value).group(1))  # type: ignore[union-attr]
    assert len(ids) == 200  # each has its own event_id


def test_malformed_payloads_say_what_they_claim() -> None:
    by_kind = {k: generate(options(count=1, malformed_rate=1.0, malformed_kinds=(k,)))[0] for k in MALFORMED_KINDS}
    with pytest.raises(ValueError):
        json.loads(by_kind["not_json"].value)
    assert isinstance(json.loads(by_kind["wrong_type"].value)["air_temperature_c"], str)
    float(json.loads(by_kind["wrong_type"].value)["air_temperature_c"])  # a number given as a string
    assert "device_id" not in json.loads(by_kind["missing_field"].value)
    assert json.loads(by_kind["out_of_range"].value)["air_temperature_c"] == 500
    future = json.loads(by_kind["future_time"].value)["event_time"]
    assert 4_102_444_800_000 <= future < 4_133_980_800_000  # in the year 2100
    ancient = json.loads(by_kind["ancient_time"].value)["event_time"]
    assert 0 < ancient < 31_536_000_000  # in 1970


def test_malformed_events_do_not_consume_seq_or_count_as_latest() -> None:
    opts = options(devices=3, parcels=1, count=3000, malformed_rate=0.5)
    msgs = generate(opts)
    summary = simulate(opts, wall_clock=lambda: NOW)
    valid = [json.loads(m.value) for m in msgs if m.kind == "valid"]
    for device in ("dev-00001", "dev-00002", "dev-00003"):
        seqs = [e["seq"] for e in valid if e["device_id"] == device]
        assert seqs == list(range(1, len(seqs) + 1))
        newest = max((e["event_time"], e["seq"]) for e in valid if e["device_id"] == device)
        assert summary["latest_by_device"][device] == {"event_time": newest[0], "seq": newest[1]}
    assert summary["valid_distinct"] == len(valid)


def test_latest_by_device_takes_late_events_when_they_are_the_newest() -> None:
    opts = options(devices=5, parcels=1, count=5, late_rate=1.0)
    msgs = generate(opts)
    assert {m.kind for m in msgs} == {"late"}
    expected = {m.key.decode(): {"event_time": m.event_time, "seq": 1} for m in msgs}
    assert simulate(opts, wall_clock=lambda: NOW)["latest_by_device"] == expected


def test_all_kinds_appear_when_all_are_enabled() -> None:
    kinds = Counter(m.kind for m in generate(options(count=3000, malformed_rate=0.5)))
    assert all(kinds[k] > 100 for k in MALFORMED_KINDS)


# --- schema drift --------------------------------------------------------------------------------


def test_added_fields_ride_on_every_valid_event_only() -> None:
    opts = options(count=5000, added_fields=("soil_ph", "leaf_wetness"), **ALL_FAULTS)
    msgs = generate(opts)
    for m in msgs:
        event: Any = None
        if m.kind != "not_json":
            event = json.loads(m.value)
        if m.kind in MALFORMED_KINDS:
            assert event is None or not {"soil_ph", "leaf_wetness"} & set(event)
            assert violations(m.value) == [REASON_BY_KIND[m.kind]]  # still exactly one reason
            continue
        assert isinstance(event["soil_ph"], float) and isinstance(event["leaf_wetness"], float)
        assert violations(m.value, allowed_extra=("soil_ph", "leaf_wetness")) == []
        assert sorted(violations(m.value)) == ["unexpected_field:leaf_wetness", "unexpected_field:soil_ph"]
    assert simulate(opts, wall_clock=lambda: NOW)["added_fields"] == ["soil_ph", "leaf_wetness"]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("bad name",), "not a valid field name"),
        (("9lives",), "not a valid field name"),
        (("seq",), "already a field"),
        (("x", "x"), "given twice"),
    ],
)
def test_bad_added_field_names_are_refused(names: tuple[str, ...], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        options(added_fields=names)


# --- stop, accounting with failures --------------------------------------------------------------


def test_stop_ends_an_endless_stream_after_flushing_held_events() -> None:
    stream = EventStream(options(count=None, out_of_order_rate=0.3), wall_clock=lambda: NOW)
    taken = []
    for m in stream:
        taken.append(m)
        if len(taken) == 5000:
            stream.stop()
    assert 5000 < len(taken) <= 5000 + 20  # at most one held event per device follows
    tail = Counter(m.kind for m in taken[5000:])
    assert tail["valid"] >= 1 and tail["out_of_order"] <= 1 and tail.total() == tail["valid"] + tail["out_of_order"]
    per_device: dict[int, list[int]] = defaultdict(list)
    for m in taken:
        per_device[m.device].append(m.seq)
    assert all(sorted(s) == list(range(1, len(s) + 1)) for s in per_device.values())


def test_accounting_counts_only_acknowledged_messages() -> None:
    opts = options(count=2000, **ALL_FAULTS)
    msgs = generate(opts)
    acc = Accounting(opts)
    acked = []
    for i, m in enumerate(msgs):
        if i % 10 == 3 and m.kind != "duplicate":
            acc.fail(m, "MSG_TIMED_OUT")
        else:
            acc.ack(m)
            acked.append(m)
    s = acc.summary(elapsed_s=1.0, backend="test")
    assert s["sent_total"] == len(acked)
    assert s["delivery_failed"] == len(msgs) - len(acked)
    assert s["delivery_errors"] == {"MSG_TIMED_OUT": len(msgs) - len(acked)}
    valid_ids = {m.valid_id for m in acked if m.kind not in MALFORMED_KINDS}
    assert s["valid_distinct"] == len(valid_ids)
    assert s["valid_distinct"] + s["duplicates"] + s["malformed_total"] == s["sent_total"]
    latest: dict[str, tuple[int, int]] = {}
    for m in acked:
        if m.kind not in MALFORMED_KINDS:
            device = m.key.decode()
            latest[device] = max(latest.get(device, (-1, 0)), (m.event_time, m.seq))
    assert s["latest_by_device"] == {d: {"event_time": t, "seq": q} for d, (t, q) in latest.items()}


def test_a_duplicate_stands_in_for_its_failed_original() -> None:
    opts = options(count=10)
    original = generate(opts)[0]
    duplicate = original._replace(kind="duplicate")
    acc = Accounting(opts)
    acc.fail(original, "REQUEST_TIMED_OUT")
    acc.ack(duplicate)
    acc.ack(duplicate)
    acc.unconfirmed(2)
    s = acc.summary(elapsed_s=0.5, backend="test")
    assert (s["valid_distinct"], s["duplicates"], s["sent_total"]) == (1, 1, 2)
    assert s["delivery_failed"] == 3
    assert s["delivery_errors"] == {"REQUEST_TIMED_OUT": 1, "unconfirmed_at_exit": 2}
    assert s["latest_by_device"] == {"dev-00001": {"event_time": START, "seq": 1}}
    assert s["msgs_per_s"] == 4.0


def test_summary_has_every_documented_key() -> None:
    s = simulate(options(count=10), wall_clock=lambda: NOW, backend="x", topic="t")
    for key in (
        "sent_total",
        "valid_distinct",
        "duplicates",
        "out_of_order",
        "late",
        "malformed_total",
        "malformed_by_kind",
        "latest_by_device",
        "delivery_failed",
        "backend",
        "seed",
        "topic",
        "start_time_ms",
        "elapsed_s",
        "msgs_per_s",
        "added_fields",
    ):
        assert key in s, key
    assert set(s["malformed_by_kind"]) == set(MALFORMED_KINDS)
    assert (s["seed"], s["start_time_ms"], s["backend"], s["topic"]) == (42, START, "x", "t")
    json.dumps(s)


# --- options -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"devices": 0}, "--devices must be at least 1"),
        ({"parcels": 0}, "--parcels must be at least 1"),
        ({"parcels": 30}, "exceeds --devices"),
        ({"count": 0}, "--count must be at least 1"),
        ({"late_rate": 1.5}, r"--late-rate must be within \[0, 1\]"),
        ({"duplicate_rate": -0.1}, r"--duplicate-rate must be within \[0, 1\]"),
        ({"duplicate_rate": 0.6, "malformed_rate": 0.6}, "add up to 1.2"),
        ({"malformed_kinds": ("not_json", "nope")}, "unknown kind"),
        ({"malformed_kinds": ()}, "empty"),
        ({"step_ms": math.nan}, "--time-step-ms"),
    ],
)
def test_invalid_options_name_the_flag(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        options(**overrides)


def test_start_time_accepts_epoch_ms_iso_and_now() -> None:
    assert parse_start_time("1764500000000", NOW) == START
    assert parse_start_time("2025-11-30T10:53:20Z", NOW) == START
    assert parse_start_time("2025-11-30T11:53:20+01:00", NOW) == START
    assert parse_start_time("2025-11-30T10:53:20", NOW) == START  # naive = UTC
    assert parse_start_time("now", NOW) == NOW
    with pytest.raises(UsageError, match="neither epoch milliseconds nor ISO-8601"):
        parse_start_time("yesterday", NOW)


def test_workers_share_the_devices_and_number_their_events_as_one_run() -> None:
    """--workers: each worker sends its own devices; event ids and event times are those of one run's numbering."""
    start, step, workers = 1_700_000_000_000, 2.0, 3
    base = SimOptions(seed=5, start_time_ms=start, devices=10, parcels=2, count=400, step_ms=step)
    devices_of: list[set[int]] = []
    numbers: list[int] = []
    for w in range(workers):
        opts = SimOptions(**{**base.__dict__, "worker": w, "workers": workers})
        msgs = list(EventStream(opts, wall_clock=lambda: 2 * start))
        devices_of.append({m.device for m in msgs})
        for m in msgs:
            event = json.loads(m.value)
            g = int(event["event_id"][-12:], 16)  # the event's number in the whole run
            assert g % workers == w
            assert event["event_time"] == start + int(g * step)
            numbers.append(g)
        seqs: dict[int, list[int]] = defaultdict(list)
        for m in msgs:
            seqs[m.device].append(m.seq)
        assert all(s == list(range(1, len(s) + 1)) for s in seqs.values())  # every device's seq, gap-free
    assert [sorted(d) for d in devices_of] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert len(numbers) == len(set(numbers)) == workers * 400


def test_one_worker_is_the_run_without_workers() -> None:
    opts = SimOptions(seed=9, start_time_ms=1_700_000_000_000, count=2000, duplicate_rate=0.1, malformed_rate=0.1)
    same = SimOptions(**{**opts.__dict__, "worker": 0, "workers": 1})
    assert list(EventStream(opts, _late_clock)) == list(EventStream(same, _late_clock))


def _late_clock() -> int:
    """A wall clock far ahead of the simulated time: no event time is capped."""
    return 1_800_000_000_000


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"workers": 0}, "--workers must be at least 1"),
        ({"workers": 11}, r"--workers \(11\) exceeds --devices \(10\)"),
        ({"workers": 2, "worker": 2}, "worker 2 is not one of the 2 workers"),
    ],
)
def test_bad_worker_options_name_the_flag(changes: dict[str, int], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        SimOptions(
            seed=1, start_time_ms=0, devices=10, parcels=2, worker=changes.get("worker", 0), workers=changes["workers"]
        )


def test_worker_summaries_merge_into_the_runs() -> None:
    from producers.accounting import merge_summaries

    parts = []
    for w in range(2):
        opts = SimOptions(seed=4, start_time_ms=1_700_000_000_000, devices=6, parcels=2, count=3000 + w,
                          duplicate_rate=0.1, late_rate=0.1, malformed_rate=0.1, worker=w, workers=2)  # fmt: skip
        parts.append({**simulate(opts, wall_clock=_late_clock), "produced_total": 3000 + w})
    parts[1]["delivery_failed"], parts[1]["delivery_errors"] = 2, {"_MSG_TIMED_OUT": 2}
    parts[0]["elapsed_s"], parts[1]["elapsed_s"] = 2.0, 3.0
    merged = merge_summaries(parts)
    for key in ("sent_total", "valid_distinct", "duplicates", "late", "out_of_order", "malformed_total"):
        assert merged[key] == parts[0][key] + parts[1][key], key
    assert merged["sent_total"] == merged["produced_total"] == 6001
    kinds = merged["malformed_by_kind"]
    assert all(kinds[k] == parts[0]["malformed_by_kind"][k] + parts[1]["malformed_by_kind"][k] for k in kinds)
    assert (merged["delivery_failed"], merged["delivery_errors"]) == (2, {"_MSG_TIMED_OUT": 2})
    assert merged["latest_by_device"] == {**parts[0]["latest_by_device"], **parts[1]["latest_by_device"]}
    assert len(merged["latest_by_device"]) == 6
    assert (merged["elapsed_s"], merged["msgs_per_s"], merged["workers"]) == (3.0, round(6001 / 3.0, 1), 2)


# --- delivery reports matched to sent messages (confluent) ---------------------------------------


def in_flight_of(msgs: list[Message]) -> InFlight:
    flight = InFlight()
    for m in msgs:
        flight.by_key[m.key].append(m)
    return flight


def test_a_report_belongs_to_the_oldest_unreported_message_of_its_key() -> None:
    msgs = generate(options(count=300, devices=5, **ALL_FAULTS))
    flight = in_flight_of(msgs)
    by_key: dict[bytes, list[Message]] = defaultdict(list)
    for m in msgs:
        by_key[m.key].append(m)
    # Keys interleaved in another order than sent, each key's reports in its own send order.
    taken = [flight.take(key, m.value) for key in reversed(by_key) for m in by_key[key]]
    assert taken == [m for key in reversed(by_key) for m in by_key[key]]
    assert all(not queue for queue in flight.by_key.values())


def test_a_duplicate_and_its_original_are_taken_in_send_order() -> None:
    original = generate(options(count=1))[0]
    duplicate = original._replace(kind="duplicate")
    flight = in_flight_of([original, duplicate])
    assert flight.take(original.key, original.value).kind == "valid"
    assert flight.take(original.key, original.value).kind == "duplicate"


def test_a_report_out_of_its_keys_order_still_finds_its_message() -> None:
    msgs = generate(options(count=40, devices=1, parcels=1))
    flight = in_flight_of(msgs)
    assert flight.take(msgs[5].key, msgs[5].value) is msgs[5]
    assert [flight.take(m.key, m.value) for m in msgs if m is not msgs[5]] == [m for m in msgs if m is not msgs[5]]


def test_a_report_for_a_message_never_sent_is_an_error_naming_the_key() -> None:
    msgs = generate(options(count=3))
    flight = in_flight_of(msgs[:2])
    with pytest.raises(DeliveryReportError, match=msgs[2].key.decode()):
        flight.take(msgs[2].key, msgs[2].value)
    with pytest.raises(DeliveryReportError, match="no record of sending"):
        flight.take(None, None)
