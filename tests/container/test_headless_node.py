"""The headless node's health check and the guard's rule that a node of a
multi-node job never restarts alone (a node's place itself:
tests/common/test_node.py). Connections and processes are real: sockets
opened here, a process group started here."""

from __future__ import annotations

import subprocess

import pytest
from support.node_sockets import NODE1, connection

from k3rocm.common.exit_codes import ExitCode
from k3rocm.common.node import node_from_env
from k3rocm.common.run_files import DRAIN_MARK, READY_MARK, VLLM_GROUP_FILE
from k3rocm.container.guard import LOST_NODE0_SECONDS, Guard
from k3rocm.container.health import check_headless


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
