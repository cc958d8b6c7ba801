"""Spark Structured Streaming job: Kafka -> validate -> Delta Lake tables on MinIO."""
