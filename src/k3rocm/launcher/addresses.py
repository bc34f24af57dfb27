"""Checks of a multi-node node's addresses that this node can make itself:
addresses that do not resolve or that the other nodes cannot reach, a
worker pointing at itself as node 0, and interfaces that do not exist."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from pathlib import Path

from k3rocm.common.node import master_addresses
from k3rocm.launcher.messages import label, shown
from k3rocm.launcher.settings import LaunchSettings

# Variables that pick this node's address or interface for vLLM, RCCL/NCCL
# and Gloo (set by compose.multinode.yaml from the node's .env).
HOST_IP_ENV = "VLLM_HOST_IP"
IFNAME_ENVS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
NET_CLASS = Path("/sys/class/net")


def check_node_addresses(
    settings: LaunchSettings, environ: Mapping[str, str], problems: list[str]
) -> None:
    master = settings.master_addr
    if master is not None:
        _check_master(master, settings.node_rank or 0, problems)
    host_ip = environ.get(HOST_IP_ENV, "").strip()
    if host_ip:
        _check_host_ip(host_ip, problems)
    for name in IFNAME_ENVS:
        value = environ.get(name, "").strip()
        if value:
            _check_interfaces(name, value, problems)


def _unreachable_from_elsewhere(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or ip.is_unspecified


def is_local_address(address: str) -> bool:
    """Whether this host owns address (it can bind a socket to it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


def _check_master(master: str, rank: int, problems: list[str]) -> None:
    addresses = [str(address) for address in master_addresses(master)]
    if not addresses:
        problems.append(
            f"{label('master_addr')} is {shown(master)}, which does not resolve to "
            "an address on this node; set it to node 0's address on the cluster "
            "network (the same value on every node)."
        )
        return
    if any(_unreachable_from_elsewhere(address) for address in addresses):
        problems.append(
            f"{label('master_addr')} is {shown(master)}, a loopback or wildcard "
            "address that the other nodes cannot reach; set it to node 0's "
            "address on the cluster network."
        )
        return
    # Node 0 is not held to owning the address: behind NAT or a load
    # balancer it may not, and a dry run elsewhere must still work.
    if rank > 0 and any(is_local_address(address) for address in addresses):
        problems.append(
            f"{label('master_addr')} is {shown(master)}, an address of this node, "
            f"but this is node {rank}, not node 0; set it to node 0's address, "
            "or fix the node rank."
        )


def _check_host_ip(host_ip: str, problems: list[str]) -> None:
    try:
        unreachable = _unreachable_from_elsewhere(host_ip)
    except ValueError:
        problems.append(
            f"{HOST_IP_ENV} is {shown(host_ip)}, which is not an IP address; set "
            "it to this node's address on the cluster network."
        )
        return
    if unreachable:
        problems.append(
            f"{HOST_IP_ENV} is {shown(host_ip)}, a loopback or wildcard address "
            "that the other nodes cannot reach; set it to this node's address on "
            "the cluster network."
        )
    elif not is_local_address(host_ip):
        problems.append(
            f"{HOST_IP_ENV} is {shown(host_ip)}, which is not an address of this "
            "node (vLLM announces it to the other nodes); set it to one of this "
            "node's addresses on the cluster network."
        )


def _check_interfaces(name: str, value: str, problems: list[str]) -> None:
    """NCCL/Gloo syntax: comma-separated prefixes, `=NAME` exact, `^...` to
    exclude; each interface asked for must exist here."""
    try:
        present = sorted(path.name for path in NET_CLASS.iterdir())
    except OSError:
        return
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("^"):
            continue
        exact = entry.startswith("=")
        wanted = entry.lstrip("=")
        if not any(
            interface == wanted if exact else interface.startswith(wanted)
            for interface in present
        ):
            problems.append(
                f"{name} is {shown(value)}, but this node has no interface "
                f"{'named' if exact else 'starting with'} {shown(wanted)} (it has "
                f"{', '.join(present)}); set it to the cluster network's interface."
            )
