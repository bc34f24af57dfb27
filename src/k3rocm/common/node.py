"""This container's place in a deployment, and what a headless node can check
about itself.

A node of a native multi-node profile with rank > 0 runs ``vllm serve
--headless``: no API server, so neither ``/health`` nor a completion can
show that it works. What it can show without one:

- smoke stage 1 passed on it (its own GPUs, kernel and patched tree);
- its vLLM process group is alive (``vllm.pgid`` in the run directory);
- vLLM on it is connected to node 0: a TCP connection to the master address
  and port is established (torch.distributed's store on node 0, which every
  rank keeps open while the job lives).

Node 0 serves the API only once every rank has loaded and joined, so node
0's readiness (a real completion, smoke stage 2) covers the deployment.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from k3rocm.common.profiles import PROFILES, MultiNode
from k3rocm.common.run_files import VLLM_GROUP_FILE
from k3rocm.common.setting_table import MASTER_ADDR, MASTER_PORT, NODE_RANK, PROFILE

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# /proc/net/tcp's state code of an established connection.
_ESTABLISHED = "01"
_PROC_NET_TCP = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


@dataclass(frozen=True)
class Node:
    profile: str
    multi_node: bool
    rank: int
    master_addr: str | None
    master_port: int

    @property
    def headless(self) -> bool:
        return self.multi_node and self.rank > 0


def node_from_env(environ: Mapping[str, str]) -> Node:
    """The node the settings describe; ValueError for settings the launcher
    refuses anyway (it says why, in full)."""
    name = PROFILE.read(environ)
    multi_node = PROFILES[name].multi_node is MultiNode.NATIVE
    rank = NODE_RANK.read(environ) or 0
    port = MASTER_PORT.read(environ)
    return Node(name, multi_node, rank, MASTER_ADDR.read(environ), port)


def headless_node(environ: Mapping[str, str]) -> Node | None:
    """This node when it runs headless; None when it serves the API, or when
    the settings are malformed (the launcher refuses them, saying why)."""
    try:
        node = node_from_env(environ)
    except ValueError:
        return None
    return node if node.headless else None


def vllm_group_alive(directory: Path) -> bool:
    """Whether the process group vLLM was started in still has its leader."""
    try:
        group = int((directory / VLLM_GROUP_FILE).read_text().strip())
    except (OSError, ValueError):
        return False
    return group_leader_alive(group)


def group_leader_alive(group: int) -> bool:
    """Whether a process group's leader (vLLM's API server: supervisord
    starts it as one, the launcher execs into vLLM) still runs."""
    try:
        os.kill(group, 0)
    except OSError:
        return False
    return True


def master_addresses(master_addr: str) -> set[IPAddress]:
    """Every address master_addr resolves to (none when it does not)."""
    try:
        infos = socket.getaddrinfo(master_addr, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return set()
    return {
        _unmapped(ipaddress.ip_address(str(info[4][0]).split("%")[0])) for info in infos
    }


def connected_to(
    master_addr: str, master_port: int, tables: Iterable[Path] = _PROC_NET_TCP
) -> bool:
    """Whether a TCP connection to master_addr:master_port is established in
    this network namespace (with host networking: on this host)."""
    wanted = master_addresses(master_addr)
    return any(
        port == master_port and address in wanted
        for address, port in _established_remotes(tables)
    )


def _established_remotes(tables: Iterable[Path]) -> Iterator[tuple[IPAddress, int]]:
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _ESTABLISHED:
                continue
            address, _, port = fields[2].partition(":")
            yield _proc_address(address), int(port, 16)


def _proc_address(hex_text: str) -> IPAddress:
    """/proc/net/tcp{,6} write addresses as 32-bit words in host byte order."""
    raw = bytes.fromhex(hex_text)
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
    packed = b"".join(words) if sys.byteorder == "little" else raw
    return _unmapped(ipaddress.ip_address(packed))


def _unmapped(address: IPAddress) -> IPAddress:
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address
