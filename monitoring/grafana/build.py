"""The Grafana dashboards as code, built with grafana-foundation-sdk (Grafana's typed dashboard builders):
`python -m monitoring.grafana.build` writes monitoring/grafana/dashboards/*.json.

Each panel is declared once here with its unit, description and PromQL; the committed JSON is this module's
output (tests/unit/test_dashboards.py checks that they match, that every panel has a unit, a description and
a datasource, and that every metric it queries is defined in a process's metrics module).
Range selectors use Grafana's `$__rate_interval`; the integration test substitutes a real window.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from grafana_foundation_sdk.builders import common, prometheus, stat, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard as DashboardBuilder
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    BigValueTextMode,
    GraphDrawStyle,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TooltipDisplayMode,
    VisibilityMode,
)
from grafana_foundation_sdk.models.dashboard import Dashboard, DashboardCursorSync, DataSourceRef, Panel

DASHBOARDS_DIR = Path(__file__).resolve().parent / "dashboards"
DATASOURCE_UID = "prometheus"  # provisioning/datasources/prometheus.yml gives the datasource this uid
DATASOURCE = {"type": "prometheus", "uid": DATASOURCE_UID}
_DATASOURCE_REF = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
GRID_WIDTH = 24
RATE = "$__rate_interval"

ROWS_PER_S = "suffix: rows/s"
_RUNS_ZERO = "sum by (table, operation) (increase(iot_maintenance_runs_total[1h])) * 0"
FILES_PER_S = "suffix: files/s"


class Query(NamedTuple):
    expr: str
    legend: str


def _target(ref_id: str, query: Query) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .ref_id(ref_id)
        .datasource(_DATASOURCE_REF)
        .expr(query.expr)
        .legend_format(query.legend)
        .range()
    )


def _stat(title: str, description: str, unit: str, query: Query, width: int) -> stat.Panel:
    """A stat panel: the query's last value, with its sparkline."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(_DATASOURCE_REF)
        .span(width)
        .height(5)
        .with_target(_target("A", query))
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(BigValueColorMode.VALUE)
        .graph_mode(BigValueGraphMode.AREA)
        .text_mode(BigValueTextMode.AUTO)
    )


def _graph(
    title: str, description: str, unit: str, *queries: Query, stacked: bool = False, width: int = 12
) -> timeseries.Panel:
    """A time series panel: lines, or stacked areas; legend below, a tooltip with every series, largest first."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(_DATASOURCE_REF)
        .span(width)
        .height(8)
        .draw_style(GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(20 if stacked else 10)
        .show_points(VisibilityMode.NEVER)
        .stacking(common.StackingConfig().mode(StackingMode.NORMAL if stacked else StackingMode.NONE).group("A"))
        .legend(
            common.VizLegendOptions()
            .display_mode(LegendDisplayMode.LIST)
            .placement(LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING))
    )
    for i, query in enumerate(queries):
        panel.with_target(_target(chr(ord("A") + i), query))
    return panel


def _dashboard(uid: str, title: str, description: str, panels: Sequence[Builder[Panel]]) -> Dashboard:
    """The dashboard, its panels numbered and laid out left to right, top to bottom.

    The layout is ours: a panel wider than what is left of its row starts the next row, where the SDK's
    `with_panel` would place it past the grid's 24 columns.
    """
    builder = (
        DashboardBuilder(title)
        .uid(uid)
        .description(description)
        .tags(["iotlake"])
        .timezone("browser")
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .refresh("10s")
        .version(1)
        .time("now-1h", "now")
        .variables([])
        .annotations([])
    )
    for panel in panels:
        builder.with_panel(panel)
    dashboard = builder.build()
    x = y = row_height = 0
    for panel_id, model in enumerate(dashboard.panels or [], start=1):
        pos = model.grid_pos
        assert pos is not None, "with_panel gives every panel a position"
        if x + pos.w > GRID_WIDTH:
            x, y, row_height = 0, y + row_height, 0
        model.id_val, pos.x, pos.y = panel_id, x, y
        x += pos.w
        row_height = max(row_height, pos.h)
    return dashboard


def _rate(metric: str, by: str = "") -> str:
    grouping = f"sum by ({by}) " if by else "sum "
    return f"{grouping}(rate({metric}[{RATE}]))"


INGESTION = _dashboard(
    uid="iotlake-ingestion",
    title="iotlake / Ingestion",
    description="The streaming job (iotlake ingest): throughput, latency, Kafka lag, batch phases, data quality.",
    panels=(
        _stat(
            "Query up",
            "1 while the streaming query runs (iot_ingest_query_up); 0 or no data: the stream is down.",
            "bool_on_off",
            Query("min(iot_ingest_query_up)", "query up"),
            width=4,
        ),
        _stat(
            "Freshness",
            "Seconds between now and the newest event time committed to readings: how old the lake's newest "
            "data is. Alert IotIngestFreshnessHigh above 5 minutes.",
            "s",
            Query("max(iot_ingest_freshness_seconds)", "freshness"),
            width=4,
        ),
        _stat(
            "Kafka lag (total)",
            "Messages in Kafka not yet processed, summed over partitions (latest offset minus the offset the "
            "last batch ended at).",
            "short",
            Query("sum(iot_ingest_kafka_lag_messages)", "lag"),
            width=4,
        ),
        _stat(
            "Batches committed (1h)",
            "Micro-batches the stream committed in the last hour.",
            "short",
            Query("sum(increase(iot_ingest_batches_total[1h]))", "batches"),
            width=4,
        ),
        _stat(
            "Query starts (1h)",
            "How often the streaming query (re)started in the last hour; more than one means restarts.",
            "short",
            Query("sum(increase(iot_ingest_query_starts_total[1h]))", "starts"),
            width=4,
        ),
        _stat(
            "Last batch id",
            "Id of the last micro-batch committed to the tables (it survives restarts with the checkpoint).",
            "none",
            Query("max(iot_ingest_last_batch_id)", "batch id"),
            width=4,
        ),
        _graph(
            "Throughput",
            "Kafka messages read per second (counter rate), next to Spark's own input and processing rates "
            "of the last batch.",
            ROWS_PER_S,
            Query(_rate("iot_ingest_input_rows_total"), "read (counter rate)"),
            Query("sum(iot_ingest_input_rows_per_second)", "input rate (last batch)"),
            Query("sum(iot_ingest_processed_rows_per_second)", "processed rate (last batch)"),
        ),
        _graph(
            "Messages by outcome",
            "Messages per second by validation outcome: ok, warn (kept, counted), drop, quarantine.",
            ROWS_PER_S,
            Query(_rate("iot_ingest_rows_total", "outcome"), "{{outcome}}"),
            stacked=True,
        ),
        _graph(
            "Latency: freshness and batch duration",
            "Freshness (now minus the newest committed event time) and the 50th/95th percentile of the "
            "foreachBatch wall time.",
            "s",
            Query("max(iot_ingest_freshness_seconds)", "freshness"),
            Query(
                f"histogram_quantile(0.5, sum by (le) (rate(iot_ingest_batch_duration_seconds_bucket[{RATE}])))",
                "batch p50",
            ),
            Query(
                f"histogram_quantile(0.95, sum by (le) (rate(iot_ingest_batch_duration_seconds_bucket[{RATE}])))",
                "batch p95",
            ),
        ),
        _graph(
            "Kafka lag by partition",
            "Messages behind the latest offset, per topic partition. Growing lag: ingest is slower than the "
            "producers (alert IotIngestLagGrowing).",
            "short",
            Query("sum by (partition) (iot_ingest_kafka_lag_messages)", "partition {{partition}}"),
        ),
        _graph(
            "Batch phases",
            "The last batch's durationMs from Spark's progress report, by phase (addBatch, getBatch, "
            "latestOffset, queryPlanning, walCommit, commitOffsets, triggerExecution).",
            "s",
            Query("max by (phase) (iot_ingest_batch_phase_seconds)", "{{phase}}"),
        ),
        _graph(
            "Batch steps",
            "The last batch's wall time inside foreachBatch, by step (validate, quarantine_append, "
            "readings_merge, and device_state_merge or, between its upserts, device_state_fold).",
            "s",
            Query("max by (step) (iot_ingest_batch_step_seconds)", "{{step}}"),
            stacked=True,
        ),
        _graph(
            "Quarantined by rule",
            "Messages per second sent to the quarantine table, by the validation rule they failed.",
            ROWS_PER_S,
            Query(_rate("iot_ingest_quarantined_rows_total", "rule"), "{{rule}}"),
            stacked=True,
        ),
        _graph(
            "Quarantine ratio",
            "Quarantined messages as a share of all messages read. Alert IotIngestQuarantineRateHigh above 5%.",
            "percentunit",
            Query(
                f"{_rate('iot_ingest_quarantined_rows_total')} / {_rate('iot_ingest_input_rows_total')}",
                "quarantined",
            ),
        ),
        _graph(
            "Rows merged",
            "Rows written by MERGE per second, by table and kind (inserted, updated).",
            ROWS_PER_S,
            Query(_rate("iot_ingest_merged_rows_total", "table, kind"), "{{table}} {{kind}}"),
            stacked=True,
        ),
        _graph(
            "Write conflicts with the sidecar (1h)",
            "Table writes of the stream that lost a commit race to the maintenance sidecar and were retried "
            "(exactly once: Delta transaction ids), by table, in the last hour.",
            "short",
            Query(
                "sum by (table) (increase(iot_ingest_write_conflicts_total[1h])) or "
                "sum by (table) (increase(iot_ingest_merged_rows_total[1h])) * 0",
                "{{table}}",
            ),
        ),
        _graph(
            "Duplicates",
            "Valid messages per second that were not inserted because readings already holds their event_id "
            "(producer retries, replays).",
            ROWS_PER_S,
            Query(_rate("iot_ingest_duplicate_rows_total"), "duplicates"),
        ),
        _graph(
            "Simulator: messages",
            "The sensor simulator's messages per second by kind (sent and failed), when it runs with --metrics-port.",
            ROWS_PER_S,
            Query(_rate("iot_sim_messages_sent_total", "kind"), "sent {{kind}}"),
            # No failures means no failed series at all: show 0 per kind rather than "No data".
            Query(
                _rate("iot_sim_messages_failed_total", "kind")
                + " or "
                + _rate("iot_sim_messages_sent_total", "kind")
                + " * 0",
                "failed {{kind}}",
            ),
        ),
        _graph(
            "Simulator: delivery latency",
            "95th percentile of the time from produce() to the broker's delivery report.",
            "s",
            Query(
                f"histogram_quantile(0.95, sum by (le) (rate(iot_sim_delivery_latency_seconds_bucket[{RATE}])))",
                "p95",
            ),
        ),
    ),
)

TABLE_HEALTH = _dashboard(
    uid="iotlake-table-health",
    title="iotlake / Table health",
    description="The Delta tables as the maintenance sidecar (iotlake maintain) sees them in their logs: "
    "files, sizes, versions, churn, and what compaction and VACUUM did.",
    panels=(
        _stat(
            "Sidecar up",
            "1 while the maintenance sidecar runs its loop (iot_maintenance_up).",
            "bool_on_off",
            Query("min(iot_maintenance_up)", "sidecar up"),
            width=6,
        ),
        _stat(
            "Maintenance cycles (1h)",
            "Sidecar cycles completed in the last hour.",
            "short",
            Query("sum(increase(iot_maintenance_cycles_total[1h]))", "cycles"),
            width=6,
        ),
        _stat(
            "Table version",
            "Current Delta version of each table.",
            "short",
            Query("max by (table) (iot_table_version)", "{{table}}"),
            width=12,
        ),
        _graph(
            "Files",
            "Data files in each table's current snapshot.",
            "short",
            Query("max by (table) (iot_table_files)", "{{table}}"),
        ),
        _graph(
            "Small files",
            "Files below maintenance.small_file_mb, per table. Compaction is triggered by these.",
            "short",
            Query("max by (table) (iot_table_small_files)", "{{table}}"),
        ),
        _graph(
            "Small-file ratio",
            "Small files as a share of all files. Alert IotTableSmallFilesNotCompacted above 50% with no "
            "OPTIMIZE for an hour.",
            "percentunit",
            Query("max by (table) (iot_table_small_file_ratio)", "{{table}}"),
        )
        .min(0)
        .max(1),
        _graph(
            "Table size",
            "Bytes of the data files in each table's current snapshot.",
            "bytes",
            Query("max by (table) (iot_table_bytes)", "{{table}}"),
        ),
        _graph(
            "Average file size",
            "Bytes per data file. Far below maintenance.target_file_size_mb means the table needs compaction.",
            "bytes",
            Query("max by (table) (iot_table_avg_file_bytes)", "{{table}}"),
        ),
        _graph(
            "Rows, partitions and skew",
            "Rows (from file statistics), partitions, and the largest partition's size over the median one.",
            "short",
            Query("max by (table) (iot_table_rows)", "rows {{table}}"),
            Query("max by (table) (iot_table_partitions)", "partitions {{table}}"),
            Query("max by (table) (iot_table_partition_skew_ratio)", "skew {{table}}"),
        ),
        _graph(
            "Commits",
            "Commits to each table during the last sidecar interval.",
            "short",
            Query("max by (table) (iot_table_commits_last_interval)", "{{table}}"),
        ),
        _graph(
            "Time since commit, OPTIMIZE, VACUUM, checkpoint",
            "Seconds since the last commit, the last OPTIMIZE, the last VACUUM and the last checkpoint, per "
            "table (ages at scrape time).",
            "s",
            Query("max by (table) (iot_table_last_commit_age_seconds)", "commit {{table}}"),
            Query("max by (table) (iot_table_last_optimize_age_seconds)", "optimize {{table}}"),
            Query("max by (table) (iot_table_last_vacuum_age_seconds)", "vacuum {{table}}"),
            Query("max by (table) (iot_table_checkpoint_age_seconds)", "checkpoint {{table}}"),
            width=24,
        ),
        _graph(
            "Churn: files",
            "Data files added and removed per second by commits (appends, MERGE rewrites, OPTIMIZE).",
            FILES_PER_S,
            Query(_rate("iot_table_files_added_total", "table"), "added {{table}}"),
            Query(_rate("iot_table_files_removed_total", "table"), "removed {{table}}"),
        ),
        _graph(
            "Churn: bytes",
            "Bytes added and removed per second by commits.",
            "Bps",
            Query(_rate("iot_table_bytes_added_total", "table"), "added {{table}}"),
            Query(_rate("iot_table_bytes_removed_total", "table"), "removed {{table}}"),
        ),
        _graph(
            "Churn: rows",
            "Rows inserted, updated and deleted per second, from the commits' operationMetrics.",
            ROWS_PER_S,
            Query(_rate("iot_table_rows_inserted_total", "table"), "inserted {{table}}"),
            Query(_rate("iot_table_rows_updated_total", "table"), "updated {{table}}"),
            Query(_rate("iot_table_rows_deleted_total", "table"), "deleted {{table}}"),
        ),
        _graph(
            "Maintenance runs (1h)",
            "OPTIMIZE and VACUUM runs of the sidecar in the last hour, by table and operation.",
            "short",
            Query(
                "sum by (table, operation) (increase(iot_maintenance_runs_total[1h]))",
                "{{operation}} {{table}}",
            ),
        ),
        _graph(
            "Running now",
            "1 while the sidecar runs an OPTIMIZE or VACUUM on the table (iot_maintenance_in_progress).",
            "short",
            Query("max by (table, operation) (iot_maintenance_in_progress)", "{{operation}} {{table}}"),
        ),
        _graph(
            "Time since last successful run",
            "Seconds since each table's last successful OPTIMIZE and VACUUM by the sidecar.",
            "s",
            Query(
                "time() - max by (table, operation) (iot_maintenance_last_success_timestamp_seconds)",
                "{{operation}} {{table}}",
            ),
        ),
        _graph(
            "Maintenance duration (p95)",
            "95th percentile of one OPTIMIZE or VACUUM run, by operation.",
            "s",
            Query(
                "histogram_quantile(0.95, sum by (le, operation) (rate(iot_maintenance_duration_seconds_bucket[1h])))",
                "{{operation}}",
            ),
        ),
        _graph(
            "Compaction work (1h)",
            "Files compacted and bytes rewritten by OPTIMIZE in the last hour, per table.",
            "short",
            Query(
                "sum by (table) (increase(iot_maintenance_files_compacted_total[1h]))",
                "files compacted {{table}}",
            ),
        ),
        _graph(
            "Bytes rewritten (1h)",
            "Bytes OPTIMIZE rewrote in the last hour, per table.",
            "bytes",
            Query("sum by (table) (increase(iot_maintenance_bytes_rewritten_total[1h]))", "{{table}}"),
        ),
        _graph(
            "Maintenance conflicts and failures (1h)",
            "Commit conflicts with the stream (the sidecar backs off and retries) and failed runs, by table and "
            "operation. Alerts IotMaintenanceConflicting (5/h) and IotMaintenanceFailing (3/h).",
            "short",
            # A clean hour has no conflict or failure series: show 0 for every table and operation that ran.
            Query(
                "sum by (table, operation) (increase(iot_maintenance_conflicts_total[1h])) or " + _RUNS_ZERO,
                "conflicts {{operation}} {{table}}",
            ),
            Query(
                "sum by (table, operation) (increase(iot_maintenance_failures_total[1h])) or " + _RUNS_ZERO,
                "failures {{operation}} {{table}}",
            ),
        ),
        _graph(
            "VACUUM: reclaimable and deleted",
            "Bytes VACUUM would reclaim now (files removed from the table but still on storage), and bytes "
            "VACUUM deleted in the last hour.",
            "bytes",
            Query("max by (table) (iot_table_vacuum_reclaimable_bytes)", "reclaimable {{table}}"),
            Query(
                "sum by (table) (increase(iot_maintenance_vacuum_bytes_deleted_total[1h]))",
                "deleted (1h) {{table}}",
            ),
        ),
        _graph(
            "VACUUM: files",
            "Files VACUUM would delete now, and files it deleted in the last hour.",
            "short",
            Query("max by (table) (iot_table_vacuum_reclaimable_files)", "reclaimable {{table}}"),
            Query(
                "sum by (table) (increase(iot_maintenance_vacuum_files_deleted_total[1h]))",
                "deleted (1h) {{table}}",
            ),
        ),
    ),
)

DASHBOARDS = {"ingestion.json": INGESTION, "table-health.json": TABLE_HEALTH}


# --- reading dashboards back (the tests use these) ----------------------------------------------------

_METRIC = re.compile(r"\b(iot_[a-z0-9_]+|up)\b(?!\s*\()")
_LABEL_CONTEXT = re.compile(r"(\{[^}]*\}|\b(?:by|without|on|ignoring)\s*\([^)]*\))")


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def committed() -> dict[str, dict[str, Any]]:
    """Every committed dashboard JSON by file name."""
    return {path.name: load(path) for path in sorted(DASHBOARDS_DIR.glob("*.json"))}


def targets(dashboard: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) pairs of a dashboard model, rows' nested panels included."""
    pairs = []
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            pairs += [(inner, target) for target in inner.get("targets", [])]
    return pairs


def concrete(expr: str, window: str = "1m") -> str:
    """The PromQL Grafana would send, with its range variables replaced by a fixed window."""
    for variable in ("$__rate_interval", "$__interval", "$__range"):
        expr = expr.replace(variable, window)
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (iot_* and up), label matchers and groupings left out."""
    return set(_METRIC.findall(_LABEL_CONTEXT.sub(" ", expr)))


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def defined_metric_names() -> set[str]:
    """Every sample name of every process's metrics classes (each built on a fresh registry): the job's, the
    sidecar's and the simulator's."""
    from prometheus_client import CollectorRegistry

    from producers import metrics as simulator_metrics
    from streaming.lake import metrics as sidecar_metrics
    from streaming.pipeline import metrics as job_metrics

    names: set[str] = set()
    for module in (job_metrics, sidecar_metrics, simulator_metrics):
        classes: list[tuple[str, Any]] = inspect.getmembers(module, inspect.isclass)
        for _, cls in classes:
            if cls.__module__ != module.__name__ or "registry" not in getattr(cls, "__dataclass_fields__", {}):
                continue
            registry = CollectorRegistry()
            cls(registry=registry)
            for family in registry.collect():
                names |= {family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",))}
    return names


def render(dashboard: Dashboard) -> str:
    """The dashboard's JSON text exactly as committed."""
    return json.dumps(dashboard, cls=JSONEncoder, indent=2) + "\n"


def write(folder: Path = DASHBOARDS_DIR) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for file, dashboard in DASHBOARDS.items():
        path = folder / file
        path.write_text(render(dashboard))
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    for path in write():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
