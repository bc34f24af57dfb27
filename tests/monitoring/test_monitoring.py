"""The monitoring files on their own: promtool checks and unit tests, the
generated dashboard is current, Grafana provisioning points at it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as grafana
from support.without_vllm import WITHOUT_VLLM

from k3rocm.monitoring import alerts, dashboard
from k3rocm.monitoring import names as monitoring

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "monitoring"
DASHBOARD_JSON = MONITORING / "grafana" / "dashboards" / "kimi-k3-rocm.json"
# Rule files and their promtool tests, with the alerts each defines.
RULE_FILES = {
    "alerts.yml": "alerts.test.yml",
    "container-alerts.yml": "container-alerts.test.yml",
}
CONTAINER_ALERTS = (
    "KimiK3ServerDown",
    "KimiK3ContainerDown",
    "KimiK3LoadSlow",
    "KimiK3EngineStalled",
)
ALERTS = (
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


def alert_rules(rule_file: str = "alerts.yml") -> list[dict]:
    [group] = yaml.safe_load((MONITORING / rule_file).read_text())["groups"]
    return group["rules"]


def test_promtool_check_config():
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    assert config["rule_files"] == list(RULE_FILES)


@pytest.mark.parametrize("rule_file", RULE_FILES)
def test_promtool_check_rules(rule_file):
    result = promtool("check", "rules", rule_file)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", RULE_FILES.values())
def test_promtool_unit_tests_pass(test_file):
    result = promtool("test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("rule_file", "names"),
    [("alerts.yml", ALERTS), ("container-alerts.yml", CONTAINER_ALERTS)],
)
def test_every_alert_has_summary_and_runbook(rule_file, names):
    rules = alert_rules(rule_file)
    assert sorted({rule["alert"] for rule in rules}) == sorted(names)
    for rule in rules:
        assert rule["annotations"]["summary"] and rule["annotations"]["runbook"]
        assert rule["labels"]["severity"] in ("warning", "critical")


@pytest.mark.parametrize(
    ("test_file", "names"),
    [("alerts.test.yml", ALERTS), ("container-alerts.test.yml", CONTAINER_ALERTS)],
)
def test_promtool_tests_cover_every_alert_firing_and_quiet(test_file, names):
    tests = yaml.safe_load((MONITORING / test_file).read_text())["tests"]
    checks = [check for test in tests for check in test["alert_rule_test"]]
    for alert in names:
        mine = [check for check in checks if check["alertname"] == alert]
        assert any(check.get("exp_alerts") for check in mine), f"{alert} never fires"
        assert any(not check.get("exp_alerts") for check in mine), (
            f"{alert} is never checked quiet"
        )
    if test_file != "alerts.test.yml":
        return
    fired_kinds = {
        alert["exp_labels"].get("kind")
        for check in checks
        if check["alertname"] == "EngineStepLatencyP99High"
        for alert in check.get("exp_alerts", [])
    }
    assert fired_kinds == {"prefill", "mixed", "decode"}


@pytest.mark.parametrize("rule_file", alerts.RULE_FILES)
def test_committed_alert_rules_are_current(rule_file):
    assert (MONITORING / rule_file).read_text() == alerts.render(rule_file), (
        f"monitoring/{rule_file} is stale: run python -m k3rocm.monitoring.alerts "
        "--output-dir monitoring"
    )


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("k3rocm.monitoring.alerts", ["--output-dir", "{tmp}"]),
        ("k3rocm.monitoring.dashboard", ["--output", "{tmp}/dashboard.json"]),
    ],
)
def test_the_generators_run_without_vllm(module, args, tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_VLLM, module]
        + [arg.format(tmp=tmp_path) for arg in args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    if module.endswith("alerts"):
        for name in alerts.RULE_FILES:
            assert (tmp_path / name).read_text() == alerts.render(name)
    else:
        assert (tmp_path / "dashboard.json").read_text() == dashboard.render()
    # The blocker works: vLLM itself cannot be imported under it.
    blocked = subprocess.run(
        [sys.executable, "-c", WITHOUT_VLLM, "vllm"], capture_output=True, text=True
    )
    assert "No module named 'vllm'" in blocked.stderr


def test_scrape_jobs_are_the_ones_alerts_and_dashboard_use():
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    jobs = tuple(job["job_name"] for job in config["scrape_configs"])
    assert jobs == monitoring.JOBS


def test_the_container_job_shares_the_vllm_instance():
    """The joins in container-alerts.yml and the dashboard's instance filter
    need both jobs' series under one instance."""
    jobs = {
        job["job_name"]: job["static_configs"][0]
        for job in yaml.safe_load((MONITORING / "prometheus.yml").read_text())[
            "scrape_configs"
        ]
    }
    assert jobs["kimi-k3-vllm"]["targets"] == ["kimi-k3:8000"]
    assert jobs["kimi-k3-container"]["targets"] == ["kimi-k3:8001"]
    assert jobs["kimi-k3-container"]["labels"]["instance"] == "kimi-k3:8000"


def test_committed_dashboard_is_current():
    assert DASHBOARD_JSON.read_text() == dashboard.render(), (
        "monitoring/grafana/dashboards/kimi-k3-rocm.json is stale: run "
        "python -m k3rocm.monitoring.dashboard --output "
        + str(DASHBOARD_JSON.relative_to(REPO))
    )


def test_the_dashboard_is_what_grafanas_typed_model_reads_back():
    """No Grafana server runs here: the closest check of the JSON's shape is
    Grafana's dashboard model (generated from its schema) reading it back
    and writing the same JSON; a key it does not know is dropped."""
    board = json.loads(DASHBOARD_JSON.read_text())
    model = grafana.Dashboard.from_json(board)
    assert json.loads(JSONEncoder().encode(model)) == board
    misspelled = dict(board, refesh="30s")
    assert json.loads(
        JSONEncoder().encode(grafana.Dashboard.from_json(misspelled))
    ) != (misspelled)


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
        "Start-up phase",
        "Time in phase",
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
