"""The shared core: config, errors, the Spark session and log store, storage and Kafka helpers, Prometheus I/O.

It imports nothing of ours outside itself (an import contract in `make lint`).
"""
