# syntax=docker/dockerfile:1
# The one iotlake application image: ingest, maintain, the simulator, minio-init and the Spark standalone
# master/worker all run it (docker-compose.yml). Python 3.11 + a Java 17 runtime + the project installed
# from pyproject.toml (its one dependency list, the same the native `make install` uses) + the
# Spark/Delta/S3A/Kafka jars resolved at build time, so containers never download jars at start-up.
#
#   docker build -t iotlake:0.1.0 .                              # what `docker compose build` does
#   docker build --build-arg WITH_LOGSTORE=false -t iotlake:0.1.0 .  # without the put-if-absent log store jar
#
# Base images are pinned by tag (bump them here, together).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG JDK_IMAGE=eclipse-temurin:17.0.16_8-jdk-jammy
ARG JRE_IMAGE=eclipse-temurin:17.0.16_8-jre-jammy

FROM ${JDK_IMAGE} AS jdk
FROM ${JRE_IMAGE} AS jre

# ---- build: venv with the project, Ivy cache with the jars -------------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV JAVA_HOME=/opt/java/openjdk \
    PATH=/opt/venv/bin:/opt/java/openjdk/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    IOTLAKE_SPARK__IVY_CACHE=/opt/iotlake/ivy \
    IOTLAKE_CACHE=/opt/iotlake/cache
# A full JDK here: the optional log-store step compiles a Java class against the resolved jars.
COPY --from=jdk /opt/java/openjdk /opt/java/openjdk
# Extra CA certificates (*.crt) for a TLS-intercepting proxy between this build and PyPI / Maven Central:
# trusted by pip (PIP_CERT: the system bundle) and by Java (Ivy), in this stage only. See deploy/ca/README.md.
ARG EXTRA_CA_DIR=deploy/ca
COPY ${EXTRA_CA_DIR}/ /usr/local/share/ca-certificates/iotlake-extra/
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN update-ca-certificates >/dev/null \
    && for crt in /usr/local/share/ca-certificates/iotlake-extra/*.crt; do \
         [ -e "$crt" ] || continue; \
         keytool -importcert -noprompt -cacerts -storepass changeit -alias "iotlake-$(basename "$crt" .crt)" \
           -file "$crt" >/dev/null; \
       done
RUN python -m venv /opt/venv
WORKDIR /app

# Dependencies first, for the layer cache: read from pyproject.toml's [project] dependencies (no second list).
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

# Spark's Delta, Kafka-source and S3A jars, resolved by the project's own resolver into the image's Ivy cache,
# and the put-if-absent Delta log store (streaming/core/logstore.py: two writer processes per table are safe
# with it), compiled with the JDK into $IOTLAKE_CACHE/jars, where streaming.core.session looks for it: the
# runtime stage has no javac. Both need only the config and streaming/core (which imports nothing else of
# ours), so a change elsewhere in the code keeps these layers (and their ~750 MB download).
# WITH_LOGSTORE=false skips the log store (then set storage.log_store=single_driver and keep one writer per table).
COPY config ./config
COPY streaming/__init__.py ./streaming/
COPY streaming/core ./streaming/core
COPY streaming/jvm ./streaming/jvm
RUN PYTHONPATH=/app python -m streaming.core.session
ARG WITH_LOGSTORE=true
RUN case "$WITH_LOGSTORE" in \
      false) echo "log store jar: skipped (WITH_LOGSTORE=false)" ;; \
      true) PYTHONPATH=/app python -c "from streaming.core.config import load_settings; from streaming.core.logstore import ensure_jar; print('log store jar:', ensure_jar(load_settings())[0])" ;; \
      *) echo "WITH_LOGSTORE must be true or false" >&2; exit 1 ;; \
    esac

# The project itself, editable as in the native install: /app is the project root, so config/default.yaml
# and relative paths such as checkpoints/ingest resolve the same way.
COPY README.md ./
# The template `python -m stack secrets` fills (so the image can write a .env for hosts without Python).
COPY .env.example ./
COPY producers ./producers
COPY streaming ./streaming
COPY stack ./stack
COPY bench ./bench
RUN pip install --no-deps -e .

# ---- runtime: the same Python, a JRE, the venv, the jars, non-root ---------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="iotlake" \
      org.opencontainers.image.description="Streaming IoT lakehouse ingestion: Kafka -> Spark -> Delta Lake on MinIO" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV JAVA_HOME=/opt/java/openjdk \
    PATH=/opt/venv/bin:/opt/java/openjdk/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    IOTLAKE_SPARK__IVY_CACHE=/opt/iotlake/ivy \
    IOTLAKE_CACHE=/opt/iotlake/cache \
    HOME=/home/iotlake
COPY --from=jre /opt/java/openjdk /opt/java/openjdk
RUN groupadd --system --gid 10001 iotlake \
    && useradd --system --uid 10001 --gid iotlake --home-dir /home/iotlake --create-home \
        --shell /usr/sbin/nologin iotlake
# The largest and steadiest layers first, the code last: a code change rebuilds only the last layer.
# Ivy writes resolution reports into its cache at every session start: the runtime user owns it (and the
# log store jar in /opt/iotlake/cache).
COPY --from=build --chown=iotlake:iotlake /opt/iotlake /opt/iotlake
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
# Mount points for the volumes; a new named volume takes this ownership.
RUN mkdir -p /app/checkpoints /app/var /tmp/spark-work \
    && chown iotlake:iotlake /app/checkpoints /app/var /tmp/spark-work
WORKDIR /app
USER iotlake
# Metrics: ingest 9108, maintain 9109, simulator 9110; Spark master 7077 / UI 8080, worker UI 8081.
EXPOSE 9108 9109 9110 7077 8080 8081
# The default command is the streaming job; compose sets each service's own healthcheck.
HEALTHCHECK --interval=30s --timeout=15s --start-period=180s --retries=3 \
    CMD ["python", "-m", "stack", "probe", "http://127.0.0.1:9108/metrics", "--require", "iot_ingest_query_up"]
CMD ["iotlake", "ingest"]
