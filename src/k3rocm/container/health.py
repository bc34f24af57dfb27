"""The container's health check: healthy only when vLLM answers ``/health``,
the smoke test has written its ready mark, no drain for a stop is under way
and the stall watchdog has not found the engine stalled (k3rocm.container.watchdog).
A headless node (no API server) is healthy when its ready mark is there and
vLLM on it still runs connected to node 0 (k3rocm.common.node).

    python -m k3rocm.container.health     exit 0 healthy, 1 not (one line says why)
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from k3rocm.common.api_address import BadAddress, api_base_url
from k3rocm.common.engine_progress import read_stall_mark
from k3rocm.common.node import Node, connected_to, headless_node, vllm_group_alive
from k3rocm.common.run_files import DRAIN_MARK, READY_MARK, run_dir
from k3rocm.common.smoke_report import read_mark


def check(directory: Path, base_url: str) -> tuple[bool, str]:
    not_ready = _not_ready(directory)
    if not_ready:
        return False, not_ready
    url = f"{base_url}/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status = response.status
    except (OSError, urllib.error.URLError) as err:
        return False, f"vLLM {url} does not answer: {err}"
    if status != 200:
        return False, f"vLLM {url} answered {status}"
    return True, f"healthy: {url} 200, smoke {_verdict(directory)}"


def check_headless(directory: Path, node: Node) -> tuple[bool, str]:
    not_ready = _not_ready(directory)
    if not_ready:
        return False, not_ready
    if not vllm_group_alive(directory):
        return False, "headless node: vLLM is not running"
    master = f"{node.master_addr}:{node.master_port}"
    if not connected_to(str(node.master_addr), node.master_port):
        return False, f"headless node: vLLM is not connected to node 0 at {master}"
    return True, (
        f"healthy: headless node {node.rank}, vLLM connected to node 0 at {master}, "
        f"smoke {_verdict(directory)}"
    )


def _not_ready(directory: Path) -> str | None:
    stalled = read_stall_mark(directory)
    if stalled is not None:
        return stalled
    if (directory / DRAIN_MARK).exists():
        return "not ready: draining for a stop, new requests are refused"
    ready = directory / READY_MARK
    if not ready.is_file():
        return f"not ready: no smoke ready mark at {ready} yet"
    return None


def _verdict(directory: Path) -> str:
    return read_mark(directory / READY_MARK)


def main() -> int:
    node = headless_node(os.environ)
    try:
        if node is not None:
            healthy, message = check_headless(run_dir(), node)
        else:
            healthy, message = check(run_dir(), api_base_url(os.environ))
    except BadAddress as err:
        healthy, message = False, f"unhealthy: {err}"
    print(message)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
