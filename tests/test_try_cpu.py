"""scripts/try-cpu, the one-command CPU try-out README offers, run as a
newcomer runs it: it builds, brings up the compose stack, answers a
completion and stops cleanly.

Stand-ins (docs/testing.md): the stand-in base is the one the script itself
builds; Prometheus and Alertmanager are images built here from Debian's
packages and given with --prometheus-image / --alertmanager-image, since
Docker Hub cannot be reached (on a machine that can, the script runs
compose.yaml's pinned images).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from docker_images import (
    ALERTMANAGER_IMAGE,
    PROMETHEUS_IMAGE,
    debian_image,
    docker,
    http,
)
from vllm_server import free_port
from vllm_trees import REPO

pytestmark = pytest.mark.docker
TRY_CPU = REPO / "scripts" / "try-cpu"
PROJECT = "k3rocmtesttry"


def try_cpu(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TRY_CPU), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_try_cpu_brings_up_the_stack_answers_and_stops(standin, image, tmp_path):
    prometheus = debian_image(
        standin, "prometheus", PROMETHEUS_IMAGE, tmp_path / "prometheus-image"
    )
    alertmanager = debian_image(
        standin, "prometheus-alertmanager", ALERTMANAGER_IMAGE, tmp_path / "am"
    )
    api, prometheus_port, alertmanager_port = free_port(), free_port(), free_port()
    where = ["--state-dir", str(tmp_path / "state"), "--project", PROJECT]
    try:
        up = try_cpu(
            *where,
            *("--api-port", str(api), "--prometheus-port", str(prometheus_port)),
            *("--alertmanager-port", str(alertmanager_port)),
            *("--prometheus-image", prometheus, "--alertmanager-image", alertmanager),
            timeout=3000,
        )
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-5000:]
        printed = up.stdout
        assert "completion of 'The stall-free prefill path': '" in printed, printed
        for url in (
            f"http://127.0.0.1:{api}/v1",
            f"http://127.0.0.1:{api}/metrics",
            f"http://127.0.0.1:{prometheus_port}",
            f"http://127.0.0.1:{alertmanager_port}",
        ):
            assert url in printed, (url, printed)
        # What it printed answers: the smoke verdict is a pass on /metrics, the
        # API completes a request of our own, the monitoring servers are up.
        _, metrics = http(f"http://127.0.0.1:{api}/metrics")
        assert "\nk3rocm_smoke_verdict 1.0" in metrics
        body = {"model": "kimi-k3", "prompt": "a b c", "max_tokens": 3}
        status, answer = http(f"http://127.0.0.1:{api}/v1/completions", body)
        assert status == 200 and json.loads(answer)["usage"]["completion_tokens"] == 3
        assert http(f"http://127.0.0.1:{prometheus_port}/-/ready")[0] == 200
        assert http(f"http://127.0.0.1:{alertmanager_port}/-/ready")[0] == 200
    finally:
        down = try_cpu(*where, "--down", timeout=600)
    assert down.returncode == 0, down.stderr[-3000:]
    left = docker(
        "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}"
    )
    assert left.stdout.strip() == ""
