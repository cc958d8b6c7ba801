"""The one place that builds the SparkSession: Delta, S3A on MinIO, the Kafka source, sane defaults."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pyspark
from pyspark import SparkContext
from pyspark.sql import SparkSession

from streaming.core.config import Settings, resolve_path
from streaming.core.errors import ConfigError, JavaMissingError, SessionError
from streaming.core.logstore import ensure_jar, log_store_conf, needs_jar
from streaming.core.storage import storage_conf, storage_credentials
from streaming.core.versions import HADOOP_VERSION, KAFKA_CLIENTS_VERSION, SCALA_BINARY_VERSION, SPARK_VERSION

EXTRA_PACKAGES = (
    f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}:{SPARK_VERSION}",
    f"org.apache.kafka:kafka-clients:{KAFKA_CLIENTS_VERSION}",  # wins over the connector's 3.9.2 in Ivy's resolution
    f"org.apache.hadoop:hadoop-aws:{HADOOP_VERSION}",
)

# Defaults for a long-running service on a small machine; config's spark.conf overrides any of them.
BASE_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.databricks.delta.snapshotPartitions": "2",
    # The validation's checks and Delta's action rows (well over Spark's default of 100 fields) run as whole-stage
    # code; the JVMs JIT-compile its large methods (JIT_OPTIONS). Per-operator code instead had every task generate
    # the projections' code again: a tiny batch's Spark jobs took 3.3 s instead of 2.6 s.
    "spark.sql.codegen.maxFields": "1000",
    # A batch compiles about 130 distinct classes (validation, MERGEs, Delta's snapshot queries). Spark's default cache
    # of 100 evicted each batch's classes before the next batch asked for them, so every batch compiled them again.
    "spark.sql.codegen.cache.maxEntries": "1000",
    # Every query (Delta runs about 25 a tiny batch) posts its plan's description to the listener bus, for the UI and
    # the event log. Spark's "formatted" one walks each operator's full expressions: 9.5% of a tiny batch's JVM
    # samples (JFR), and a tiny batch about 6% slower than with the one-line-per-operator "simple" description.
    "spark.sql.ui.explainMode": "simple",
    # Delta's VACUUM lists a table in this many tasks per stage. Spark's default of 10,000 (sized for partition
    # discovery on a cluster, where Spark caps it by the paths listed; VACUUM does not) made the sidecar's VACUUM of a
    # table of a few files run 170,000 tasks: 30-40 s alone, minutes beside the stream. Raise it on a large cluster.
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8",
    # On a JVM whose time zone is not UTC (a laptop anywhere else), Delta 4.4 rebuilds a small table's state after
    # every commit to check the file list it writes into the commit's .crc (a guard against pre-1883 timestamps that
    # non-UTC zones serialize oddly). Scans and MERGEs never read that list, and it is still checked at each
    # checkpoint, as on a UTC host. Every commit's check made a tiny batch run 29-32 Spark jobs instead of 22-25.
    "spark.databricks.delta.allFilesInCrc.verificationMode.forceOnNonUTC.enabled": "false",
    "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
    "spark.hadoop.fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    # Fail fast on a dead endpoint instead of retrying for minutes.
    "spark.hadoop.fs.s3a.attempts.maximum": "3",
    "spark.hadoop.fs.s3a.retry.limit": "3",
    "spark.hadoop.fs.s3a.connection.establish.timeout": "5s",
    "spark.hadoop.fs.s3a.connection.timeout": "30s",
}


# HotSpot never JIT-compiles a method over 8,000 bytes of bytecode unless told to; the validation's checks make one of
# ~11.5 kB. Put in front of the config's own extraJavaOptions for the driver and the executors.
JIT_OPTIONS = "-XX:-DontCompileHugeMethods"
# The driver (in local mode, the whole job) runs HotSpot's parallel collector: on two cores G1's concurrent marking and
# refinement threads take CPU from the batches (docs/benchmark-log.md, "The driver's garbage collector"). Only when
# the config's own options pick no collector: two of them stop the JVM at start. Executors on a cluster keep the JVM's
# default.
GC_OPTIONS = "-XX:+UseParallelGC"
COLLECTOR_CHOICE = re.compile(r"-XX:\+Use\w+GC\b")
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
JAVA_OPTIONS_KEYS = (DRIVER_OPTIONS, "spark.executor.extraJavaOptions")
CLASSPATH_KEYS = ("spark.driver.extraClassPath", "spark.executor.extraClassPath")


def check_java() -> str:
    """Spark needs Java 17 or newer on PATH or in JAVA_HOME; the text `java -version` prints."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise JavaMissingError(
            "Java was not found (no JAVA_HOME and no `java` on PATH). Spark needs Java 17 or newer: "
            "install it (Debian: `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
        )
    try:
        version = subprocess.run([java, "-version"], capture_output=True, check=True, timeout=30, text=True)
    except (OSError, subprocess.SubprocessError) as e:
        raise JavaMissingError(f"`{java} -version` failed ({e}). Reinstall Java 17+ or point JAVA_HOME at it.") from e
    return version.stderr + version.stdout


# A class-data archive (Java's AppCDS) of the classes a driver loads from Spark's, Delta's and our jars, trained once by
# `make install` (streaming.core.class_archive). A driver maps them from it instead of reading, parsing and verifying
# them from some 300 jars: about 4 s less of every JVM's start here. The JVM checks the whole class path against it
# (every jar's path, size and time), pyspark's own jars included, so it lives in pyspark's folder (each virtualenv
# trains its own) and its name covers the JDK and every jar: a changed jar or JDK means no archive until the next
# `make install`, and an archive that doesn't match anyway makes the JVM warn once and load its classes as before.
ARCHIVE_OPTIONS = ("-XX:SharedArchiveFile=", "-XX:ArchiveClassesAtExit=")
SPARK_HOME = Path(pyspark.__file__).resolve().parent


def class_archive(java_version: str, classpath: str, home: Path = SPARK_HOME) -> Path:
    """Where the archive for this JDK and driver class path lives: in pyspark's folder, named by both, and by the
    path, size and modification time of every jar on the class path (the driver's extra ones, then pyspark's)."""
    jars = [Path(p) for p in classpath.split(os.pathsep) if p] + sorted((home / "jars").glob("*.jar"))
    stamps = []
    for jar in jars:
        try:
            stat = jar.stat()
            stamps.append(f"{jar} {stat.st_size} {stat.st_mtime_ns}")
        except OSError:
            stamps.append(f"{jar} missing")
    text = "\n".join([java_version, SPARK_VERSION, *stamps])
    return home / f"iotlake-classes-{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsa"


def with_class_archive(conf: Mapping[str, str], archive: Path) -> dict[str, str]:
    """`conf` with the driver mapping `archive`, when it exists; unchanged when the config (or the training that
    writes it) names an archive itself, or when the path has a space (the training leaves such a path alone)."""
    options = conf.get(DRIVER_OPTIONS, "")
    if any(o in options for o in ARCHIVE_OPTIONS) or " " in str(archive) or not archive.is_file():
        return dict(conf)
    return {**conf, DRIVER_OPTIONS: f"{options} -XX:SharedArchiveFile={archive}".strip()}


# Spark's default spark.redaction.regex: the names of settings that hold credentials.
CREDENTIAL_NAME = re.compile(r"secret|password|token|access[.]?key", re.IGNORECASE)
HADOOP_PREFIX = "spark.hadoop."
SUBMIT_ARGS = "PYSPARK_SUBMIT_ARGS"


def split_credentials(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(launch conf, Hadoop credentials): `spark.hadoop.*` entries named like credentials, prefix stripped,
    go to the second.

    PySpark hands every builder conf to spark-submit as `--conf k=v`, so it ends up in the JVM's command
    line, which every local user can read (`ps`, /proc/<pid>/cmdline).
    """
    launch, hidden = {}, {}
    for key, value in conf.items():
        if key.startswith(HADOOP_PREFIX) and CREDENTIAL_NAME.search(key):
            hidden[key.removeprefix(HADOOP_PREFIX)] = value
        else:
            launch[key] = value
    return launch, hidden


def session_conf(
    settings: Settings, extra: Mapping[str, str] | None = None, log_store_jar: Path | None = None
) -> dict[str, str]:
    """Every conf the session gets: built-in defaults < storage < config's spark.conf < log store < extra."""
    conf = dict(BASE_CONF)
    conf["spark.jars.ivy"] = str(resolve_path(settings.spark.ivy_cache))
    conf["spark.driver.memory"] = settings.spark.driver_memory
    conf.update(storage_conf(settings))
    conf.update(settings.spark.conf)
    for key in JAVA_OPTIONS_KEYS:
        own = settings.spark.conf.get(key, "").strip()
        collector = GC_OPTIONS if key == DRIVER_OPTIONS and not COLLECTOR_CHOICE.search(own) else ""
        conf[key] = " ".join(filter(None, [JIT_OPTIONS, collector, own]))
    conf.update(log_store_conf(settings, log_store_jar))  # keeps config's spark.jars, adds the log store's
    conf.update(extra or {})
    return conf


def build_session(
    settings: Settings, app_name: str | None = None, extra_conf: Mapping[str, str] | None = None
) -> SparkSession:
    """The SparkSession used by the jobs and the tests alike.

    Credentials never go on the JVM's command line: they are set on the SparkContext's Hadoop configuration
    once the JVM runs, before anything opens an s3a:// path. Spark SQL copies that configuration into every
    job (executors on a cluster get it with the tasks).
    """
    from delta import configure_spark_with_delta_pip

    java_version = check_java()
    credentials = storage_credentials(settings)  # missing keys fail here, before the JVM starts
    running = _running_session(settings)
    if running is not None:  # built for the same storage, master and log store (the table-ops tests, in-process)
        _set_hadoop(running, {**credentials, **split_credentials(session_conf(settings, extra_conf))[1]})
        return running
    jar = None
    if needs_jar(settings):
        # Built by `make install`; built here too when missing (an edited source, a cleared cache): ~5 s, once.
        jar, _ = ensure_jar(settings)
    builder = SparkSession.builder.master(settings.spark.master).appName(app_name or settings.spark.app_name)
    conf, hidden = split_credentials(session_conf(settings, extra_conf, jar))
    jars = [j for j in conf.pop("spark.jars", "").split(",") if j.strip()]
    preinstalled = uses_preinstalled_jars(settings)
    if preinstalled:  # the resolved jars and the log store go on the class path: nothing is sent to executors
        conf.update(preinstalled_classpath(settings, jar))
        conf.update({k: v for k, v in (extra_conf or {}).items() if k in CLASSPATH_KEYS})  # extra wins, as above
        jars = [j for j in jars if j != str(jar)]
        conf = with_class_archive(conf, class_archive(java_version, conf[CLASSPATH_KEYS[0]]))
    submit: list[str] = []
    if jars:
        # spark-submit merges --jars with the resolved spark.jars.packages into spark.jars. A spark.jars set on
        # the builder would replace that list once the context starts, and executors on a cluster would then
        # miss the packages (the Kafka source). So the jars go on the launch command instead.
        submit += ["--jars", ",".join(jars)]
    for key, value in conf.items():
        builder = builder.config(key, value)
    if not preinstalled:
        builder = configure_spark_with_delta_pip(builder, extra_packages=list(EXTRA_PACKAGES))
    with _auth_properties(settings) as properties, _submit_args(submit, properties):
        spark = builder.getOrCreate()
    _set_hadoop(spark, {**credentials, **hidden})  # config's spark.conf overrides the storage keys
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _set_hadoop(spark: SparkSession, options: Mapping[str, str]) -> None:
    hadoop_conf = spark._jsc.hadoopConfiguration()
    for key, value in options.items():
        hadoop_conf.set(key, value)


def _running_session(settings: Settings) -> SparkSession | None:
    """The session already running in this process when it was built for these settings' storage, master and log
    store; None when none runs. getOrCreate would return a running one whatever it was built for, so one built for
    other settings is refused: CI's integration tests once got the unit tests' session, with no S3 endpoint."""
    context = SparkContext._active_spark_context
    if context is None:
        return None
    wanted = {**storage_conf(settings), **log_store_conf(settings), "spark.master": settings.spark.master}
    wanted.pop("spark.jars", None)  # spark-submit rewrites the list; the log store's class is compared instead
    running = context.getConf()
    differ = sorted(key for key, value in wanted.items() if running.get(key) != value)
    if differ:
        raise SessionError(
            f"A Spark session already runs in this process with other settings ({', '.join(differ)}): getOrCreate "
            "would return it as it is. Stop it first (streaming.core.session.stop_session), or build this one in a "
            "process of its own."
        )
    return SparkSession.builder.getOrCreate()


def stop_session(spark: SparkSession, timeout: float = 60) -> int | None:
    """Stop the session and the JVM it runs in, so that the next build_session launches a JVM with its own jars
    and properties: a JVM outlives its stopped context and keeps the launch conf it started with. The JVM's exit
    code, or None when this process did not launch it."""
    spark.stop()
    gateway = SparkContext._gateway
    SparkContext._gateway = None
    SparkContext._jvm = None
    if gateway is None:
        return None
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)  # pyspark's launch_gateway: the JVM exits when its stdin closes
    if proc is None:
        return None
    if proc.stdin:
        proc.stdin.close()
    code: int = proc.wait(timeout=timeout)
    return code


@contextlib.contextmanager
def _submit_args(args: list[str], properties: Path | None) -> Iterator[None]:
    """PYSPARK_SUBMIT_ARGS for the launch of this JVM only: not left to later sessions or child processes."""
    if properties is not None:
        args = [*args, "--properties-file", str(properties)]
    before = os.environ.get(SUBMIT_ARGS)
    os.environ[SUBMIT_ARGS] = " ".join([*args, "pyspark-shell"])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SUBMIT_ARGS, None)
        else:
            os.environ[SUBMIT_ARGS] = before


@contextlib.contextmanager
def _auth_properties(settings: Settings) -> Iterator[Path | None]:
    """For a spark:// master with an auth secret: a 0600 properties file with spark.authenticate and its
    secret, for spark-submit's --properties-file, removed once the JVM has read it (the session is up).

    A standalone master refuses a driver without the secret; as a --conf it would be on the command line.
    """
    secret = settings.spark.auth_secret
    if not secret or not settings.spark.master.startswith("spark://"):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="iotlake-spark-") as folder:  # mode 0700
        path = Path(folder) / "auth.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"spark.authenticate true\nspark.authenticate.secret {secret}\n")
        yield path


def uses_preinstalled_jars(settings: Settings) -> bool:
    """Whether the resolved jars go on the class path (spark.preinstalled_jars). Ivy then doesn't run: it writes its
    cache and may reach a repository, so the job starts sooner, on a read-only root file system, with no route to a
    registry. `auto`: for a local master, once `make install` has resolved them (the driver is the only JVM)."""
    mode = settings.spark.preinstalled_jars
    if mode == "auto":
        return settings.spark.master.startswith("local") and resolved_jars(settings) is not None
    return mode == "true"


def jars_marker(settings: Settings) -> Path:
    """A file in the Ivy cache listing the jars these exact packages resolved to (JSON), once resolved there."""
    digest = hashlib.sha256(" ".join(sorted(EXTRA_PACKAGES)).encode()).hexdigest()[:12]
    return resolve_path(settings.spark.ivy_cache) / f"iotlake-resolved-{SPARK_VERSION}-{digest}"


def resolved_jars(settings: Settings) -> list[Path] | None:
    """The jars recorded by resolve_jars, or None when they were never resolved (or a file is gone)."""
    try:
        jars = [Path(p) for p in json.loads(jars_marker(settings).read_text())]
    except (OSError, ValueError, TypeError):
        return None
    return jars if jars and all(p.is_file() for p in jars) else None


def artifact(jar: Path, ivy: bool = False) -> str:
    """A jar's artifact name without version (and, for Ivy's `<group>_<artifact>-<version>.jar`, group): `jackson-core`
    for Ivy's `com.fasterxml.jackson.core_jackson-core-2.13.5.jar` and for pyspark's `jackson-core-2.18.2.jar`."""
    name = re.sub(r"-\d+(\.\d+)*([.-][A-Za-z0-9]+)*\.jar$", "", jar.name)
    return name.split("_", 1)[1] if ivy else name


def preinstalled_classpath(settings: Settings, log_store_jar: Path | None) -> dict[str, str]:
    """Driver and executor class path from the resolved jars (spark.preinstalled_jars), for a cluster whose
    workers have them at the same paths: nothing is copied to the executors.

    Jars that pyspark ships itself (another version of jackson, parquet, hadoop-client...) are left out: on the
    class path they would come before Spark's own and shadow them.
    """
    jars = resolved_jars(settings)
    if jars is None:
        raise ConfigError(
            f"spark.preinstalled_jars is on, but the Delta, Kafka-source and S3A jars were never resolved into "
            f"{resolve_path(settings.spark.ivy_cache)} (no list in {jars_marker(settings)}). Run `make install` "
            "(or `python -m streaming.core.session`) on this host and on every worker, or set spark.preinstalled_jars "
            "to false to send the jars with the application."
        )
    shipped = {artifact(p) for p in (SPARK_HOME / "jars").glob("*.jar")}
    path = [str(p) for p in jars if artifact(p, ivy=True) not in shipped]
    if log_store_jar is not None:
        path.append(str(log_store_jar))
    classpath = os.pathsep.join(path)
    return dict.fromkeys(CLASSPATH_KEYS, classpath)


def resolve_jars(settings: Settings) -> bool:
    """Download the Delta, Kafka-source and S3A jars into the Ivy cache once, and list them in the marker;
    False if already there."""
    if resolved_jars(settings) is not None:
        return False
    ivy = resolve_path(settings.spark.ivy_cache).resolve()
    local = replace(
        settings.on_local_files("/tmp/iotlake-resolve"),
        spark=replace(settings.spark, master="local[1]", preinstalled_jars="false"),
    )
    spark = build_session(local, app_name="iotlake-resolve-jars")
    try:
        listed = spark.sparkContext.getConf().get("spark.jars", "") or ""
    finally:
        stop_session(spark)
    jars = [urlsplit(j).path for j in listed.split(",") if j.strip()]
    jars = [j for j in jars if Path(j).resolve().is_relative_to(ivy)]  # not config's own spark.jars
    marker = jars_marker(settings)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(jars, indent=1) + "\n")
    return True


if __name__ == "__main__":
    import sys
    import time

    from streaming.core.config import load_settings
    from streaming.core.errors import IotLakeError

    started = time.monotonic()
    try:
        settings = load_settings()
        fetched = resolve_jars(settings)
        where = jars_marker(settings).parent
        print(f"spark jars: {'resolved into' if fetched else 'cached in'} {where} ({time.monotonic() - started:.1f}s)")
        if needs_jar(settings):
            started = time.monotonic()
            jar, built = ensure_jar(settings)
            print(f"log store: {'built' if built else 'cached'} {jar} ({time.monotonic() - started:.1f}s)")
    except IotLakeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
