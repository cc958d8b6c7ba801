#!/bin/sh
# Starts one KRaft node configured the way apache/kafka's image is: every KAFKA_<NAME> variable becomes the
# property <name> (lower case; `_` -> `.`, `__` -> `_`, `___` -> `-`), except the JVM option variables.
# CLUSTER_ID formats the log directory on first start. server.properties goes to a private temporary
# directory: the root filesystem may be read-only.
set -eu
: "${CLUSTER_ID:?set CLUSTER_ID (make secrets / python -m stack secrets writes KAFKA_CLUSTER_ID into .env)}"
: "${KAFKA_LOG_DIRS:?set KAFKA_LOG_DIRS to the data volume's path}"
umask 077
run_dir=$(mktemp -d)
props="$run_dir/server.properties"
env | sort | while IFS='=' read -r name value; do
  case "$name" in
    KAFKA_HEAP_OPTS|KAFKA_OPTS|KAFKA_JVM_PERFORMANCE_OPTS|KAFKA_LOG4J_OPTS|KAFKA_GC_LOG_OPTS|KAFKA_JMX_OPTS|KAFKA_TOOL_HEAP_OPTS) ;;
    KAFKA_*)
      key=$(printf '%s' "${name#KAFKA_}" | tr 'A-Z' 'a-z' | sed -e 's/___/-/g' -e 's/__/\x01/g' -e 's/_/./g' -e 's/\x01/_/g')
      printf '%s=%s\n' "$key" "$value" ;;
  esac
done > "$props"
for dir in $(printf '%s' "$KAFKA_LOG_DIRS" | tr ',' ' '); do
  if [ ! -f "$dir/meta.properties" ]; then
    kafka-storage.sh format --cluster-id "$CLUSTER_ID" --config "$props" --ignore-formatted
    break
  fi
done
exec java ${KAFKA_HEAP_OPTS:--Xmx1g -Xms1g} -XX:+UseG1GC -Djava.awt.headless=true ${KAFKA_OPTS:-} \
    -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.xml -cp '/opt/kafka/libs/*' kafka.Kafka "$props"
