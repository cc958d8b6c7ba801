#!/bin/sh
# Runs one Kafka command-line tool (a class of the broker's jars) in a small JVM, logging to stderr.
exec java ${KAFKA_TOOL_HEAP_OPTS:--Xmx256m} -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.xml -cp '/opt/kafka/libs/*' "$@"
