"""Every pinned version outside pyproject.toml, in one place: the JVM side of the job and the native stack.

The Python packages (pyspark, delta-spark, ...) are pinned in pyproject.toml; the jars Spark fetches must match them.
"""

from __future__ import annotations

# The Spark job's extra jars: pyspark's Spark and Scala, and Spark 4.2's Hadoop (hadoop-aws for S3A, and the
# classpath the log store compiles on).
SPARK_VERSION = "4.2.0"
SCALA_BINARY_VERSION = "2.13"
HADOOP_VERSION = "3.5.0"

KAFKA_VERSION = "4.2.0"
# The Kafka client under Spark's Kafka source, newer than the 3.9.2 its connector asks for: 4.3.1 and later fix
# KAFKA-20673, an admin client's offset lookup that waits a minute for a broker that left the cluster.
KAFKA_CLIENTS_VERSION = "4.3.2"
# Kafka 4.2.0 itself depends on log4j-core 2.25.3 and logs through SLF4J 1.7.36, so the binding is the
# SLF4J 1.x one (log4j-slf4j-impl); log4j-slf4j2-impl would find no SLF4J 2 API and stay silent.
LOG4J2_VERSION = "2.25.3"
LOG4J2_SLF4J_BINDING = "log4j-slf4j-impl"

MINIO_MODULE = "github.com/minio/minio"
# The last upstream commit; the repository is in maintenance mode and its tags are not semver.
MINIO_VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"

# Debian bookworm's package; `apt-get download` fetches the .deb and `dpkg-deb -x` unpacks it into the cache
# (nothing is installed system-wide). The Go binaries need only glibc >= 2.34.
PROMETHEUS_PACKAGE = "prometheus"
PROMETHEUS_DEB_VERSION = "2.42.0+ds-5+deb12u1"

# The Docker Compose CLI that checks docker-compose.yml without a Docker engine (`docker-compose config`).
# Built from source: its go.mod has replace directives, so `go install module@version` refuses it.
COMPOSE_MODULE = "github.com/docker/compose/v5"
COMPOSE_VERSION = "v5.6.0"

# The Dockerfile linter (npm; the validator behind the VS Code Docker extension): `dockerfile-utils lint`.
DOCKERFILE_LINT_PACKAGE = "dockerfile-utils"
DOCKERFILE_LINT_VERSION = "0.16.3"

JAVA_MIN_MAJOR = 17
# Pinned so `mvn` doesn't pick whatever plugin version is newest on the day (needs Maven >= 3.6.3).
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

VERSIONS: dict[str, str] = {
    "spark": SPARK_VERSION,
    "hadoop": HADOOP_VERSION,
    "kafka": KAFKA_VERSION,
    "scala": SCALA_BINARY_VERSION,
    "log4j2": LOG4J2_VERSION,
    "log4j2-slf4j-binding": LOG4J2_SLF4J_BINDING,
    "minio": MINIO_VERSION,
    "prometheus": PROMETHEUS_DEB_VERSION,
    "compose": COMPOSE_VERSION,
    "dockerfile-lint": DOCKERFILE_LINT_VERSION,
    "java-min": str(JAVA_MIN_MAJOR),
}


def maven_properties() -> dict[str, str]:
    """The -D properties resources/pom.xml expects (it holds no versions itself)."""
    return {
        "kafka.version": KAFKA_VERSION,
        "scala.binary.version": SCALA_BINARY_VERSION,
        "log4j2.version": LOG4J2_VERSION,
        "log4j2.slf4j.binding": LOG4J2_SLF4J_BINDING,
    }
