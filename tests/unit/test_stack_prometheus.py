"""The native Prometheus' files: config from monitoring/prometheus.yml, targets from the configured ports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from stack import prometheus as prom
from stack.layout import StackLayout
from streaming.core.config import load_settings
from streaming.core.errors import ConfigError, StackError

pytestmark = pytest.mark.unit


def test_render_config_changes_only_the_intervals() -> None:
    settings = load_settings(env={"IOTLAKE_MONITORING__SCRAPE_INTERVAL": "1 minute"})
    rendered = yaml.safe_load(prom.render_config(settings))
    source = yaml.safe_load(prom.CONFIG_SOURCE.read_text())
    assert rendered["global"].pop("scrape_interval") == "60s"
    assert rendered["global"].pop("evaluation_interval") == "60s"
    source["global"].pop("scrape_interval"), source["global"].pop("evaluation_interval")
    assert rendered == source


def test_jobs_in_the_config_match_the_target_files() -> None:
    config = yaml.safe_load(prom.CONFIG_SOURCE.read_text())
    files = {job["job_name"]: job["file_sd_configs"][0]["files"] for job in config["scrape_configs"]}
    assert files == {job: [f"targets/{name}.json"] for job, name in prom.TARGET_FILES.items()}
    compose = Path(prom.MONITORING_DIR / "compose" / "targets")
    assert sorted(p.name for p in compose.glob("*.json")) == sorted(f"{n}.json" for n in prom.TARGET_FILES.values())


def test_native_targets_follow_the_configured_ports(tmp_path: Path) -> None:
    settings = load_settings(
        env={"IOTLAKE_INGEST__METRICS_PORT": "29108", "IOTLAKE_MONITORING__PROMETHEUS_PORT": "29090"}
    )
    targets = prom.native_targets(settings, simulator_port=None)
    assert targets["iotlake-ingest"] == ["127.0.0.1:29108"]
    assert targets["prometheus"] == ["127.0.0.1:29090"]
    assert targets["sensor-sim"] == []
    layout = StackLayout(home=tmp_path, cache=tmp_path)
    prom.write_targets(layout, targets)
    written = json.loads((prom.targets_dir(layout) / "ingest.json").read_text())
    assert written == [{"targets": ["127.0.0.1:29108"], "labels": {}}]
    assert json.loads((prom.targets_dir(layout) / "simulator.json").read_text()) == []
    with pytest.raises(StackError, match="Unknown scrape job"):
        prom.write_targets(layout, {"nope": ["127.0.0.1:1"]})


def test_prepare_links_the_rules_and_is_idempotent(tmp_path: Path) -> None:
    layout = StackLayout(home=tmp_path, cache=tmp_path)
    settings = load_settings(env={})
    for _ in range(2):
        prom.prepare(settings, layout)
    link = prom.home(layout) / "rules"
    assert link.is_symlink() and link.resolve() == prom.RULES_SOURCE.resolve()
    assert (link / "iotlake.yml").exists()


def test_non_loopback_prometheus_host_is_refused() -> None:
    settings = load_settings(env={"IOTLAKE_MONITORING__PROMETHEUS_HOST": "0.0.0.0"})
    with pytest.raises(StackError, match=r"monitoring\.prometheus_host.*not loopback"):
        prom.address(settings)


@pytest.mark.parametrize("interval", ["0 seconds", "1.5 seconds", "10 minutes", "soon"])
def test_bad_scrape_interval_is_refused(interval: str) -> None:
    with pytest.raises(ConfigError, match=r"monitoring\.scrape_interval"):
        load_settings(env={"IOTLAKE_MONITORING__SCRAPE_INTERVAL": interval})
