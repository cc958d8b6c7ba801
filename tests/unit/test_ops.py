"""Table operations without Spark: names, timestamps, metrics, JSON, text tables, confirmation, errors, flags."""

from __future__ import annotations

import io
import sys
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from streaming.cli import build_parser, main
from streaming.core.catalog import lake_tables, resolve_table
from streaming.core.commit_tags import commit_tag, parse_tag, purged_device
from streaming.core.config import Settings, TableConfig, TablesConfig
from streaming.core.errors import (
    ConcurrentWriteError,
    ConfirmationRequiredError,
    InvalidTimestampError,
    StorageError,
    UnknownTableError,
    VersionNotFoundError,
)
from streaming.lake.ops import (
    DeleteReport,
    DeviceDeletion,
    HistoryEntry,
    Purge,
    RestoreResult,
    ShowResult,
    _delta_errors,
    confirm,
    format_delete_report,
    format_history,
    format_restore,
    format_show,
    jsonable,
    key_metrics,
    parse_timestamp,
    purge_warning,
    purges_in,
    text_table,
    vacuum_eligible_at,
)

pytestmark = pytest.mark.unit


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_tables_resolve_by_config_key_or_configured_name() -> None:
    settings = Settings(tables=replace(TablesConfig(), readings=TableConfig("sensor_readings", ("event_date",))))
    assert resolve_table(settings, "readings").name == "sensor_readings"
    assert resolve_table(settings, "sensor_readings").uri == "s3a://iotlake/lake/sensor_readings"
    assert [t.key for t in lake_tables(settings)] == ["readings", "device_state", "quarantine"]
    with pytest.raises(UnknownTableError, match=r"'sensors'.*sensor_readings, device_state, quarantine"):
        resolve_table(settings, "sensors")


def test_every_command_resolves_tables_through_the_catalog() -> None:
    """The sidecar's table list and the job's table locations follow the configured names too."""
    from streaming.lake.maintenance import table_specs

    settings = Settings(tables=replace(TablesConfig(), readings=TableConfig("sensor_readings", ("event_date",))))
    assert [s.name for s in table_specs(settings)] == ["sensor_readings", "device_state", "quarantine"]
    assert [s.name for s in table_specs(settings, "readings")] == ["sensor_readings"]
    with pytest.raises(UnknownTableError, match=r"'sensors'.*sensor_readings, device_state, quarantine"):
        table_specs(settings, "sensors")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-30T14:05:00Z", datetime(2026, 11, 30, 14, 5, tzinfo=UTC)),
        ("2026-11-30 14:05:00", datetime(2026, 11, 30, 14, 5, tzinfo=UTC)),
        ("2026-11-30T15:05:00+01:00", datetime(2026, 11, 30, 14, 5, tzinfo=UTC)),
        ("2026-11-30T14:05:00.250+00:00", datetime(2026, 11, 30, 14, 5, 0, 250_000, tzinfo=UTC)),
        ("1796047500000", datetime(2026, 11, 30, 14, 5, tzinfo=UTC)),
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),
    ],
)
def test_timestamps_parse_to_utc(text: str, expected: datetime) -> None:
    assert parse_timestamp(text) == expected


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "", "14:05"])
def test_a_bad_timestamp_names_the_accepted_forms(text: str) -> None:
    with pytest.raises(InvalidTimestampError, match=r"ISO-8601.*epoch milliseconds"):
        parse_timestamp(text)


def test_key_metrics_are_integers_in_a_stable_order() -> None:
    raw = {"numRemovedFiles": "4", "executionTimeMs": "10", "numTargetRowsInserted": "120", "odd": "x"}
    assert list(key_metrics(raw).items()) == [
        ("numTargetRowsInserted", 120),
        ("numRemovedFiles", 4),
        ("executionTimeMs", 10),
    ]
    assert key_metrics(None) == {} and key_metrics({"numFiles": "n/a"}) == {}


def test_vacuum_horizon_is_the_commit_plus_the_retention() -> None:
    commit = datetime(2026, 11, 30, 12, tzinfo=UTC)
    ms = int(commit.timestamp() * 1000)
    assert vacuum_eligible_at(ms, "interval 7 days") == commit + timedelta(days=7)
    assert vacuum_eligible_at(ms, "interval 1 week") == commit + timedelta(days=7)
    assert vacuum_eligible_at(ms, "36 hours") == commit + timedelta(hours=36)


def test_row_values_become_json() -> None:
    assert jsonable(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05+00:00"
    assert jsonable(date(2026, 1, 2)) == "2026-01-02"
    assert jsonable(b"dev-0001") == "dev-0001"
    assert jsonable(b"\xff\x00") == "base64:/wA="
    assert jsonable(Decimal("1.50")) == "1.50"
    assert jsonable({"a": [b"x", None]}) == {"a": ["x", None]}


def test_text_table_aligns_and_cuts_long_cells() -> None:
    out = text_table(["id", "value"], [[1, "short"], [22, "x" * 50]], max_width=10).splitlines()
    assert out[0] == "id  value"
    assert out[1] == "--  ----------"
    assert out[2] == "1   short"
    assert out[3] == "22  xxxxxxxxx…"


def test_confirm_with_yes_on_a_terminal_and_without_one() -> None:
    assert confirm("go?", assume_yes=True, stdin=io.StringIO(), stdout=io.StringIO(), refusal="r")
    shown = io.StringIO()
    assert confirm("Restore?", assume_yes=False, stdin=Terminal("yes\n"), stdout=shown, refusal="r")
    assert shown.getvalue() == "Restore? [y/N] "
    assert not confirm("Restore?", assume_yes=False, stdin=Terminal("\n"), stdout=io.StringIO(), refusal="r")
    with pytest.raises(ConfirmationRequiredError, match="no tty here"):
        confirm("Restore?", assume_yes=False, stdin=io.StringIO("y\n"), stdout=io.StringIO(), refusal="no tty here")


def test_delta_errors_become_iotlake_errors_naming_the_fix() -> None:
    table = resolve_table(Settings(), "readings")
    version_error = r"readings: \[DELTA_VERSION_NOT_FOUND\].*iotlake history"
    with pytest.raises(VersionNotFoundError, match=version_error), _delta_errors(table):
        raise RuntimeError("[DELTA_VERSION_NOT_FOUND] Cannot time travel Delta table to version 9.\nJVM stack")
    with pytest.raises(ConcurrentWriteError, match="run it again"), _delta_errors(table):
        raise RuntimeError("[DELTA_CONCURRENT_APPEND] Files were added to partition ...")
    with pytest.raises(StorageError, match=r"readings: Delta failed: .*iotlake status"), _delta_errors(table):
        raise RuntimeError("java.nio.file.AccessDeniedException: s3a://iotlake/lake/readings")
    # An error already explained passes through as it is, even when it quotes Delta's conflict.
    explained = ConcurrentWriteError("device_state: lost 8 times ([DELTA_CONCURRENT_APPEND] ...). Already purged: x")
    with pytest.raises(ConcurrentWriteError) as passed, _delta_errors(table):
        raise explained
    assert passed.value is explained


def test_formatting_for_people() -> None:
    entry = HistoryEntry(3, "2026-11-30T14:00:00.000+00:00", 1_796_000_000_000, "MERGE", {"numOutputRows": 5}, {})
    history = format_history("readings", [entry])
    assert history.splitlines()[0] == "history of readings (newest first)"
    assert "MERGE" in history and "numOutputRows=5" in history
    show = ShowResult("readings", 2, "2026-11-30T14:00:00.000+00:00", 10, ["device_id"], [["d1"]], device="d1")
    assert format_show(show).startswith("readings at version 2, committed 2026-11-30T14:00:00.000+00:00: 10 row(s)")
    assert "where device_id = 'd1'" in format_show(show) and "(first 1 shown)" in format_show(show)
    report = DeleteReport(
        "d1",
        [
            DeviceDeletion(
                "readings", "device_id", 7, 12, "t", 3, 4096, vacuum_eligible_at="2026-12-07T14:00:00+00:00"
            ),
            DeviceDeletion("quarantine", "raw_key", 0),
        ],
    )
    text = format_delete_report(report)
    assert text.startswith("deleted device 'd1': 7 row(s)")
    assert "VACUUM after 2026-12-07T14:00:00+00:00" in text
    assert report.as_dict()["rows_deleted"] == 7
    assert "retries" in text.splitlines()[1] and "arrived" not in text

    # Conflicts retried and rows that came in beside the purge are both reported.
    busy = DeleteReport(
        "d1",
        [
            DeviceDeletion("readings", "device_id", 7, 12, "t", 3, 4096, retries=2, rows_remaining=3),
            DeviceDeletion("device_state", "device_id", 1, 5, "t", 1, 100, retries=1),
        ],
    )
    assert busy.retries == 3 and busy.as_dict()["retries"] == 3 and busy.rows_remaining == 3
    text = format_delete_report(busy)
    assert "after 3 retried conflict(s) with other writers" in text
    assert "3 row(s) of device 'd1' arrived while or after it was purged (readings: 3)" in text
    assert "run `iotlake delete-device d1 --yes` again" in text

    restored = RestoreResult("readings", 4, 9, 10, 100, {}, [Purge(8, "dev-7", None), Purge(6, None, None)])
    assert format_restore(restored).endswith("; purged device(s) back in the table: 'dev-7', an unnamed device")


def test_commit_tags_carry_the_operation_and_its_details() -> None:
    tag = commit_tag("delete-device", device_id="dev 7 'x'")
    assert tag.startswith("iotlake delete-device ")
    assert parse_tag(tag) == ("delete-device", {"device_id": "dev 7 'x'"})
    assert commit_tag("restore") != commit_tag("restore")  # unique per commit
    assert parse_tag(commit_tag("restore")) == ("restore", {})
    assert parse_tag("iotlake delete-device 0123abcd") == ("delete-device", {})  # tags before devices were named
    assert parse_tag("iotlake delete-device 0123abcd {not json") == ("delete-device", {})
    assert purged_device(commit_tag("delete-device", device_id="dev-7")) == "dev-7"
    assert purged_device(commit_tag("restore", device_id="dev-7")) is None
    assert purged_device("iotlake delete-device 0123abcd") is None  # a tag from before devices were named
    for other in (None, "", "nightly backfill", "iotlake"):
        assert parse_tag(other) is None


def test_purges_are_the_delete_device_commits() -> None:
    def commit(version: int, operation: str, user_metadata: str | None = None) -> dict[str, object]:
        entry = {"version": version, "timestamp": 1_796_000_000_000 + (version - 5) * 50_000, "operation": operation}
        return entry if user_metadata is None else {**entry, "userMetadata": user_metadata}

    commits = [
        commit(9, "MERGE"),
        commit(8, "DELETE", commit_tag("delete-device", device_id="dev-7")),
        commit(7, "RESTORE", commit_tag("restore")),
        commit(6, "DELETE", "iotlake delete-device 0123abcd"),  # tagged before the device was recorded
        commit(5, "DELETE"),  # not ours: someone's own DELETE
    ]
    purges = purges_in(commits)
    assert purges == [
        Purge(6, None, "2026-11-30T00:54:10.000+00:00"),
        Purge(8, "dev-7", "2026-11-30T00:55:50.000+00:00"),
    ]
    warning = purge_warning("readings", 4, purges)
    assert warning.startswith("Restoring readings to version 4 brings back rows that `iotlake delete-device` purged")
    assert "'dev-7' (purged at version 8, 2026-11-30T00:55:50.000+00:00)" in warning
    assert "a device not recorded in the commit (purged at version 6" in warning
    assert "iotlake delete-device dev-7 --yes" in warning


def test_flags() -> None:
    parser = build_parser()
    args = parser.parse_args(["show", "readings", "--timestamp", "2026-11-30", "--device", "d1", "--json"])
    assert (args.version, args.timestamp, args.device, args.limit, args.json) == (None, "2026-11-30", "d1", 20, True)
    args = parser.parse_args(["changes", "device_state", "--from-version", "3"])
    assert (args.from_version, args.to_version, args.limit) == (3, None, 50)
    assert parser.parse_args(["history", "readings"]).limit == 20
    assert parser.parse_args(["delete-device", "d1", "--yes"]).yes is True
    assert parser.parse_args(["delete-device", "d1"]).attempts == 8
    assert parser.parse_args(["delete-device", "d1", "--attempts", "20"]).attempts == 20


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "readings"], "one of the arguments --version --timestamp is required"),
        (["show", "readings", "--version", "1", "--timestamp", "x"], "not allowed with argument"),
        (["show", "readings", "--version", "-1"], "versions start at 0"),
        (["restore", "readings"], "the following arguments are required: --version"),
        (["changes", "readings", "--from-version", "one"], "'one' is not a version number"),
        (["delete-device", " "], "the device id is empty"),
        (["delete-device", "d1", "--attempts", "0"], "at least one attempt"),
    ],
)
def test_bad_flags_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_errors_found_before_spark_exit_2_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO())
    monkeypatch.setattr("streaming.lake.ops.purges_after", lambda settings, table, version: (5, []))
    monkeypatch.setattr("streaming.core.session.build_session", lambda *a, **k: pytest.fail("started Spark first"))
    assert main(["history", "sensors"]) == 2
    assert capsys.readouterr().err.startswith("iotlake: error: Unknown table 'sensors'.")
    assert main(["show", "readings", "--timestamp", "soon"]) == 2
    assert "--timestamp 'soon' is not a time" in capsys.readouterr().err
    assert main(["restore", "readings", "--version", "2"]) == 2
    err = capsys.readouterr().err
    assert "stdin is not a terminal" in err and "Add --yes" in err and "Traceback" not in err
    assert main(["delete-device", "d1"]) == 2
    assert "Add --yes" in capsys.readouterr().err
    assert main(["restore", "readings", "--version", "6"]) == 2
    assert "readings has no version 6: its newest version is 5" in capsys.readouterr().err


def test_restore_across_a_purge_is_refused_unattended_naming_the_device(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO())
    purges = [Purge(8, "dev-7", "2026-11-30T00:55:50.000+00:00")]
    monkeypatch.setattr("streaming.lake.ops.purges_after", lambda settings, table, version: (9, purges))
    monkeypatch.setattr("streaming.core.session.build_session", lambda *a, **k: pytest.fail("started Spark first"))
    assert main(["restore", "readings", "--version", "4"]) == 2
    err = capsys.readouterr().err
    assert "stdin is not a terminal" in err and "Add --yes" in err and "Traceback" not in err
    assert "'dev-7' (purged at version 8" in err


def test_writes_are_refused_before_spark_when_the_log_store_is_single_driver(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("IOTLAKE_STORAGE__LOG_STORE", "single_driver")
    monkeypatch.setattr("streaming.core.session.build_session", lambda *a, **k: pytest.fail("started Spark first"))
    assert main(["restore", "readings", "--version", "1", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "`iotlake restore` / `delete-device` writes beside the stream" in err and "put_if_absent" in err
    assert main(["delete-device", "d1", "--yes"]) == 2
    assert "single_driver" in capsys.readouterr().err
