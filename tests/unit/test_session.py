"""The session's launch conf holds no credential: spark-submit puts every builder conf on the JVM's command line."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pyspark
import pytest
from pyspark.sql import SparkSession

from bench.vacuum import tasks_since
from streaming.core import class_archive as class_archive_module
from streaming.core.class_archive import archive_for
from streaming.core.config import Settings, load_settings
from streaming.core.errors import ConfigError, CredentialsError, SessionError
from streaming.core.session import (
    DRIVER_OPTIONS,
    GC_OPTIONS,
    JIT_OPTIONS,
    SUBMIT_ARGS,
    _auth_properties,
    _submit_args,
    artifact,
    build_session,
    class_archive,
    jars_marker,
    preinstalled_classpath,
    resolved_jars,
    session_conf,
    split_credentials,
    uses_preinstalled_jars,
    with_class_archive,
)
from streaming.core.storage import storage_credentials

pytestmark = pytest.mark.unit

ACCESS, SECRET = "AKUNITTESTWRITER0001", "unit-test-writer-secret-0123456789abcdef"
KEYS = {"IOTLAKE_STORAGE__ACCESS_KEY": ACCESS, "IOTLAKE_STORAGE__SECRET_KEY": SECRET}


def test_the_writer_key_is_a_hadoop_credential_not_a_launch_conf() -> None:
    settings = load_settings(env=KEYS)
    assert storage_credentials(settings) == {"fs.s3a.access.key": ACCESS, "fs.s3a.secret.key": SECRET}
    conf = session_conf(settings)
    assert conf["spark.hadoop.fs.s3a.endpoint"] == settings.storage.endpoint
    assert not [k for k, v in conf.items() if ACCESS in v or SECRET in v]
    assert split_credentials(conf) == (conf, {})


@pytest.mark.parametrize("side", ["driver", "executor"])
def test_every_jvm_jit_compiles_huge_methods_and_keeps_the_configs_own_options(side: str) -> None:
    """Whole-stage code of the validation and of Delta's action rows has methods over HotSpot's 8,000-byte JIT
    limit: driver and executors get -XX:-DontCompileHugeMethods, in front of any options the config gives them."""
    key = f"spark.{side}.extraJavaOptions"
    assert JIT_OPTIONS == "-XX:-DontCompileHugeMethods"
    assert session_conf(load_settings(env=KEYS))[key].split()[0] == JIT_OPTIONS
    own = load_settings(env={**KEYS, f"IOTLAKE_SPARK__CONF__{key}": "-Xss4m -Dx=1"})
    options = session_conf(own)[key]  # a later -XX:+DontCompileHugeMethods would win
    assert options.startswith(f"{JIT_OPTIONS} ") and options.endswith(" -Xss4m -Dx=1")


def test_the_driver_runs_the_throughput_collector_unless_the_config_picks_one() -> None:
    """The driver (in local mode, the whole job) runs HotSpot's parallel collector: G1's concurrent work takes CPU
    from the batches on two cores (docs/benchmark-log.md, "The driver's garbage collector"). A collector the config
    names is kept alone: two of them stop the JVM at start. Executors on a cluster keep the JVM's default."""
    options = session_conf(load_settings(env=KEYS))
    assert options[DRIVER_OPTIONS].split() == [JIT_OPTIONS, GC_OPTIONS] and GC_OPTIONS == "-XX:+UseParallelGC"
    assert options["spark.executor.extraJavaOptions"] == JIT_OPTIONS
    for own in ("-XX:+UseG1GC", "-Xss4m -XX:+UseZGC", "-XX:+UseSerialGC -Dx=1"):
        env = {**KEYS, f"IOTLAKE_SPARK__CONF__{DRIVER_OPTIONS}": own}
        assert session_conf(load_settings(env=env))[DRIVER_OPTIONS] == f"{JIT_OPTIONS} {own}"


def test_the_running_driver_collects_with_the_parallel_collector(spark: SparkSession) -> None:
    """The option reaches the JVM: its collectors are the parallel collector's (PS Scavenge, PS MarkSweep)."""
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()  # type: ignore[union-attr]
    assert sorted(str(bean.getName()) for bean in beans) == ["PS MarkSweep", "PS Scavenge"]


def test_credentials_from_config_leave_the_launch_conf_too() -> None:
    env = {
        **KEYS,
        "IOTLAKE_SPARK__CONF__spark.hadoop.fs.s3a.secret.key": "override",
        "IOTLAKE_SPARK__CONF__spark.hadoop.fs.s3a.bucket.other.access.key": "other-key",
        "IOTLAKE_SPARK__CONF__spark.hadoop.fs.s3a.session.token": "token",
    }
    launch, hidden = split_credentials(session_conf(load_settings(env=env)))
    assert hidden == {
        "fs.s3a.secret.key": "override",
        "fs.s3a.bucket.other.access.key": "other-key",
        "fs.s3a.session.token": "token",
    }
    assert not set(launch.values()) & set(hidden.values())
    assert launch["spark.hadoop.fs.s3a.path.style.access"] == "true"


def test_missing_keys_are_a_credentials_error() -> None:
    env = {"IOTLAKE_STORAGE__SECRETS_FILE": "/nonexistent/secrets.env"}
    with pytest.raises(CredentialsError, match="IOTLAKE_STORAGE__SECRET_KEY"):
        storage_credentials(load_settings(env=env))


CLUSTER = {**KEYS, "IOTLAKE_SPARK__MASTER": "spark://127.0.0.1:7077"}


def test_a_cluster_driver_gets_its_auth_secret_from_the_secrets_file_in_a_private_properties_file(
    tmp_path: Path,
) -> None:
    secrets = tmp_path / "secrets.env"
    secrets.write_text("IOTLAKE_SPARK_AUTH_SECRET=cluster-secret-0123456789\n")
    settings = load_settings(env={**CLUSTER, "IOTLAKE_STORAGE__SECRETS_FILE": str(secrets)})
    assert settings.spark.auth_secret == "cluster-secret-0123456789"
    assert settings.masked()["spark"]["auth_secret"] == "***"
    assert not [v for v in session_conf(settings).values() if "cluster-secret" in v]  # never a --conf
    with _auth_properties(settings) as path:
        assert path is not None
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.read_text().splitlines() == [
            "spark.authenticate true",
            "spark.authenticate.secret cluster-secret-0123456789",
        ]
    assert not path.exists() and not path.parent.exists()  # gone once the JVM has read it


def test_local_mode_and_a_cluster_without_a_secret_get_no_properties_file(tmp_path: Path) -> None:
    absent = {"IOTLAKE_STORAGE__SECRETS_FILE": str(tmp_path / "absent.env")}
    for env in (KEYS, {**CLUSTER, **absent}, {**KEYS, "IOTLAKE_SPARK__AUTH_SECRET": "only-for-spark-masters"}):
        with _auth_properties(load_settings(env={**env, **absent})) as path:
            assert path is None, env


def test_submit_args_are_set_for_the_launch_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SUBMIT_ARGS, raising=False)
    with _submit_args(["--jars", "a.jar"], tmp_path / "auth.conf"):
        assert os.environ[SUBMIT_ARGS] == f"--jars a.jar --properties-file {tmp_path / 'auth.conf'} pyspark-shell"
    assert SUBMIT_ARGS not in os.environ  # a child process or a later session does not inherit it
    monkeypatch.setenv(SUBMIT_ARGS, "--verbose pyspark-shell")
    with _submit_args([], None):
        assert os.environ[SUBMIT_ARGS] == "pyspark-shell"
    assert os.environ[SUBMIT_ARGS] == "--verbose pyspark-shell"


def _ivy_jars(folder: Path, names: list[str]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"PK")
    return [folder / n for n in names]


def test_preinstalled_jars_put_the_resolved_jars_on_both_class_paths_except_what_pyspark_ships(
    tmp_path: Path,
) -> None:
    """A cluster whose workers hold the Ivy cache: executors load the jars from it; Ivy's older jackson and
    parquet (pyspark ships its own) stay off the class path, where they would come before Spark's."""
    env = {"IOTLAKE_SPARK__IVY_CACHE": str(tmp_path / "ivy"), "IOTLAKE_SPARK__MASTER": "spark://h:7077"}
    settings = load_settings(env={**env, "IOTLAKE_SPARK__PREINSTALLED_JARS": "true"})
    assert uses_preinstalled_jars(settings)
    assert not uses_preinstalled_jars(load_settings(env=env))  # auto on a cluster: the jars go with the app
    local = load_settings(env={**env, "IOTLAKE_SPARK__MASTER": "local[2]", "IOTLAKE_SPARK__PREINSTALLED_JARS": "true"})
    assert uses_preinstalled_jars(local)  # the compose image in local mode: no Ivy at start, nothing to download
    with pytest.raises(ConfigError, match="make install"):
        preinstalled_classpath(settings, None)  # never resolved: no list to load

    ours = ["io.delta_delta-spark_4.2_2.13-4.4.0.jar", "software.amazon.awssdk_bundle-2.35.4.jar"]
    shipped = ["com.fasterxml.jackson.core_jackson-core-2.13.5.jar", "org.apache.parquet_parquet-column-1.16.0.jar"]
    jars = _ivy_jars(tmp_path / "ivy" / "jars", [*ours, *shipped])
    jars_marker(settings).write_text(json.dumps([str(p) for p in jars]))
    assert resolved_jars(settings) == jars
    log_store = tmp_path / "iotlake-logstore-0.jar"
    conf = preinstalled_classpath(settings, log_store)
    expected = os.pathsep.join([*(str(tmp_path / "ivy" / "jars" / n) for n in ours), str(log_store)])
    assert conf == {"spark.driver.extraClassPath": expected, "spark.executor.extraClassPath": expected}

    jars[0].unlink()  # a cache cleared since: resolve again rather than start executors without Delta
    assert resolved_jars(settings) is None


def test_auto_puts_resolved_jars_on_the_class_path_of_a_local_master_only(tmp_path: Path) -> None:
    """The default, auto: a local job skips Ivy (10-20 s of every start) once `make install` resolved the jars; a
    cluster's executors still get them with the application, and nothing resolved means Ivy resolves them."""
    ivy = {"IOTLAKE_SPARK__IVY_CACHE": str(tmp_path / "ivy")}
    local = load_settings(env={**ivy, "IOTLAKE_SPARK__MASTER": "local[2]"})
    cluster = load_settings(env={**ivy, "IOTLAKE_SPARK__MASTER": "spark://h:7077"})
    assert local.spark.preinstalled_jars == "auto"
    assert not uses_preinstalled_jars(local)  # nothing resolved yet
    jars = _ivy_jars(tmp_path / "ivy" / "jars", ["io.delta_delta-spark_4.2_2.13-4.4.0.jar"])
    jars_marker(local).write_text(json.dumps([str(p) for p in jars]))
    assert uses_preinstalled_jars(local)
    assert not uses_preinstalled_jars(cluster)
    off = load_settings(env={**ivy, "IOTLAKE_SPARK__MASTER": "local[2]", "IOTLAKE_SPARK__PREINSTALLED_JARS": "false"})
    assert not uses_preinstalled_jars(off)
    with pytest.raises(ConfigError, match=r"spark\.preinstalled_jars must be one of"):
        load_settings(env={**ivy, "IOTLAKE_SPARK__PREINSTALLED_JARS": "sometimes"})


def test_artifact_names_match_across_ivy_and_pyspark_jar_names() -> None:
    cases = {
        ("com.fasterxml.jackson.core_jackson-core-2.13.5.jar", True): "jackson-core",
        ("jackson-core-2.18.2.jar", False): "jackson-core",
        ("org.apache.spark_spark-sql-kafka-0-10_2.13-4.2.0.jar", True): "spark-sql-kafka-0-10_2.13",
        ("com.github.luben_zstd-jni-1.5.7-3.jar", True): "zstd-jni",
        ("zstd-jni-1.5.6-10.jar", False): "zstd-jni",
        ("org.wildfly.openssl_wildfly-openssl-2.2.5.Final.jar", True): "wildfly-openssl",
        ("commons-pool_commons-pool-1.6.jar", True): "commons-pool",
        ("scala-parallel-collections_2.13-1.2.0.jar", False): "scala-parallel-collections_2.13",
    }
    assert {key: artifact(Path(key[0]), ivy=key[1]) for key in cases} == cases


def test_a_session_for_other_settings_is_refused_while_one_runs_in_the_process(
    spark: SparkSession, tmp_path: Path
) -> None:
    """getOrCreate would hand back the running session without these settings: CI's integration session came back
    as the unit tests' one, with no S3 endpoint, and every s3a:// path went to amazonaws.com."""
    other = load_settings(env={**KEYS, "IOTLAKE_STORAGE__SECRETS_FILE": str(tmp_path / "absent.env")})
    with pytest.raises(SessionError, match="already runs in this process") as refused:
        build_session(other, app_name="a-second-session")
    assert "spark.hadoop.fs.s3a.endpoint" in str(refused.value) and "stop_session" in str(refused.value)
    assert spark.range(3).count() == 3  # the running session is untouched


def test_the_running_session_is_reused_for_settings_it_was_built_for(
    spark: SparkSession, local_settings: Settings
) -> None:
    """In-process commands (the table-ops tests) share the running session when nothing it was built with differs."""
    assert build_session(local_settings, app_name="the-same-settings") is spark


def test_queries_post_the_simple_plan_description_unless_the_config_asks_for_another() -> None:
    """Spark's default "formatted" plan description cost a tiny batch about 6% (docs/benchmark-log.md)."""
    key = "spark.sql.ui.explainMode"
    assert session_conf(load_settings(env=KEYS))[key] == "simple"
    assert session_conf(load_settings(env={**KEYS, f"IOTLAKE_SPARK__CONF__{key}": "formatted"}))[key] == "formatted"


def test_a_vacuum_of_a_small_table_runs_a_few_hundred_tasks_not_a_hundred_thousand(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Delta's VACUUM lists the table in spark.sql.sources.parallelPartitionDiscovery.parallelism tasks per stage:
    Spark's default of 10,000 made the sidecar's VACUUM of a table of a few files run 170,000 tasks (30-40 s)."""
    path = str(tmp_path / "table")
    for i in range(3):
        frame = spark.range(10).selectExpr("id", f"{i % 2} AS p")
        frame.write.format("delta").mode("append").partitionBy("p").save(path)
    tracker = spark.sparkContext.statusTracker()
    last_job = max(tracker.getJobIdsForGroup(None), default=-1)
    spark.sql(f"VACUUM delta.`{path}` RETAIN 168 HOURS")
    assert 0 < tasks_since(spark, last_job) < 1_000


def _jobs_of_three_appends(spark: SparkSession, path: str, zone: str) -> int:
    """Spark jobs run by three appends to a new Delta table while the JVM's default time zone is `zone`."""
    time_zone = spark.sparkContext._jvm.java.util.TimeZone  # type: ignore[union-attr]
    before = time_zone.getDefault()
    time_zone.setDefault(time_zone.getTimeZone(zone))
    try:
        tracker = spark.sparkContext.statusTracker()
        last_job = max(tracker.getJobIdsForGroup(None), default=-1)
        for i in range(3):
            spark.range(5).selectExpr("id", f"{i} AS n").write.format("delta").mode("append").save(path)
        return len([job for job in tracker.getJobIdsForGroup(None) if job > last_job])
    finally:
        time_zone.setDefault(before)


def test_a_commit_costs_the_same_spark_jobs_under_any_local_time_zone(spark: SparkSession, tmp_path: Path) -> None:
    """Delta 4.4 rebuilds a small table's state after every commit to check the file list it keeps in the commit's
    .crc when the JVM's time zone is not UTC (`allFilesInCrc.verificationMode.forceOnNonUTC`): a tiny batch ran
    29-32 Spark jobs instead of 22-25 on a host in America/New_York, 1.3 times as long. The list is never read."""
    utc = _jobs_of_three_appends(spark, str(tmp_path / "utc"), "UTC")
    new_york = _jobs_of_three_appends(spark, str(tmp_path / "new-york"), "America/New_York")
    assert new_york == utc


def test_the_class_archive_is_named_by_the_jdk_and_every_jar_on_the_class_path(tmp_path: Path) -> None:
    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / "spark-core.jar").write_bytes(b"spark")
    ours = tmp_path / "delta.jar"
    ours.write_bytes(b"delta")
    one = class_archive('openjdk version "17.0.15"', str(ours), home=tmp_path)
    assert one.parent == tmp_path and one.suffix == ".jsa"
    assert one == class_archive('openjdk version "17.0.15"', str(ours), home=tmp_path)
    assert one != class_archive('openjdk version "17.0.16"', str(ours), home=tmp_path)
    assert one != class_archive('openjdk version "17.0.15"', f"{ours}:{tmp_path}/log.jar", home=tmp_path)
    ours.write_bytes(b"delta, rebuilt")  # a jar fetched or built again: the JVM would refuse the old archive
    assert one != class_archive('openjdk version "17.0.15"', str(ours), home=tmp_path)
    (tmp_path / "jars" / "extra.jar").write_bytes(b"x")  # pyspark's own jars are on the JVM's class path too
    assert class_archive('openjdk version "17.0.15"', str(ours), home=tmp_path) != class_archive(
        'openjdk version "17.0.15"', str(ours), home=tmp_path / "other"
    )
    assert class_archive("17", "/jars/a.jar").parent == Path(pyspark.__file__).resolve().parent


def test_the_driver_maps_the_class_archive_only_when_it_exists_and_nothing_else_names_one(tmp_path: Path) -> None:
    archive = tmp_path / "iotlake-classes-x.jsa"
    conf = {DRIVER_OPTIONS: f"{JIT_OPTIONS} -Xss4m", "spark.executor.extraJavaOptions": JIT_OPTIONS}
    assert with_class_archive(conf, archive) == conf  # not trained (yet)
    archive.write_bytes(b"archive")
    mapped = with_class_archive(conf, archive)
    assert mapped[DRIVER_OPTIONS] == f"{JIT_OPTIONS} -Xss4m -XX:SharedArchiveFile={archive}"
    assert mapped["spark.executor.extraJavaOptions"] == JIT_OPTIONS  # executors on a cluster have no such file
    assert with_class_archive({}, archive) == {DRIVER_OPTIONS: f"-XX:SharedArchiveFile={archive}"}
    for own in ("-XX:SharedArchiveFile=/opt/mine.jsa", f"-XX:ArchiveClassesAtExit={archive}"):  # config's, training
        assert with_class_archive({DRIVER_OPTIONS: own}, archive) == {DRIVER_OPTIONS: own}
    spaced = tmp_path / "a b.jsa"
    spaced.write_bytes(b"archive")
    assert with_class_archive(conf, spaced) == conf  # Spark splits the options on spaces


def test_no_class_archive_is_trained_for_drivers_that_ship_their_jars() -> None:
    cluster = load_settings(env={**KEYS, "IOTLAKE_SPARK__MASTER": "spark://127.0.0.1:7077"})
    assert archive_for(cluster) is None
    ivy = load_settings(env={**KEYS, "IOTLAKE_SPARK__PREINSTALLED_JARS": "false"})
    assert archive_for(ivy) is None


def test_a_trained_archive_is_reused_and_an_unusable_folder_is_refused_before_any_jvm_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(env=KEYS)
    trained = tmp_path / "iotlake-classes-0123.jsa"
    trained.write_bytes(b"archive")
    monkeypatch.setattr(class_archive_module, "archive_for", lambda s: (trained, "/jars/a.jar"))
    monkeypatch.setattr(class_archive_module, "build_session", lambda *a, **k: pytest.fail("a JVM was started"))
    assert class_archive_module.train(settings) == (trained, False)
    spaced = tmp_path / "a b" / "iotlake-classes-0123.jsa"
    spaced.parent.mkdir()
    monkeypatch.setattr(class_archive_module, "archive_for", lambda s: (spaced, "/jars/a.jar"))
    with pytest.raises(SessionError, match="a path with a space"):
        class_archive_module.train(settings)


def test_a_failed_training_is_one_line_and_an_exit_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(settings: Settings) -> None:
        raise PermissionError(13, "Permission denied", "/venv/pyspark/.iotlake-classes.partial")

    monkeypatch.setattr(class_archive_module, "train", broken)
    assert class_archive_module.main() == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "class archive: not trained (PermissionError: [Errno 13] Permission denied: "
        "'/venv/pyspark/.iotlake-classes.partial'); the jobs run without it"
    ]
