"""The container's health check and the address every in-container client
uses (k3rocm.common.api_address.api_base_url), against a real HTTP server on this
machine standing in for vLLM's /health."""

from __future__ import annotations

import subprocess
import sys

import pytest

from k3rocm.common.api_address import BadAddress, api_base_url
from k3rocm.container import health
from k3rocm.container.drain import write_drain_mark


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("", "http://127.0.0.1:8000"),
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("::", "http://127.0.0.1:8000"),
        ("127.0.0.2", "http://127.0.0.2:8000"),
        ("10.1.2.3", "http://10.1.2.3:8000"),
        ("::1", "http://[::1]:8000"),
    ],
)
def test_clients_call_the_address_vllm_listens_on(host, expected):
    assert api_base_url({"K3_HOST": host}) == expected


@pytest.mark.parametrize("port", ["abc", "0", "65536", "8" * 5000, "-1"])
def test_a_bad_port_is_a_clear_error(port):
    with pytest.raises(BadAddress, match="K3_PORT"):
        api_base_url({"K3_PORT": port})


def run_health(run_dir, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "k3rocm.container.health"],
        env={"K3_RUN_DIR": str(run_dir), "PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_health_calls_a_specific_listen_address(tmp_path, vllm_health):
    (tmp_path / "ready").write_text("pass\n")
    result = run_health(tmp_path, K3_HOST="127.0.0.2", K3_PORT=str(vllm_health))
    assert result.returncode == 0, result.stdout
    assert f"http://127.0.0.2:{vllm_health}/health 200" in result.stdout
    # The same server is not on loopback's 127.0.0.1.
    wrong = run_health(tmp_path, K3_PORT=str(vllm_health))
    assert wrong.returncode == 1


def test_health_with_a_malformed_port_says_so_without_a_traceback(tmp_path):
    (tmp_path / "ready").write_text("pass\n")
    result = run_health(tmp_path, K3_PORT="abc")
    assert result.returncode == 1
    assert "K3_PORT is 'abc'" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_a_binary_ready_mark_does_not_break_the_check(tmp_path, vllm_health):
    (tmp_path / "ready").write_bytes(b"\xff\xfe\x00pass")
    healthy, message = health.check(tmp_path, f"http://127.0.0.2:{vllm_health}")
    assert healthy and "smoke" in message


def test_draining_is_not_ready(tmp_path, vllm_health):
    (tmp_path / "ready").write_text("pass\n")
    write_drain_mark(tmp_path, deadline=0)
    healthy, message = health.check(tmp_path, f"http://127.0.0.2:{vllm_health}")
    assert not healthy and "draining" in message
