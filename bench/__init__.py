"""Benchmark of the iotlake pipeline on the real native stack: `python -m bench` (or `make bench`).

Sections: simulator throughput, sustained ingest, produce->queryable latency (with RSS), MERGE time
against table size. Results go to bench/results/<date>.json and .md.
"""
