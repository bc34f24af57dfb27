"""The monitoring files on their own: promtool checks and unit tests, the
generated dashboard is current, Grafana provisioning points at it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from k3rocm import dashboard

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "monitoring"
DASHBOARD_JSON = MONITORING / "grafana" / "dashboards" / "kimi-k3-rocm.json"
ALERTS = (
    "KimiK3ServerDown",
    "EngineStepLatencyP99High",
    "PrefillStepLatencyRegression",
    "StallFreePathNotVerified",
    "SmokeTestFailed",
    "KVCacheNearlyFull",
    "RequestsQueueing",
)


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["promtool", *args], cwd=MONITORING, capture_output=True, text=True
    )


def alert_rules() -> list[dict]:
    [group] = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]
    return group["rules"]


def test_promtool_check_config():
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_rules():
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_summary_and_runbook():
    rules = alert_rules()
    assert sorted({rule["alert"] for rule in rules}) == sorted(ALERTS)
    for rule in rules:
        assert rule["annotations"]["summary"] and rule["annotations"]["runbook"]
        assert rule["labels"]["severity"] in ("warning", "critical")


def test_promtool_tests_cover_every_alert_firing_and_quiet():
    tests = yaml.safe_load((MONITORING / "alerts.test.yml").read_text())["tests"]
    checks = [check for test in tests for check in test["alert_rule_test"]]
    for alert in ALERTS:
        mine = [check for check in checks if check["alertname"] == alert]
        assert any(check.get("exp_alerts") for check in mine), f"{alert} never fires"
        assert any(not check.get("exp_alerts") for check in mine), (
            f"{alert} is never checked quiet"
        )
    fired_kinds = {
        alert["exp_labels"].get("kind")
        for check in checks
        if check["alertname"] == "EngineStepLatencyP99High"
        for alert in check.get("exp_alerts", [])
    }
    assert fired_kinds == {"prefill", "mixed", "decode"}


def test_committed_dashboard_is_current():
    assert DASHBOARD_JSON.read_text() == dashboard.render(), (
        "monitoring/grafana/dashboards/kimi-k3-rocm.json is stale: run "
        "python -m k3rocm.dashboard --output " + str(DASHBOARD_JSON.relative_to(REPO))
    )


def test_dashboard_panels_and_variables():
    board = json.loads(DASHBOARD_JSON.read_text())
    titles = {panel["title"] for panel in board["panels"]}
    assert {
        "Engine step latency by kind",
        "Engine steps per second by kind",
        "Scheduled tokens per second by step kind",
        "Time to first token",
        "Inter-token latency",
        "End-to-end request latency",
        "Running and waiting requests",
        "KV cache usage",
        "Build",
        "Smoke verdict (stall-free prefill path)",
    } <= titles
    variables = {var["name"]: var for var in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["instance"]["type"] == "query"
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], target["expr"]


def test_grafana_provisioning():
    provisioning = MONITORING / "grafana" / "provisioning"
    [source] = yaml.safe_load(
        (provisioning / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    assert source["type"] == "prometheus"
    [provider] = yaml.safe_load(
        (provisioning / "dashboards" / "kimi-k3-rocm.yml").read_text()
    )["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
