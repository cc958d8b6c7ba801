"""The streaming job (`iotlake ingest`): Kafka -> parse, validate, dedup -> MERGE into the Delta tables.

One message's path, top to bottom: schema -> rules -> batch -> tables, wired by ingest.
"""
