"""Prometheus config and alert rules, checked by the real promtool (installed by `make install`, no services)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stack import prometheus as prom
from stack.install import promtool_binary
from stack.layout import StackLayout
from streaming.core.config import PROJECT_ROOT, load_settings

pytestmark = pytest.mark.unit

MONITORING = PROJECT_ROOT / "monitoring"
RULES = MONITORING / "rules" / "iotlake.yml"
TESTS = sorted((MONITORING / "tests").glob("*.yml"))


@pytest.fixture(scope="module")
def promtool() -> Path:
    tool = promtool_binary(StackLayout.default())
    if not os.access(tool, os.X_OK):
        pytest.fail(f"promtool is not installed at {tool}. Run `make install` (python -m stack install).")
    return tool


def run(promtool: Path, *args: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False)


def alerts() -> dict[str, dict[str, Any]]:
    rules = yaml.safe_load(RULES.read_text())
    return {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule}


def test_promtool_check_config_as_compose_mounts_it(promtool: Path, tmp_path: Path) -> None:
    """prometheus.yml + rules/ + compose/targets/ laid out as in the container: valid, every file found."""
    shutil.copy(MONITORING / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copytree(MONITORING / "rules", tmp_path / "rules")
    shutil.copytree(MONITORING / "compose" / "targets", tmp_path / "targets")
    result = run(promtool, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


def test_promtool_check_config_of_the_repo_file(promtool: Path) -> None:
    result = run(promtool, "check", "config", "monitoring/prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_config_as_the_native_stack_writes_it(promtool: Path, tmp_path: Path) -> None:
    """The native copy (intervals from monitoring.scrape_interval, rules link, targets) is valid too."""
    settings = load_settings(env={"IOTLAKE_MONITORING__SCRAPE_INTERVAL": "15 seconds"})
    layout = StackLayout(home=tmp_path, cache=tmp_path / "cache")
    config = prom.prepare(settings, layout)
    result = run(promtool, "check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    assert yaml.safe_load(config.read_text())["global"]["scrape_interval"] == "15s"


def test_promtool_check_rules(promtool: Path) -> None:
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout


def test_promtool_test_rules(promtool: Path) -> None:
    assert TESTS, "no promtool test files in monitoring/tests"
    result = run(promtool, "test", "rules", *map(str, TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(TESTS)


def test_promtool_test_rules_reports_a_wrong_expectation(promtool: Path, tmp_path: Path) -> None:
    """Negative control: a test that expects silence where the alert fires makes promtool fail."""
    test = yaml.safe_load((MONITORING / "tests" / "ingest_test.yml").read_text())
    test["rule_files"] = [str(RULES)]
    firing = next(t for t in test["tests"] for case in t["alert_rule_test"] if case["exp_alerts"])
    for case in firing["alert_rule_test"]:
        case["exp_alerts"] = []
    test["tests"] = [firing]
    broken = tmp_path / "broken_test.yml"
    broken.write_text(yaml.safe_dump(test))
    result = run(promtool, "test", "rules", str(broken))
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = set(alerts())
    assert names - fires == set(), f"alerts without a firing promtool test: {sorted(names - fires)}"
    assert names - quiet == set(), f"alerts without a not-firing promtool test: {sorted(names - quiet)}"
    assert (fires | quiet) - names == set(), "promtool tests name alerts that don't exist"


def test_every_alert_has_for_severity_summary_and_description() -> None:
    for name, rule in alerts().items():
        assert "for" in rule, name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"].strip() and rule["annotations"]["description"].strip(), name
