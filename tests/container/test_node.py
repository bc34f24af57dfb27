"""A node's place in a deployment (k3rocm.common.node), the headless health check,
and the guard's rule that a node of a multi-node job never restarts alone.
Connections and processes are real: sockets opened here, a process group
started here."""

from __future__ import annotations

import contextlib
import socket
import subprocess

import pytest

from k3rocm.common.exit_codes import ExitCode
from k3rocm.common.node import connected_to, headless_node, node_from_env
from k3rocm.common.run_files import DRAIN_MARK, READY_MARK, VLLM_GROUP_FILE
from k3rocm.container.guard import LOST_NODE0_SECONDS, Guard
from k3rocm.container.health import check_headless

NODE1 = {"K3_PROFILE": "tep16", "K3_NODE_RANK": "1", "K3_MASTER_ADDR": "127.0.0.1"}


@contextlib.contextmanager
def connection(host: str, family: int = socket.AF_INET):
    """A listening socket and an established connection to it; the port."""
    with socket.socket(family) as server:
        server.bind((host, 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection((host, port)) as client:
            accepted, _ = server.accept()
            with accepted:
                yield port
            client.close()


@pytest.mark.parametrize(
    "env, multi_node, headless",
    [
        ({}, False, False),
        ({"K3_PROFILE": "cpu-dev"}, False, False),
        ({**NODE1, "K3_NODE_RANK": "0"}, True, False),
        (NODE1, True, True),
        ({**NODE1, "K3_PROFILE": "cpu-dev-2node"}, True, True),
    ],
)
def test_the_node_the_settings_describe(env, multi_node, headless):
    node = node_from_env(env)
    assert (node.multi_node, node.headless) == (multi_node, headless)
    assert (headless_node(env) is not None) == headless


@pytest.mark.parametrize(
    "env",
    [
        {"K3_PROFILE": "tep16-ray"},
        {**NODE1, "K3_NODE_RANK": "one"},
        {**NODE1, "K3_MASTER_PORT": "9" * 5000},
    ],
)
def test_malformed_settings_are_left_to_the_launcher(env):
    with pytest.raises(ValueError):
        node_from_env(env)
    assert headless_node(env) is None


@pytest.mark.parametrize(
    "host, family", [("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)]
)
def test_connected_to_sees_an_established_connection(host, family):
    with connection(host, family) as port:
        assert connected_to(host, port)
        assert not connected_to(host, port + 1 if port < 65535 else port - 1)
        assert not connected_to("node0.invalid", port)
    assert not connected_to(host, port)


@pytest.fixture
def vllm_group(tmp_path):
    """A process group standing where vLLM's would, its id in the run dir."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (tmp_path / VLLM_GROUP_FILE).write_text(f"{process.pid}\n")
    yield process
    process.kill()
    process.wait()


def test_a_headless_node_is_healthy_while_its_vllm_runs_connected(tmp_path, vllm_group):
    healthy, message = check_headless(
        tmp_path, node_from_env({**NODE1, "K3_MASTER_PORT": "1"})
    )
    assert not healthy and "no smoke ready mark" in message
    (tmp_path / READY_MARK).write_text("pass\n")
    with connection("127.0.0.1") as port:
        node = node_from_env({**NODE1, "K3_MASTER_PORT": str(port)})
        healthy, message = check_headless(tmp_path, node)
        assert healthy, message
        assert f"headless node 1, vLLM connected to node 0 at 127.0.0.1:{port}" in (
            message
        )
        vllm_group.kill()
        vllm_group.wait()
        assert check_headless(tmp_path, node) == (
            False,
            "headless node: vLLM is not running",
        )
    healthy, message = check_headless(tmp_path, node)
    assert not healthy


def test_a_headless_node_without_node_0_is_not_healthy(tmp_path, vllm_group):
    (tmp_path / READY_MARK).write_text("pass\n")
    with connection("127.0.0.1") as port:
        pass
    node = node_from_env({**NODE1, "K3_MASTER_PORT": str(port)})
    healthy, message = check_headless(tmp_path, node)
    assert not healthy
    assert message == (
        f"headless node: vLLM is not connected to node 0 at 127.0.0.1:{port}"
    )


def test_a_multi_node_death_stops_the_container_at_once(tmp_path):
    exited = "PROCESS_STATE_EXITED"
    single = Guard(3, tmp_path / "single-deaths", node_from_env({}))
    assert single.judge(exited, "vllm", expected=False) is None
    multi = Guard(3, tmp_path / "multi-deaths", node_from_env(NODE1))
    code, reason = multi.judge(exited, "vllm", expected=True)
    assert code == ExitCode.VLLM
    assert reason.startswith("vLLM exited on node 1 of a multi-node deployment (tep16)")
    # A failed start is supervisord's to retry, on every layout.
    assert multi.judge(exited, "vllm", False, from_state="STARTING") is None


def test_a_headless_node_that_lost_node_0_stops(tmp_path):
    """vLLM on a headless node waits for a dead node 0 forever (seen in
    tests/deploy/test_multinode_docker.py before this rule); the guard's tick
    ends it."""
    with connection("127.0.0.1") as port:
        node = node_from_env({**NODE1, "K3_MASTER_PORT": str(port)})
        guard = Guard(3, tmp_path / "vllm-deaths", node)
        assert guard.tick(0.0) is None  # not joined yet: no ready mark
        (tmp_path / READY_MARK).write_text("pass\n")
        assert guard.tick(1.0) is None  # joined and connected
    assert guard.tick(2.0) is None  # gone, but not for long
    assert guard.tick(2.0 + LOST_NODE0_SECONDS - 1) is None
    code, reason = guard.tick(2.0 + LOST_NODE0_SECONDS)
    assert code == ExitCode.VLLM
    assert reason.startswith(
        f"headless node 1 lost its connection to node 0 at 127.0.0.1:{port}"
    )
    # A stop under way closes the connection itself: no verdict then.
    (tmp_path / DRAIN_MARK).write_text("{}")
    assert guard.tick(100.0) is None
    # Node 0 and single nodes have nobody to lose.
    for env in ({**NODE1, "K3_NODE_RANK": "0"}, {}):
        assert Guard(3, tmp_path / "d", node_from_env(env)).tick(1e6) is None
