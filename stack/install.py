"""Idempotent install of what the native stack runs: Kafka broker jars (Maven), a MinIO binary (Go) and
Prometheus + promtool (Debian's package, unpacked into the cache without installing it).

Everything is cached by version outside the clone (see StackLayout.cache). Spark and Delta jars are not
handled here: Spark resolves them itself through Ivy (spark.ivy_cache).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from stack.layout import StackLayout
from stack.proc import run_checked
from streaming.core import versions
from streaming.core.errors import StackError

Echo = Callable[[str], None]

MVN_TIMEOUT_S = 15 * 60
GO_TIMEOUT_S = 60 * 60


@dataclass(frozen=True)
class Installed:
    """Paths of the installed pieces."""

    java: Path
    kafka_libs: Path
    minio: Path
    prometheus: Path
    promtool: Path

    @property
    def kafka_classpath(self) -> str:
        return f"{self.kafka_libs}/*"


def _say(echo: Echo | None, what: str, state: str, started: float) -> None:
    if echo is not None:
        echo(f"{what}: {state} ({time.monotonic() - started:.1f}s)")


# --- prerequisites -----------------------------------------------------------------------------------

_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_major(version_output: str) -> int | None:
    """The major version in `java -version` output ('1.8.0_x' -> 8, '17.0.15' -> 17)."""
    match = _JAVA_VERSION.search(version_output)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def find_java() -> Path:
    """A Java >= 17: $JAVA_HOME/bin/java, else `java` on PATH."""
    fix = (
        f"Install a Java {versions.JAVA_MIN_MAJOR}+ runtime (Debian/Ubuntu: `apt-get install "
        f"openjdk-{versions.JAVA_MIN_MAJOR}-jdk-headless`; macOS: "
        f"`brew install openjdk@{versions.JAVA_MIN_MAJOR}`) "
        "and put it on PATH or set JAVA_HOME."
    )
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is None or not os.access(candidate, os.X_OK):
        found = shutil.which("java")
        if found is None:
            where = f" (JAVA_HOME={java_home} has no bin/java)" if java_home else ""
            raise StackError(f"Java is missing{where}. Kafka and Spark need it. {fix}")
        candidate = Path(found)
    try:
        out = subprocess.run([str(candidate), "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise StackError(f"{candidate} -version failed: {e}. {fix}") from e
    major = java_major(out.stderr + out.stdout)
    if major is None:
        raise StackError(f"Can't tell the version of {candidate} from `java -version`. {fix}")
    if major < versions.JAVA_MIN_MAJOR:
        raise StackError(
            f"{candidate} is Java {major}; Kafka {versions.KAFKA_VERSION} needs Java {versions.JAVA_MIN_MAJOR}+. {fix}"
        )
    return candidate


def _require_tool(name: str, fix: str) -> Path:
    found = shutil.which(name)
    if found is None:
        raise StackError(f"{fix} Then run `python -m stack install` again.")
    return Path(found)


def find_mvn() -> Path:
    """Maven, which resolves the Kafka broker jars from Maven Central."""
    return _require_tool(
        "mvn",
        "Maven (mvn) is missing; it downloads the Kafka broker jars once. Install it (Debian/Ubuntu: "
        "`apt-get install maven`; macOS: `brew install maven`).",
    )


def find_go() -> Path:
    """Go, which builds the pinned MinIO server once."""
    return _require_tool(
        "go",
        "Go is missing; it builds the MinIO server once (about 4 minutes). Install a recent Go from "
        "https://go.dev/dl/ and put its bin directory on PATH.",
    )


_DEB_FIX = (
    "it fetches Debian's prometheus package once and unpacks it into the cache without installing it. "
    "Run this on Debian/Ubuntu (apt and dpkg are part of the base system), or install them "
    "(`apt-get install apt dpkg`)."
)


def find_apt_get() -> Path:
    """apt-get, which downloads the pinned prometheus .deb (no root needed for `apt-get download`)."""
    return _require_tool("apt-get", f"apt-get is missing; {_DEB_FIX}")


def find_dpkg_deb() -> Path:
    """dpkg-deb, which unpacks the prometheus .deb."""
    return _require_tool("dpkg-deb", f"dpkg-deb is missing; {_DEB_FIX}")


def check_prerequisites(layout: StackLayout | None = None) -> dict[str, Path]:
    """Check the tools the install needs, without installing anything: java always; mvn, go, apt-get and
    dpkg-deb only if their output is not cached yet. Returns the tools found by name."""
    layout = layout or StackLayout.default()
    tools = {"java": find_java()}
    if not _kafka_done(layout):
        tools["mvn"] = find_mvn()
    if not minio_binary(layout).exists():
        tools["go"] = find_go()
    if not _prometheus_done(layout):
        tools["apt-get"] = find_apt_get()
        tools["dpkg-deb"] = find_dpkg_deb()
    return tools


# --- Kafka jars ---------------------------------------------------------------------------------------


def kafka_dir(layout: StackLayout) -> Path:
    return layout.cache / "kafka" / versions.KAFKA_VERSION


def kafka_libs(layout: StackLayout) -> Path:
    return kafka_dir(layout) / "libs"


def _kafka_stamp() -> str:
    props = versions.maven_properties()
    return "".join(f"{k}={v}\n" for k, v in sorted(props.items()))


def _kafka_done(layout: StackLayout) -> bool:
    stamp = kafka_dir(layout) / "versions.txt"
    core = kafka_libs(layout) / f"kafka_{versions.SCALA_BINARY_VERSION}-{versions.KAFKA_VERSION}.jar"
    return core.exists() and stamp.exists() and stamp.read_text() == _kafka_stamp()


def install_kafka(layout: StackLayout, echo: Echo | None = print) -> Path:
    """Kafka broker + tools + log4j2 jars into <cache>/kafka/<version>/libs (resolved once, atomically)."""
    started = time.monotonic()
    what = f"kafka {versions.KAFKA_VERSION} jars"
    target = kafka_dir(layout)
    if _kafka_done(layout):
        _say(echo, what, "cached", started)
        return kafka_libs(layout)
    mvn = find_mvn()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{versions.KAFKA_VERSION}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        pom = tmp / "pom.xml"
        pom.write_bytes(resources.files("stack").joinpath("resources", "pom.xml").read_bytes())
        argv = [
            str(mvn),
            "-q",
            "-B",
            "-f",
            str(pom),
            f"{versions.MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={tmp / 'libs'}",
            *(f"-D{k}={v}" for k, v in versions.maven_properties().items()),
        ]
        run_checked(
            argv,
            what=f"Resolving {what} with Maven",
            fix="Check that Maven Central (https://repo.maven.apache.org) is reachable, or your "
            "~/.m2/settings.xml mirror, then run `python -m stack install` again.",
            timeout=MVN_TIMEOUT_S,
            cwd=tmp,
            log=layout.logs / "install-kafka.log",
        )
        (tmp / "versions.txt").write_text(_kafka_stamp())
        _replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not _kafka_done(layout):
        raise StackError(f"Maven finished but {kafka_libs(layout)} lacks the Kafka jar. Delete {target} and retry.")
    _say(echo, what, "installed", started)
    return kafka_libs(layout)


def _replace_dir(new: Path, target: Path) -> None:
    """Move a finished directory into place; an older (stale) one is moved aside first, then removed."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}-old-{os.getpid()}")
        target.rename(old)
    try:
        new.rename(target)
    except OSError:
        if not target.exists():  # a concurrent install won the race otherwise
            raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --- MinIO binary -------------------------------------------------------------------------------------


def minio_binary(layout: StackLayout) -> Path:
    return layout.cache / "minio" / versions.MINIO_VERSION / "minio"


def install_minio(layout: StackLayout, echo: Echo | None = print) -> Path:
    """`go install` the pinned MinIO server into <cache>/minio/<version>/minio (skipped when present)."""
    started = time.monotonic()
    what = f"minio {versions.MINIO_VERSION}"
    binary = minio_binary(layout)
    if binary.exists() and os.access(binary, os.X_OK):
        _say(echo, what, "cached", started)
        return binary
    go = find_go()
    binary.parent.mkdir(parents=True, exist_ok=True)
    if echo is not None:
        echo(f"{what}: building with go install (takes minutes; log: {layout.logs / 'install-minio.log'})")
    env = {**os.environ, "GOBIN": str(binary.parent), "GOFLAGS": "-mod=mod"}
    run_checked(
        [str(go), "install", f"{versions.MINIO_MODULE}@{versions.MINIO_VERSION}"],
        what=f"Building {what} with go install",
        fix="Check that the Go module proxy (https://proxy.golang.org or $GOPROXY) is reachable and that "
        "there is ~3 GB free disk and ~2 GB RAM, then run `python -m stack install` again.",
        timeout=GO_TIMEOUT_S,
        env=env,
        log=layout.logs / "install-minio.log",
    )
    if not binary.exists():
        raise StackError(f"go install finished but {binary} is missing. Check {layout.logs / 'install-minio.log'}.")
    _say(echo, what, "installed", started)
    return binary


# --- Prometheus + promtool ---------------------------------------------------------------------------

APT_TIMEOUT_S = 10 * 60


def prometheus_dir(layout: StackLayout) -> Path:
    return layout.cache / "prometheus" / versions.PROMETHEUS_DEB_VERSION


def prometheus_binary(layout: StackLayout) -> Path:
    return prometheus_dir(layout) / "usr" / "bin" / "prometheus"


def promtool_binary(layout: StackLayout) -> Path:
    return prometheus_dir(layout) / "usr" / "bin" / "promtool"


def _prometheus_done(layout: StackLayout) -> bool:
    return all(os.access(b, os.X_OK) for b in (prometheus_binary(layout), promtool_binary(layout)))


def install_prometheus(layout: StackLayout, echo: Echo | None = print) -> tuple[Path, Path]:
    """`apt-get download` the pinned prometheus .deb and `dpkg-deb -x` it into <cache>/prometheus/<version>.

    Returns (prometheus, promtool). Nothing is installed system-wide and no root is needed.
    """
    started = time.monotonic()
    pinned = f"{versions.PROMETHEUS_PACKAGE}={versions.PROMETHEUS_DEB_VERSION}"
    what = f"prometheus {versions.PROMETHEUS_DEB_VERSION}"
    target = prometheus_dir(layout)
    if _prometheus_done(layout):
        _say(echo, what, "cached", started)
        return prometheus_binary(layout), promtool_binary(layout)
    apt_get, dpkg_deb = find_apt_get(), find_dpkg_deb()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".prometheus-", dir=target.parent))
    tmp.chmod(0o755)  # apt's sandbox user must be able to write the .deb here
    try:
        run_checked(
            [str(apt_get), "download", "-q", pinned],
            what=f"Downloading {pinned} with apt-get",
            fix=f"Run `apt-get update` (as root) so apt knows {pinned}, check that the Debian mirror is "
            "reachable, then run `python -m stack install` again. If the mirror no longer serves this version, "
            "fetch it from https://snapshot.debian.org and pin the new one in streaming/core/versions.py.",
            timeout=APT_TIMEOUT_S,
            cwd=tmp,
        )
        debs = sorted(tmp.glob(f"{versions.PROMETHEUS_PACKAGE}_*.deb"))
        if len(debs) != 1:
            raise StackError(f"apt-get download {pinned} left {len(debs)} .deb files in {tmp}, expected 1. Retry.")
        root = tmp / "root"
        run_checked(
            [str(dpkg_deb), "-x", str(debs[0]), str(root)],
            what=f"Unpacking {debs[0].name} with dpkg-deb",
            fix="The download may be truncated: run `python -m stack install` again.",
            timeout=APT_TIMEOUT_S,
        )
        _replace_dir(root, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not _prometheus_done(layout):
        raise StackError(f"{target} lacks usr/bin/prometheus or usr/bin/promtool after unpacking. Delete it and retry.")
    _say(echo, what, "installed", started)
    return prometheus_binary(layout), promtool_binary(layout)


# --- all ----------------------------------------------------------------------------------------------


def installed(layout: StackLayout | None = None) -> Installed | None:
    """The installed pieces if everything is cached already (checks only, installs nothing)."""
    layout = layout or StackLayout.default()
    if not _kafka_done(layout) or not minio_binary(layout).exists() or not _prometheus_done(layout):
        return None
    return Installed(
        java=find_java(),
        kafka_libs=kafka_libs(layout),
        minio=minio_binary(layout),
        prometheus=prometheus_binary(layout),
        promtool=promtool_binary(layout),
    )


def install(layout: StackLayout | None = None, echo: Echo | None = print) -> Installed:
    """Check prerequisites, then install whatever is not cached yet. Safe to call again and again."""
    layout = layout or StackLayout.default()
    started = time.monotonic()
    tools = check_prerequisites(layout)
    _say(echo, "prerequisites", ", ".join(sorted(tools)) + " ok", started)
    libs = install_kafka(layout, echo)
    minio = install_minio(layout, echo)
    prometheus, promtool = install_prometheus(layout, echo)
    return Installed(java=tools["java"], kafka_libs=libs, minio=minio, prometheus=prometheus, promtool=promtool)
