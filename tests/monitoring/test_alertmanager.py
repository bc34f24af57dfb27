"""Alerts reach someone: monitoring/alertmanager.yml passes amtool and routes
every severity of Prometheus's rule files to a receiver; Prometheus sends to
the compose Alertmanager; and Debian's Prometheus and Alertmanager, run as
processes with the shipped routing, deliver firing rules to a local webhook."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from support.processes import running
from support.vllm_server import http_get
from support.workers import free_port

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "monitoring"
ALERTMANAGER_YML = MONITORING / "alertmanager.yml"
# Debian's name for the alertmanager binary.
ALERTMANAGER = "prometheus-alertmanager"
# What the shipped routing must choose for each severity of alerts.yml.
RECEIVER_OF_SEVERITY = {"critical": "critical-webhook", "warning": "warning-webhook"}
# The instance label of every test alert (inhibition compares it).
TEST_INSTANCE = "test-server:8000"


def amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["amtool", *args], capture_output=True, text=True)


def shipped_config() -> dict:
    return yaml.safe_load(ALERTMANAGER_YML.read_text())


def routed_receiver(config: Path, **labels: str) -> str:
    result = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={config}",
        *(f"{name}={value}" for name, value in labels.items()),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


# -- the files ------------------------------------------------------------------


def test_amtool_accepts_the_shipped_config():
    result = amtool("check-config", str(ALERTMANAGER_YML))
    assert result.returncode == 0, result.stdout + result.stderr


def test_amtool_rejects_a_broken_config(tmp_path):
    """The check above can fail: a route to a receiver nobody defined."""
    config = shipped_config()
    config["route"]["routes"][0]["receiver"] = "no-such-receiver"
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(yaml.safe_dump(config))
    result = amtool("check-config", str(broken))
    assert result.returncode != 0
    assert "no-such-receiver" in result.stdout + result.stderr


def test_every_severity_of_the_rules_routes_to_its_receiver():
    prometheus = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    severities = {
        rule["labels"]["severity"]
        for rule_file in prometheus["rule_files"]
        for group in yaml.safe_load((MONITORING / rule_file).read_text())["groups"]
        for rule in group["rules"]
    }
    assert severities == set(RECEIVER_OF_SEVERITY)
    for severity, receiver in RECEIVER_OF_SEVERITY.items():
        assert (
            routed_receiver(ALERTMANAGER_YML, alertname="Any", severity=severity)
            == receiver
        ), severity
    # A severity no route names is still delivered, not dropped.
    assert routed_receiver(ALERTMANAGER_YML, alertname="Any", severity="info") == (
        "warning-webhook"
    )


def test_shipped_webhooks_are_placeholders_an_operator_replaces():
    """Reserved .invalid hosts: an unedited file can deliver to no one."""
    receivers = shipped_config()["receivers"]
    assert {receiver["name"] for receiver in receivers} == set(
        RECEIVER_OF_SEVERITY.values()
    )
    for receiver in receivers:
        [hook] = receiver["webhook_configs"]
        host = urllib.parse.urlsplit(hook["url"]).hostname
        assert host.endswith(".invalid") and "replace" in host, hook["url"]
        assert hook["send_resolved"] is True


def test_prometheus_sends_alerts_to_the_compose_alertmanager():
    prometheus = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    [manager] = prometheus["alerting"]["alertmanagers"]
    assert manager["static_configs"] == [{"targets": ["alertmanager:9093"]}]
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    service = compose["services"]["alertmanager"]
    assert any(port.endswith(":9093") for port in service["ports"])
    [config_flag] = [arg for arg in service["command"] if "--config.file=" in arg]
    mounted = config_flag.split("=", 1)[1]
    [volume] = [volume for volume in service["volumes"] if f":{mounted}:" in volume]
    assert "./monitoring/alertmanager.yml" in volume


# -- the whole path, live -------------------------------------------------------


class Webhook:
    """An HTTP server that records every JSON body POSTed to it, by path."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict]] = []
        lock = threading.Lock()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass  # pytest shows the assertions; request lines are noise

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def alerts(self, path: str) -> list[tuple[dict, dict]]:
        """(payload, alert) for every alert delivered to `path`."""
        return [
            (payload, alert)
            for got, payload in list(self.received)
            if got == path
            for alert in payload["alerts"]
        ]


@dataclass
class AlertPath:
    webhook: Webhook
    alertmanager_url: str
    logs: list[Path] = field(default_factory=list)

    def wait_for(self, predicate: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 30
        while not predicate():
            if time.monotonic() > deadline:
                tails = "\n".join(
                    f"--- {log.name}\n{log.read_text()[-3000:]}" for log in self.logs
                )
                raise AssertionError(f"timed out waiting for {what}\n{tails}")
            time.sleep(0.2)

    def alertmanager_ready(self) -> bool:
        try:
            http_get(f"{self.alertmanager_url}/-/ready")
        except OSError:
            return False
        return True

    def delivered(self, path: str, alertname: str) -> list[tuple[dict, dict]]:
        return [
            (payload, alert)
            for payload, alert in self.webhook.alerts(path)
            if alert["labels"]["alertname"] == alertname
        ]


SECONDS_PER_UNIT = {"s": 1, "m": 60, "h": 3600}


def scaled(duration: str, factor: float) -> str:
    """An Alertmanager duration of one unit ("30s", "5m") times `factor`."""
    seconds = float(duration[:-1]) * SECONDS_PER_UNIT[duration[-1]] * factor
    return f"{round(seconds * 1000)}ms"


def alerting_test_config(webhook_url: str) -> dict:
    """The shipped config with each receiver's URL pointing at the webhook
    (path = receiver name) and group timings ten times shorter; the routes,
    inhibit rules and the ratios of the timings are the shipped ones. (The
    warning's longer group_wait is what lets a critical alert arriving a
    moment later still inhibit it.)"""
    config = shipped_config()
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            hook["url"] = f"{webhook_url}/{receiver['name']}"

    def faster(route: dict) -> None:
        for timing in ("group_wait", "group_interval"):
            if timing in route:
                route[timing] = scaled(route[timing], 0.1)
        for child in route.get("routes", []):
            faster(child)

    faster(config["route"])
    return config


# Firing from the first evaluation after Prometheus has found the
# Alertmanager (it scrapes itself): an alert Prometheus could not send at
# once reaches Alertmanager older than group_wait and is flushed before the
# inhibitor has seen its critical twin.
ALWAYS_ONCE_ALERTMANAGER_KNOWN = (
    "vector(1) and on() (prometheus_notifications_alertmanagers_discovered > 0)"
)


def always_firing(alertname: str, severity: str) -> dict:
    return {
        "alert": alertname,
        "expr": ALWAYS_ONCE_ALERTMANAGER_KNOWN,
        "for": "0s",
        "labels": {"severity": severity, "instance": TEST_INSTANCE},
        "annotations": {"summary": f"{alertname} ({severity}) fires in a test"},
    }


TEST_RULES = {
    "groups": [
        {
            "name": "alertmanager-test",
            "interval": "1s",
            "rules": [
                always_firing("TestCriticalAlert", "critical"),
                always_firing("TestWarningAlert", "warning"),
                # One alert at both severities: the critical one inhibits the
                # warning one.
                always_firing("TestBothSeverities", "critical"),
                always_firing("TestBothSeverities", "warning"),
            ],
        }
    ]
}


@pytest.fixture(scope="module")
def alert_path(tmp_path_factory) -> Iterator[AlertPath]:
    """Debian's Prometheus evaluating TEST_RULES every second and sending to
    Debian's Alertmanager, which uses the shipped routing to the webhook."""
    workdir = tmp_path_factory.mktemp("alerting")
    webhook = Webhook()
    webhook.thread.start()

    alertmanager_port = free_port()
    alertmanager_yml = workdir / "alertmanager.yml"
    alertmanager_yml.write_text(yaml.safe_dump(alerting_test_config(webhook.url)))

    rules = workdir / "rules.yml"
    rules.write_text(yaml.safe_dump(TEST_RULES))
    prometheus_yml = workdir / "prometheus.yml"
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(rules)]
    # The shipped alerting block, aimed at the local Alertmanager.
    [manager] = config["alerting"]["alertmanagers"]
    manager["static_configs"] = [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]
    prometheus_port = free_port()
    config["scrape_configs"] = [
        {
            "job_name": "prometheus",
            "scrape_interval": "1s",
            "static_configs": [{"targets": [f"127.0.0.1:{prometheus_port}"]}],
        }
    ]
    prometheus_yml.write_text(yaml.safe_dump(config))

    path = AlertPath(webhook, f"http://127.0.0.1:{alertmanager_port}")
    path.logs = [workdir / "alertmanager.log", workdir / "prometheus.log"]
    alertmanager = [
        ALERTMANAGER,
        f"--config.file={alertmanager_yml}",
        f"--storage.path={workdir / 'alertmanager-data'}",
        f"--web.listen-address=127.0.0.1:{alertmanager_port}",
        "--cluster.listen-address=",  # no gossip port to collide with
    ]
    prometheus = [
        "prometheus",
        f"--config.file={prometheus_yml}",
        f"--storage.tsdb.path={workdir / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{prometheus_port}",
        # Alerts evaluated before Prometheus has found the Alertmanager (its
        # discovery takes ~5 s) are otherwise only re-sent a minute later.
        "--rules.alert.resend-delay=1s",
    ]
    try:
        with running(alertmanager, path.logs[0]), running(prometheus, path.logs[1]):
            path.wait_for(path.alertmanager_ready, "Alertmanager to be ready")
            yield path
    finally:
        webhook.server.shutdown()
        webhook.server.server_close()


@pytest.mark.parametrize(
    "severity, other", [("critical", "warning"), ("warning", "critical")]
)
def test_an_alert_reaches_the_receiver_of_its_severity(alert_path, severity, other):
    name = f"Test{severity.capitalize()}Alert"
    alert_path.wait_for(
        lambda: alert_path.delivered(f"/{severity}-webhook", name),
        f"{name} at the {severity} webhook",
    )
    payload, alert = alert_path.delivered(f"/{severity}-webhook", name)[0]
    assert payload["receiver"] == f"{severity}-webhook"
    assert payload["status"] == alert["status"] == "firing"
    assert alert["labels"] == {
        "alertname": name,
        "severity": severity,
        "instance": TEST_INSTANCE,
    }
    assert alert["annotations"]["summary"] == f"{name} ({severity}) fires in a test"
    assert payload["groupLabels"] == {"alertname": name, "instance": TEST_INSTANCE}
    assert not alert_path.delivered(f"/{other}-webhook", name)


def test_critical_inhibits_the_warning_of_the_same_alert_and_instance(alert_path):
    def both_severities() -> dict[str, dict]:
        query = urllib.parse.quote('alertname="TestBothSeverities"')
        alerts = json.loads(
            http_get(f"{alert_path.alertmanager_url}/api/v2/alerts?filter={query}")
        )
        return {alert["labels"]["severity"]: alert for alert in alerts}

    alert_path.wait_for(
        lambda: set(both_severities()) == {"critical", "warning"},
        "both TestBothSeverities alerts in Alertmanager",
    )
    alert_path.wait_for(
        lambda: alert_path.delivered("/critical-webhook", "TestBothSeverities"),
        "the critical TestBothSeverities at the critical webhook",
    )
    warning = both_severities()["warning"]
    assert warning["status"]["state"] == "suppressed"
    assert warning["status"]["inhibitedBy"] == [
        both_severities()["critical"]["fingerprint"]
    ]
    # By now the warning receiver has had TestWarningAlert, so it would have
    # had an uninhibited TestBothSeverities warning too.
    alert_path.wait_for(
        lambda: alert_path.delivered("/warning-webhook", "TestWarningAlert"),
        "TestWarningAlert at the warning webhook",
    )
    assert not alert_path.delivered("/warning-webhook", "TestBothSeverities")
