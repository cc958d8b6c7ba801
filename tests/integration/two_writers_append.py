"""One Spark driver of the two-writer test: appends small batches to one Delta table, started by a go file.

Run by tests/integration/test_two_writers.py as `python -m tests.integration.two_writers_append ...` with the
test's environment (IOTLAKE_*), so it builds its session exactly as the jobs do (streaming.core.session).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from streaming.core.config import load_settings
from streaming.core.session import build_session

GO_TIMEOUT_S = 600.0


def log_store_in_use(spark: SparkSession, uri: str) -> str:
    """The class Delta itself commits this table with (its DelegatingLogStore picks one per URI scheme)."""
    jvm = spark._jvm
    assert jvm is not None
    store = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri).store()
    return str(store.getDelegate(jvm.org.apache.hadoop.fs.Path(uri)).logStoreImpl().getClass().getName())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--table", required=True, help="table name under storage.base_uri")
    parser.add_argument("--writer", required=True)
    parser.add_argument("--appends", type=int, required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--create", action="store_true", help="create the table before saying ready")
    parser.add_argument("--ready", type=Path, required=True, help="gets Delta's log store class when ready")
    parser.add_argument("--go", type=Path, required=True, help="appends start once this file exists")
    args = parser.parse_args(argv)

    from delta.tables import DeltaTable

    settings = load_settings()
    spark = build_session(settings, app_name=f"two-writers-{args.writer}")
    try:
        uri = settings.storage.table_uri(args.table)
        if args.create:
            (
                DeltaTable.createIfNotExists(spark)
                .location(uri)
                .addColumn("writer", "STRING")
                .addColumn("append", "INT")
                .addColumn("row", "INT")
                .execute()
            )
        args.ready.write_text(log_store_in_use(spark, uri))
        deadline = time.monotonic() + GO_TIMEOUT_S
        while not args.go.exists():
            if time.monotonic() > deadline:
                print(f"no go file {args.go} within {GO_TIMEOUT_S:.0f}s", file=sys.stderr)
                return 1
            time.sleep(0.05)
        for i in range(args.appends):
            rows = [(args.writer, i, j) for j in range(args.rows)]
            frame = spark.createDataFrame(rows, "writer STRING, append INT, row INT").coalesce(1)
            frame.write.format("delta").mode("append").save(uri)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
