"""Two writer processes on one Delta table on MinIO: the put-if-absent log store loses nothing.

(a) The forced race at the log-store level: two JVMs write the same `_delta_log/N.json` at the same instant,
    round after round. PutIfAbsentLogStore: exactly one wins each round, the other gets
    FileAlreadyExistsException. Negative control, Delta's S3SingleDriverLogStore: both "win" in some round,
    so one commit was silently overwritten.
(b) Two Spark drivers, built by streaming.core.session with the default config, append concurrently to one table:
    every commit and every row is there.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import pytest
from deltalake import DeltaTable

from streaming.core import logstore
from streaming.core.config import PROJECT_ROOT, Settings, load_settings, resolve_path
from streaming.core.preflight import minio_client
from streaming.core.session import session_conf
from streaming.core.storage import delta_rs_uri, delta_storage_options, storage_credentials

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HARNESS = Path(__file__).parent / "jvm" / "LogStoreRace.java"
SINGLE_DRIVER_CLASS = "io.delta.storage.S3SingleDriverLogStore"
ROUNDS = 15
WRITERS = ("a", "b")


def _version_file(version: int) -> str:
    return f"{version:020d}.json"


@pytest.fixture(scope="module")
def harness_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The classpath of one race writer: Spark's jars, delta-storage + S3A + AWS SDK, the log store, the harness."""
    base = load_settings()  # for spark.ivy_cache; IOTLAKE_* overrides apply
    jar, _ = logstore.ensure_jar(base)
    classes = tmp_path_factory.mktemp("race-classes")
    compile_cp = [*logstore.compile_classpath(base), jar]
    javac = [str(logstore.find_javac()), "-nowarn", "-cp", os.pathsep.join(map(str, compile_cp))]
    subprocess.run(
        [*javac, "-d", str(classes), str(HARNESS)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    ivy_jars = resolve_path(base.spark.ivy_cache) / "jars"
    sdk = sorted(ivy_jars.glob("software.amazon.*.jar"))
    return os.pathsep.join(map(str, [*compile_cp, *sdk, classes]))


def _hadoop_properties(settings: Settings, path: Path) -> Path:
    """The session's `spark.hadoop.*` conf (endpoint, S3A options) and the writer's key as a Hadoop properties
    file."""
    lines = [
        f"{key.removeprefix('spark.hadoop.')}={value}"
        for key, value in session_conf(settings).items()
        if key.startswith("spark.hadoop.")
    ]
    lines += [f"{key}={value}" for key, value in storage_credentials(settings).items()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


class RaceWriter:
    """One JVM driving a LogStore: send "PATH START_MS", read "PATH outcome"."""

    def __init__(self, classpath: str, store_class: str, conf: Path, writer: str, log: Path) -> None:
        self.writer = writer
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", classpath, "LogStoreRace", store_class, str(conf), writer],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        assert self._read() == "ready", f"writer {writer} did not start; see {log}"

    def _read(self) -> str:
        out: IO[str] | None = self.proc.stdout
        assert out is not None
        return out.readline().strip()

    def send(self, path: str, start_ms: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{path} {start_ms}\n")
        self.proc.stdin.flush()

    def outcome(self, path: str) -> str:
        line = self._read()
        assert line.startswith(path + " "), f"writer {self.writer}: unexpected answer {line!r}; see {self.log.name}"
        return line.removeprefix(path + " ")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _race(settings: Settings, classpath: str, store_class: str, tmp_path: Path) -> list[dict[str, str]]:
    """Both writers write versions 2..ROUNDS+1 of a fresh log at the same instant; one result per round."""
    s = settings.storage
    prefix = f"{s.base_uri.removeprefix(f's3a://{s.bucket}/').rstrip('/')}/race-{uuid.uuid4().hex[:8]}/_delta_log"
    client = minio_client(settings)
    # Version 0 by hand: S3SingleDriverLogStore refuses to list a _delta_log folder that doesn't exist yet.
    client.put_object(s.bucket, f"{prefix}/{_version_file(0)}", io.BytesIO(b"{}\n"), 3)
    conf = _hadoop_properties(settings, tmp_path / f"hadoop-{store_class.rsplit('.', 1)[-1]}.properties")
    writers = [
        RaceWriter(classpath, store_class, conf, w, tmp_path / f"{store_class.rsplit('.', 1)[-1]}-{w}.log")
        for w in WRITERS
    ]
    results: list[dict[str, str]] = []
    try:
        for version in range(1, ROUNDS + 2):  # version 1 warms both JVMs (S3 client, classes) and isn't counted
            key = f"{prefix}/{_version_file(version)}"
            path = f"s3a://{s.bucket}/{key}"
            start_ms = int(time.time() * 1000) + 300
            for w in writers:
                w.send(path, start_ms)
            answers = {w.writer: w.outcome(path).split(" ") for w in writers}
            outcomes = {w: a[0] for w, a in answers.items()}
            causes = ",".join(a[1] for a in answers.values() if len(a) > 1)
            content_writer = json.loads(client.get_object(s.bucket, key).read())["commitInfo"]["writer"]
            if version > 1:
                results.append({**outcomes, "cause": causes, "content_writer": content_writer})
    finally:
        for w in writers:
            w.close()
    return results


def test_put_if_absent_store_lets_exactly_one_writer_win_each_round(
    settings: Settings, harness_classpath: str, tmp_path: Path
) -> None:
    results = _race(settings, harness_classpath, logstore.LOG_STORE_CLASS, tmp_path)
    assert len(results) == ROUNDS
    for number, r in enumerate(results, start=1):
        outcomes = sorted(r[w] for w in WRITERS)
        assert outcomes == ["lost", "won"], f"round {number}: {r}"
        winner = next(w for w in WRITERS if r[w] == "won")
        assert r["content_writer"] == winner, f"round {number}: the file holds the loser's commit: {r}"
    print("put_if_absent: how the loser learnt it:", sorted({r["cause"] for r in results}))


def test_single_driver_store_overwrites_a_commit_under_the_same_race(
    settings: Settings, harness_classpath: str, tmp_path: Path
) -> None:
    """Negative control: the race is real, and Delta's default S3 store lets both writers "succeed"."""
    results = _race(settings, harness_classpath, SINGLE_DRIVER_CLASS, tmp_path)
    assert len(results) == ROUNDS
    assert all(r[w] in ("won", "lost") for r in results for w in WRITERS), results
    both_won = [r for r in results if all(r[w] == "won" for w in WRITERS)]
    assert both_won, f"no round overwrote a commit; the race was not forced: {results}"
    # Two writers were told "committed", one file remains: the other commit is gone.
    assert all(r["content_writer"] in WRITERS for r in both_won)
    print(f"single_driver: both writers 'committed' the same version in {len(both_won)} of {ROUNDS} rounds")


APPENDS = 15
ROWS = 20


@pytest.fixture
def driver_env(test_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """Each driver small: one core, 1 GB; PYTHONPATH so the child imports this checkout."""
    yield {
        **test_env,
        "IOTLAKE_SPARK__MASTER": "local[1]",
        "IOTLAKE_SPARK__DRIVER_MEMORY": "1g",
        "IOTLAKE_STORAGE__LOG_STORE": "put_if_absent",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), test_env.get("PYTHONPATH")])),
    }


def test_two_spark_drivers_appending_concurrently_lose_no_commit_and_no_row(
    settings: Settings, driver_env: dict[str, str], tmp_path: Path
) -> None:
    settings = replace(settings, storage=replace(settings.storage, log_store="put_if_absent"))
    table = "two_writers"
    go = tmp_path / "go"
    procs = []
    for i, writer in enumerate(WRITERS):
        argv = [sys.executable, "-m", "tests.integration.two_writers_append", "--table", table, "--writer", writer]
        argv += ["--appends", str(APPENDS), "--rows", str(ROWS), "--ready", str(tmp_path / f"ready-{writer}")]
        argv += ["--go", str(go), *(["--create"] if i == 0 else [])]
        log = (tmp_path / f"driver-{writer}.log").open("w")
        procs.append((subprocess.Popen(argv, env=driver_env, stdout=log, stderr=subprocess.STDOUT), log))
    try:
        deadline = time.monotonic() + 600
        while not all((tmp_path / f"ready-{w}").exists() for w in WRITERS):
            dead = [p.args for p, _ in procs if p.poll() is not None]
            assert not dead, f"a driver exited before it was ready; see {tmp_path}/driver-*.log"
            assert time.monotonic() < deadline, "drivers not ready within 600 s"
            time.sleep(0.2)
        for w in WRITERS:  # the class Delta resolved for the table's s3a:// path, read from each driver's JVM
            assert (tmp_path / f"ready-{w}").read_text() == logstore.LOG_STORE_CLASS
        go.touch()
        for p, _ in procs:
            assert p.wait(timeout=900) == 0, f"a driver failed; see {tmp_path}/driver-*.log"
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()

    commits = _commit_infos(settings, table)
    assert sorted(commits) == list(range(2 * APPENDS + 1)), f"versions are not 0..{2 * APPENDS}: {sorted(commits)}"
    operations = [commits[v]["operation"] for v in sorted(commits)]
    assert operations == ["CREATE TABLE"] + ["WRITE"] * (2 * APPENDS), operations
    # A blind append first tries version readVersion + 1; a later version means it lost that race and retried.
    retried = [v for v in sorted(commits)[1:] if commits[v]["readVersion"] < v - 1]
    assert retried, "the drivers never raced for a version, so this run proved nothing"
    print(f"two drivers: {len(retried)} of {2 * APPENDS} appends lost the race for a version and retried")

    uri = delta_rs_uri(settings.storage.table_uri(table))
    rows = DeltaTable(uri, storage_options=delta_storage_options(settings)).to_pyarrow_table().to_pylist()
    got = sorted((r["writer"], r["append"], r["row"]) for r in rows)
    expected = sorted((w, i, j) for w in WRITERS for i in range(APPENDS) for j in range(ROWS))
    assert got == expected


def _commit_infos(settings: Settings, table: str) -> dict[int, dict[str, Any]]:
    """Version -> commitInfo of every JSON commit file in the table's log (exactly one commitInfo each)."""
    s = settings.storage
    prefix = f"{s.table_uri(table).removeprefix(f's3a://{s.bucket}/')}/_delta_log/"
    client = minio_client(settings)
    found: dict[int, dict[str, Any]] = {}
    for obj in client.list_objects(s.bucket, prefix=prefix):
        name = obj.object_name.rsplit("/", 1)[-1]
        if not (name.endswith(".json") and name[:-5].isdigit()):
            continue
        lines = client.get_object(s.bucket, obj.object_name).read().decode().splitlines()
        infos = [a["commitInfo"] for a in map(json.loads, lines) if "commitInfo" in a]
        assert len(infos) == 1, f"{name}: {len(infos)} commitInfo actions"
        found[int(name[:-5])] = infos[0]
    return found
