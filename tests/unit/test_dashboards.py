"""The Grafana dashboards: generated from monitoring/grafana/build.py, every panel documented and querying only
metrics that the processes' metrics modules define. (Every query is run against a real Prometheus in
tests/integration/test_live_scenario.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from monitoring.grafana import build
from stack.install import promtool_binary
from stack.layout import StackLayout
from streaming.core.config import PROJECT_ROOT

pytestmark = pytest.mark.unit

PROVISIONING = PROJECT_ROOT / "monitoring" / "grafana" / "provisioning"


def panels() -> list[tuple[str, dict[str, Any]]]:
    return [(name, panel) for name, dashboard in build.committed().items() for panel in dashboard["panels"]]


def test_committed_json_is_what_build_generates() -> None:
    files = {file: build.render(d) for file, d in build.DASHBOARDS.items()}
    committed = {p.name: p.read_text() for p in build.DASHBOARDS_DIR.glob("*.json")}
    assert committed == files, "run `python -m monitoring.grafana.build` and commit the JSON"


def test_two_dashboards_ingestion_and_table_health() -> None:
    titles = {d["title"] for d in build.committed().values()}
    assert titles == {"iotlake / Ingestion", "iotlake / Table health"}
    uids = [d["uid"] for d in build.committed().values()]
    assert len(set(uids)) == len(uids)


def test_every_panel_has_unit_description_datasource_and_queries() -> None:
    for dashboard, panel in panels():
        where = f"{dashboard}: panel {panel.get('title')!r}"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
        assert len(panel.get("description", "")) > 20, f"{where} has no description"
        assert panel.get("datasource") == build.DATASOURCE, f"{where} has no prometheus datasource"
        assert panel.get("targets"), f"{where} has no queries"
        for target in panel["targets"]:
            assert target["expr"].strip() and target.get("datasource") == build.DATASOURCE, where
        ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ids)) == len(ids), f"{where} repeats a refId"
    ids = [(dashboard, panel["id"]) for dashboard, panel in panels()]
    assert len(set(ids)) == len(ids)


def test_panels_query_only_defined_metrics() -> None:
    known = build.defined_metric_names() | {"up"}
    unknown = {
        (dashboard, panel["title"], name)
        for dashboard, panel in panels()
        for target in panel["targets"]
        for name in build.metric_names(target["expr"])
        if name not in known
    }
    assert unknown == set(), "panels query metrics that no metrics module defines"


def test_metric_name_extraction() -> None:
    expr = 'sum by (table, kind) (rate(iot_x_total{job="iot_y"}[1m])) / on (instance) up - time()'
    assert build.metric_names(expr) == {"iot_x_total", "up"}


def test_every_panel_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (as a recording rule); Prometheus runs them in the integration test."""
    tool = promtool_binary(StackLayout.default())
    if not os.access(tool, os.X_OK):
        pytest.fail(f"promtool is not installed at {tool}. Run `make install` (python -m stack install).")
    exprs = [build.concrete(t["expr"]) for _, panel in panels() for t in panel["targets"]]
    rules = {
        "groups": [{"name": "panels", "rules": [{"record": f"panel:q{i}", "expr": e} for i, e in enumerate(exprs)]}]
    }
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([str(tool), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum(rate(x[1m]"}]}]}))
    broken = subprocess.run([str(tool), "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert broken.returncode != 0, "promtool accepted a broken expression"


def test_provisioning_points_grafana_at_prometheus_and_the_dashboards() -> None:
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert [(d["uid"], d["type"], d["url"]) for d in datasources] == [
        (build.DATASOURCE_UID, "prometheus", "http://prometheus:9090")
    ]
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "iotlake.yml").read_text())["providers"]
    assert [p["type"] for p in providers] == ["file"]
    assert providers[0]["options"]["path"].startswith("/")
