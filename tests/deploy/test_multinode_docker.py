"""Two containers of the image as the two nodes of a vLLM native multi-node
deployment, each with its own address on a user-defined network.

Stand-ins (docs/launching.md, "Proven here"): the stand-in base's vLLM CPU build and
profile cpu-dev-2node (tensor parallel 2, one CPU rank per node, Gloo)
instead of ROCm GPUs, RCCL and tep16/dep16 (8 GPUs per node); a Docker
bridge network instead of host networking on a cluster network.
"""

from __future__ import annotations

import contextlib
import re

import pytest
from support.docker_images import (
    Container,
    Load,
    docker,
    http,
    run_container,
    signal_process,
    vllm_processes,
)

from k3rocm.container.guard import LOST_NODE0_SECONDS

pytestmark = pytest.mark.docker
NETWORK = "k3rocm-test-nodes"
NODE0 = "k3rocm-test-node0"
NODE1 = "k3rocm-test-node1"
STALL_SECONDS = 20


def _node(image, model, name: str, rank: int, env: dict[str, str]) -> Container:
    return run_container(
        image,
        model,
        name,
        env={
            "K3_PROFILE": "cpu-dev-2node",
            "K3_NODE_RANK": str(rank),
            # Node 0's name on the network: every node meets it there.
            "K3_MASTER_ADDR": NODE0,
            # One core each for the two CPU ranks of this 2-core machine.
            "VLLM_CPU_OMP_THREADS_BIND": str(rank),
            # As compose.multinode.yaml binds them on the host network: the
            # start-up metrics on the node's own address, node 0's API on
            # the address its clients use (here its name on the network).
            "K3_STATUS_HOST": name,
            **({"K3_HOST": NODE0} if rank == 0 else {}),
            **env,
        },
        # SYS_PTRACE: the stall watchdog's stack capture (compose grants it).
        extra=("--network", NETWORK, "--hostname", name, "--cap-add", "SYS_PTRACE"),
    )


@contextlib.contextmanager
def two_nodes(image, model, env: dict[str, str] | None = None):
    """Node 0 and node 1, both healthy."""
    # What an interrupted run left: containers first, then their network.
    docker("rm", "-f", "-v", NODE0, NODE1, check=False)
    docker("network", "rm", NETWORK, check=False)
    docker("network", "create", NETWORK)
    started: list[Container] = []
    try:
        started.append(_node(image, model, NODE0, 0, env or {}))
        started.append(_node(image, model, NODE1, 1, env or {}))
        for node in started:
            node.wait_healthy(600)
        yield started
    finally:
        for node in started:
            node.remove()
        docker("network", "rm", NETWORK, check=False)


@pytest.fixture(scope="module")
def nodes(image, model):
    with two_nodes(image, model) as started:
        yield started


def test_two_nodes_serve_a_completion_through_node_0(nodes):
    node0, node1 = nodes
    status, body = http(
        f"{node0.base_url}/v1/completions",
        {"model": "kimi-k3", "prompt": "a b c d", "max_tokens": 8},
    )
    assert status == 200, body
    assert '"completion_tokens":8' in body.replace(" ", "")
    # Tensor parallel 2 over the two nodes: rank 1 runs on node 1.
    assert "world_size=2 rank=0" in node0.logs()
    assert re.search(r"rank 1 in world size 2 is assigned as .*TP rank 1", node1.logs())
    # Node 1 has no API server: its health is its own (k3rocm.common.node).
    health = node1.exec("python3", "-m", "k3rocm.container.health")
    assert health.returncode == 0, health.stdout + health.stderr
    assert f"headless node 1, vLLM connected to node 0 at {NODE0}:29501" in (
        health.stdout
    )
    no_api = "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health')"
    assert node1.exec("python3", "-c", no_api).returncode != 0
    report = node1.read("/run/k3rocm/smoke-report.json")
    assert '"joined"' in report and '"verdict": "pass"' in report


def listening(node: Container) -> dict[int, set[str]]:
    """port -> the IPv4 addresses a socket listens on, from the kernel's
    table (/proc/net/tcp: hex little-endian address, state 0A = LISTEN)."""
    found: dict[int, set[str]] = {}
    for line in node.read("/proc/net/tcp").splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state != "0A":
            continue
        address, port = local.split(":")
        octets = [str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)]
        found.setdefault(int(port, 16), set()).add(".".join(octets))
    return found


def address_of(node: Container, name: str) -> str:
    """``name`` resolved as the node resolves it."""
    code = f"import socket; print(socket.gethostbyname({name!r}))"
    return node.exec("python3", "-c", code).stdout.strip()


def test_each_node_listens_on_its_own_address_only(nodes):
    """The start-up metrics on each node's address, node 0's API on the
    address it was given: no port on every interface (0.0.0.0)."""
    node0, node1 = nodes
    for node in nodes:
        assert listening(node)[8001] == {address_of(node, node.name)}
    assert listening(node0)[8000] == {address_of(node0, NODE0)}
    # The status port shows its metrics and nothing else.
    assert http(f"http://127.0.0.1:{node1.status_port}/")[0] == 404


def stop_reasons(node: Container) -> list[str]:
    return [
        line for line in node.logs().splitlines() if "stopping the container:" in line
    ]


def test_stopping_node_1_stops_node_0_with_one_reason(nodes):
    """Last user of `nodes`: it stops both."""
    node0, node1 = nodes
    docker("stop", node1.name, timeout=180)
    assert node1.state()["ExitCode"] == 0
    # Node 0 finds out at its next step: that request fails, never hangs.
    status, _ = http(
        f"{node0.base_url}/v1/completions",
        {"model": "kimi-k3", "prompt": "a b", "max_tokens": 4},
        timeout=120,
    )
    assert status >= 500
    assert node0.wait_exit(180) == 3
    reasons = stop_reasons(node0)
    assert len(reasons) == 1, reasons
    assert (
        "vLLM exited on node 0 of a multi-node deployment (cpu-dev-2node)"
        in (reasons[0])
    )


def test_a_worker_stopped_on_node_1_stalls_node_0_and_both_exit_with_reasons(
    image, model
):
    """SIGSTOP to the vLLM worker on node 1 during requests: node 0's engine
    waits for it in a collective, so node 0's watchdog finds the stall, dumps
    its own stacks and exits 5. vLLM on node 1 would then wait for a dead
    node 0 forever; its guard dumps node 1's stacks (the stopped worker's
    among them) and stops the container once node 0 has been gone for 15 s."""
    with two_nodes(image, model, {"K3_STALL_SECONDS": str(STALL_SECONDS)}) as (
        node0,
        node1,
    ):
        [worker] = [
            pid
            for name, pid in vllm_processes(node1.name).items()
            if name.startswith("VLLM::Worker")
        ]
        load = Load(node0.base_url, 2)
        signal_process(node1.name, worker, "STOP")
        assert load.in_flight() > 0, "no stream under way at the stop"
        assert node0.wait_exit(STALL_SECONDS + 120) == 5
        reasons = stop_reasons(node0)
        assert len(reasons) == 1 and "the engine stalled" in reasons[0], reasons
        assert "(engine core) =====" in node0.logs()
        assert node1.wait_exit(LOST_NODE0_SECONDS + 120) == 3
        reasons = stop_reasons(node1)
        assert len(reasons) == 1, reasons
        assert (
            f"headless node 1 lost its connection to node 0 at {NODE0}:29501 "
            f"for {LOST_NODE0_SECONDS} s" in reasons[0]
        )
        dumped = node1.logs()
        assert f"===== k3rocm stacks pid {worker} VLLM::Worker" in dumped
        assert f"===== end of k3rocm stacks pid {worker} =====" in dumped
