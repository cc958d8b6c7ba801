"""The Delta log store for two writer processes: build its jar, the Spark conf it needs, the start-up check.

Delta's S3 log store (`S3SingleDriverLogStore`) is safe with one writer process only: its "does commit N
exist?" lock lives in one JVM. `PutIfAbsentLogStore` (streaming/jvm) lets the object store decide with a
conditional PUT instead. It is compiled once against the resolved Spark/Delta/S3A jars into
`<cache>/jars/iotlake-logstore-<hash>.jar`; the hash covers the source and the versions it compiles against.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from streaming.core.config import Settings, default_cache, resolve_path
from streaming.core.errors import ConfigError, JavaMissingError, StackError
from streaming.core.versions import HADOOP_VERSION

LOG_STORE_CLASS = "io.iotlake.storage.PutIfAbsentLogStore"
SOURCE = Path(__file__).resolve().parents[1] / "jvm" / "io" / "iotlake" / "storage" / "PutIfAbsentLogStore.java"
JAVAC_TIMEOUT_S = 300
ROLES = ("ingest", "maintain", "ops")


def delta_version() -> str:
    """The delta-spark version installed (its jars come from Ivy at the same version)."""
    return metadata.version("delta-spark")


def needs_jar(settings: Settings) -> bool:
    """True when the session must load PutIfAbsentLogStore: tables on S3 and storage.log_store put_if_absent."""
    return settings.storage.is_s3 and settings.storage.log_store == "put_if_absent"


def jar_name(source: str, delta: str, hadoop: str = HADOOP_VERSION) -> str:
    """`iotlake-logstore-<hash>.jar`: a new name whenever the source or the jars it compiles against change."""
    digest = hashlib.sha256(f"delta-storage {delta}\nhadoop-aws {hadoop}\n{source}".encode()).hexdigest()[:16]
    return f"iotlake-logstore-{digest}.jar"


def jar_dir() -> Path:
    """<cache>/jars, beside the other downloads ($IOTLAKE_CACHE or ~/.cache/iotlake)."""
    return default_cache() / "jars"


def jar_path(source: str | None = None, directory: Path | None = None) -> Path:
    """Where the jar for this source lives (built or not)."""
    text = SOURCE.read_text() if source is None else source
    return (directory or jar_dir()) / jar_name(text, delta_version())


def log_store_conf(settings: Settings, jar: Path | None = None) -> dict[str, str]:
    """Spark conf selecting the log store: the jar and the class for s3a:// and s3://; {} for Delta's default."""
    if not needs_jar(settings):
        return {}
    jars = [j for j in settings.spark.conf.get("spark.jars", "").split(",") if j.strip()]
    return {
        "spark.jars": ",".join([*jars, str(jar or jar_path())]),
        "spark.delta.logStore.s3a.impl": LOG_STORE_CLASS,
        "spark.delta.logStore.s3.impl": LOG_STORE_CLASS,
    }


def check_writers_safe(settings: Settings, role: str) -> None:
    """Refuse to start a second writer process on S3 tables whose log store is safe for one writer only.

    `role` is the process starting: "ingest" (the stream), "maintain" (the sidecar, `iotlake optimize|vacuum`) or
    "ops" (`iotlake restore|delete-device`); the last two are always a second writer.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    s = settings.storage
    if not s.is_s3 or s.log_store != "single_driver":
        return
    if role == "ingest" and not settings.maintenance.enabled:
        return
    why = {
        "ingest": "maintenance.enabled is true, so the sidecar writes too",
        "maintain": "the maintenance sidecar runs beside the stream",
        "ops": "`iotlake restore` / `delete-device` writes beside the stream",
    }[role]
    raise ConfigError(
        f"Unsafe configuration: two writer processes on the tables under {s.base_uri} ({why}), but "
        "storage.log_store is single_driver. Delta's S3SingleDriverLogStore is safe with one writer process only; "
        "two can silently overwrite each other's commits. Set storage.log_store: put_if_absent (the default; env "
        "IOTLAKE_STORAGE__LOG_STORE), or run a single writer (maintenance.enabled: false, no `iotlake maintain`)."
    )


def find_javac() -> Path:
    """javac from $JAVA_HOME/bin, else PATH; a clear error naming the package when it is missing."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "javac" if java_home else None
    if candidate is not None and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("javac")
    if found is None:
        raise JavaMissingError(
            "javac (the Java compiler) is missing; it builds the put-if-absent Delta log store once. Install a "
            "JDK 17+ (Debian/Ubuntu: `apt-get install openjdk-17-jdk-headless`; macOS: `brew install openjdk@17`), "
            "or set storage.log_store: single_driver if only one process ever writes the tables."
        )
    return Path(found)


def compile_classpath(settings: Settings) -> list[Path]:
    """Spark's own jars (Hadoop client) plus delta-storage and hadoop-aws from the Ivy cache."""
    import pyspark

    ivy_jars = resolve_path(settings.spark.ivy_cache) / "jars"
    needed = [
        ivy_jars / f"io.delta_delta-storage-{delta_version()}.jar",
        ivy_jars / f"org.apache.hadoop_hadoop-aws-{HADOOP_VERSION}.jar",
    ]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        raise StackError(
            f"Can't build the log store: {', '.join(missing)} not found. Resolve Spark's jars first with "
            "`make install` (or `python -m streaming.core.session`)."
        )
    return [Path(pyspark.__file__).parent / "jars" / "*", *needed]


def build_jar(settings: Settings, source: Path = SOURCE, target: Path | None = None) -> Path:
    """Compile the log store and package it; atomic, so concurrent builders can't leave half a jar."""
    target = target or jar_path(source.read_text())
    javac = find_javac()
    classpath = os.pathsep.join(str(p) for p in compile_classpath(settings))
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="iotlake-logstore-") as tmp:
        classes = Path(tmp) / "classes"
        argv = [str(javac), "--release", "17", "-nowarn", "-cp", classpath, "-d", str(classes), str(source)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=JAVAC_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise StackError(f"javac failed to run ({e}). Check the JDK (`javac -version`).") from e
        if done.returncode != 0:
            raise StackError(f"javac could not compile {source}:\n{done.stderr.strip()[-2000:]}")
        staged = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: iotlake\n\n")
            for cls in sorted(classes.rglob("*.class")):
                jar.write(cls, cls.relative_to(classes).as_posix())
        os.replace(staged, target)
    return target


def ensure_jar(settings: Settings) -> tuple[Path, bool]:
    """The jar for the current source, built if missing; True when it was built now."""
    target = jar_path()
    if target.exists():
        return target, False
    return build_jar(settings, target=target), True
