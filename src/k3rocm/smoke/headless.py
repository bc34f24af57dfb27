"""Stage 2 on a headless node (no API server here): vLLM runs and has joined
node 0 (see k3rocm.common.node for what that means and why it suffices)."""

from __future__ import annotations

import time

from k3rocm.common.node import Node, connected_to, vllm_group_alive
from k3rocm.common.smoke_report import CheckName, Stage
from k3rocm.common.states import Verdict
from k3rocm.smoke.settings import Settings

POLL_SECONDS = 2


def run_headless_stage2(stage: Stage, settings: Settings, node: Node) -> None:
    directory = settings.ready_mark.parent
    master = f"{node.master_addr}:{node.master_port}"
    deadline = time.monotonic() + settings.load_timeout
    while time.monotonic() < deadline:
        if vllm_group_alive(directory) and connected_to(
            str(node.master_addr), node.master_port
        ):
            stage.add(
                CheckName.JOINED,
                Verdict.PASS,
                f"headless node {node.rank}: vLLM runs and is connected to node 0 "
                f"at {master}; node 0's smoke test serves the completion",
            )
            return
        time.sleep(POLL_SECONDS)
    stage.add(
        CheckName.JOINED,
        Verdict.FAIL,
        f"headless node {node.rank}: vLLM did not run connected to node 0 at "
        f"{master} within {settings.load_timeout:.0f} s (K3_SMOKE_LOAD_TIMEOUT); "
        "check K3_MASTER_ADDR, that node 0 is up, and the network between them",
    )
