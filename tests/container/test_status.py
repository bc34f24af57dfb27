"""The container's start-up metrics endpoint (k3rocm.container.status), run as the
real program on a free port and scraped over HTTP, through every phase."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.vllm_trees import REPO
from support.workers import free_port

from k3rocm.container.drain import write_drain_mark

MONITORING = REPO / "monitoring"


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


def phase(samples) -> str:
    current = [
        dict(labels)["phase"]
        for labels, value in samples["k3rocm_container_phase"].items()
        if value == 1
    ]
    assert len(current) == 1, samples["k3rocm_container_phase"]
    return current[0]


@pytest.fixture
def status(tmp_path, vllm_health):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "k3rocm.container.status"],
        env={
            "K3_RUN_DIR": str(tmp_path),
            "K3_SMOKE_REPORT": str(tmp_path / "smoke-report.json"),
            # As compose.multinode.yaml binds it: one address, not all.
            "K3_STATUS_HOST": "127.0.0.1",
            "K3_STATUS_PORT": str(port),
            "K3_HOST": "127.0.0.2",
            "K3_PORT": str(free_port()),  # nothing answers there yet
            "K3_LOAD_ALERT_SECONDS": "7200",
            "PATH": "/usr/bin:/bin",
        },
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            scrape(port)
            break
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    yield port
    process.terminate()
    process.wait(10)


def test_every_phase_from_stage1_to_draining(status, tmp_path):
    samples = scrape(status)
    assert phase(samples) == "stage1"
    assert samples["k3rocm_smoke_stage1_verdict"][()] == -1
    assert samples["k3rocm_container_load_alert_seconds"][()] == 7200
    time.sleep(1.1)
    assert scrape(status)["k3rocm_container_phase_seconds"][(("phase", "stage1"),)] > 1

    (tmp_path / "stage1-done").write_text("pass\n")
    samples = scrape(status)
    assert phase(samples) == "loading"
    assert samples["k3rocm_smoke_stage1_verdict"][()] == 1
    assert samples["k3rocm_container_phase_seconds"][(("phase", "loading"),)] < 1

    (tmp_path / "ready").write_text("pass\n")
    assert phase(scrape(status)) == "serving"
    write_drain_mark(tmp_path, time.time() + 60)
    assert phase(scrape(status)) == "draining"


def test_phase_seconds_count_from_the_phase_start_through_a_restart(tmp_path):
    """The first scrape of a phase that began minutes ago reads minutes (the
    issue saw 6.8e-07 s after five minutes of serving): marked phases from
    their mark's time, stage1 from when the server first saw it, kept over a
    restart of the status server."""
    import os

    from k3rocm.container.status import PhaseClock

    clock = PhaseClock(tmp_path)
    started = clock.began("stage1")
    assert abs(started - time.time()) < 5
    assert PhaseClock(tmp_path).began("stage1") == started  # a restart
    ready = tmp_path / "ready"
    ready.write_text("pass\n")
    five_minutes_ago = time.time() - 300
    os.utime(ready, (five_minutes_ago, five_minutes_ago))
    assert PhaseClock(tmp_path).began("serving") == pytest.approx(five_minutes_ago)
    (tmp_path / "phase-since.json").write_text("[not, json")
    assert abs(PhaseClock(tmp_path).began("stage2") - time.time()) < 5


def test_the_served_phase_seconds_read_from_the_ready_mark(status, tmp_path):
    import os

    (tmp_path / "stage1-done").write_text("pass\n")
    (tmp_path / "ready").write_text("pass\n")
    then = time.time() - 300
    os.utime(tmp_path / "ready", (then, then))
    seconds = scrape(status)["k3rocm_container_phase_seconds"]
    assert seconds[(("phase", "serving"),)] == pytest.approx(300, abs=10)


def test_stage2_is_when_vllm_answers(tmp_path, vllm_health):
    from k3rocm.container.status import current_phase

    (tmp_path / "stage1-done").write_text("fail\n")
    assert current_phase(tmp_path, f"http://127.0.0.2:{vllm_health}") == "stage2"
    assert current_phase(tmp_path, f"http://127.0.0.2:{free_port()}") == "loading"


def test_stage1_failed_under_stop_reads_from_the_report(status, tmp_path):
    report = {"verdict": "fail", "stages": {"stage1": {"status": "fail"}}}
    (tmp_path / "smoke-report.json").write_text(json.dumps(report))
    (tmp_path / "exit-reason.json").write_text('{"exit_code": 4, "reason": "x"}')
    samples = scrape(status)
    assert samples["k3rocm_smoke_stage1_verdict"][()] == 0
    assert phase(samples) == "stopping"


@pytest.mark.parametrize("report", [b"[]", b'{"stages": []}', b"\xff", b"[" * 10**5])
def test_a_malformed_report_is_no_stage1_verdict(status, tmp_path, report):
    (tmp_path / "smoke-report.json").write_bytes(report)
    assert scrape(status)["k3rocm_smoke_stage1_verdict"][()] == -1


def test_it_listens_on_its_address_only_and_answers_only_metrics(status):
    """Bound to 127.0.0.1: another loopback address of this machine
    (127.0.0.2, which a server on 0.0.0.0 would answer) refuses; any path
    but /metrics is 404."""
    with pytest.raises(OSError) as refused:
        urllib.request.urlopen(f"http://127.0.0.2:{status}/metrics", timeout=5)
    assert isinstance(refused.value, urllib.error.URLError), refused.value
    assert "refused" in str(refused.value.reason).lower(), refused.value
    for path in ("/", "/metricsx", "/metrics/x", "/health", "/v1/completions"):
        with pytest.raises(urllib.error.HTTPError) as answered:
            urllib.request.urlopen(f"http://127.0.0.1:{status}{path}", timeout=5)
        assert answered.value.code == 404, path
    assert "k3rocm_container_phase" in scrape(status)


@pytest.mark.parametrize("host", ["192.0.2.1", "no-such-host.invalid"])
def test_an_address_it_cannot_listen_on_is_one_line_and_exit_2(host):
    result = subprocess.run(
        [sys.executable, "-m", "k3rocm.container.status"],
        env={
            "K3_STATUS_HOST": host,
            "K3_STATUS_PORT": str(free_port()),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"k3rocm.container.status: cannot listen on {host}:"), line
    assert "set K3_STATUS_HOST to an address of this node" in line


@pytest.mark.parametrize("name", ["K3_STATUS_PORT", "K3_LOAD_ALERT_SECONDS"])
def test_a_bad_setting_is_refused_in_one_line(name):
    result = subprocess.run(
        [sys.executable, "-m", "k3rocm.container.status"],
        env={name: "abc", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"k3rocm.container.status: {name} is 'abc'")


def test_every_container_metric_the_rules_and_dashboard_use_is_served(status):
    from k3rocm.monitoring import dashboard

    used = set(
        re.findall(
            r"\bk3rocm_(?:container_[a-z_]+|smoke_stage1_[a-z_]+)",
            (MONITORING / "container-alerts.yml").read_text() + dashboard.render(),
        )
    )
    assert {"k3rocm_container_phase", "k3rocm_container_phase_seconds"} <= used
    assert used <= set(scrape(status))
