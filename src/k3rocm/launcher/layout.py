"""The node settings against the profile's layout: which settings the
profile uses, and whether the node count, rank and master address fit."""

from __future__ import annotations

from collections.abc import Set

from k3rocm.common.profiles import MULTI_NODE_PROFILES, MultiNode, Profile
from k3rocm.launcher.messages import label

# The node settings each kind of layout reads; given to another, they would
# be silently ignored, so they are refused.
USED_NODE_SETTINGS = {
    MultiNode.NONE: frozenset(),
    MultiNode.NATIVE: frozenset(
        {"num_nodes", "node_rank", "master_addr", "master_port"}
    ),
}


def check_layout(
    profile: Profile,
    given: Set[str],
    num_nodes: int | None,
    node_rank: int | None,
    master_addr: str | None,
    problems: list[str],
) -> int:
    """The number of nodes; appends a message per problem to problems."""
    _refuse_unused(profile, given, num_nodes, node_rank, problems)
    nodes = num_nodes or profile.default_num_nodes
    if profile.multi_node is MultiNode.NONE:
        return 1
    if nodes < 2 or profile.world_size % nodes:
        problems.append(
            f"{label('num_nodes')} is {nodes}, but profile {profile.name} spreads "
            f"{profile.world_size} GPUs over 2 or more nodes with the same number "
            f"on each; set it to a divisor of {profile.world_size} above 1, "
            f"normally {profile.default_num_nodes}."
        )
        return nodes
    if node_rank is None:
        if "node_rank" not in given:
            problems.append(
                f"{label('node_rank')} is not set, but profile {profile.name} runs "
                f"the same command on {nodes} nodes; set it to 0 on the node that "
                f"serves the API and 1 to {nodes - 1} on the others."
            )
    elif node_rank >= nodes:
        problems.append(
            f"{label('node_rank')} is {node_rank}, but there are only {nodes} nodes "
            f"({label('num_nodes')}); set it to 0 to {nodes - 1}."
        )
    if master_addr is None and "master_addr" not in given:
        problems.append(
            f"{label('master_addr')} is not set, but profile {profile.name} needs "
            "the address of node 0 on every node; set it to an address of node 0 "
            "that all nodes can reach (the same value everywhere)."
        )
    return nodes


def _refuse_unused(
    profile: Profile,
    given: Set[str],
    num_nodes: int | None,
    node_rank: int | None,
    problems: list[str],
) -> None:
    unused = sorted(given - USED_NODE_SETTINGS[profile.multi_node])
    for name in unused:
        if name == "num_nodes":
            shown_nodes = num_nodes if num_nodes is not None else "set"
            problems.append(
                f"{label('num_nodes')} is {shown_nodes}, but profile "
                f"{profile.name} runs on one node; unset it, or pick a "
                f"multi-node profile ({', '.join(MULTI_NODE_PROFILES)})."
            )
        else:
            problems.append(
                f"{label(name)} is set, but profile {profile.name} does not use it "
                "(it runs on one node); unset it, or pick a profile that does "
                f"({', '.join(MULTI_NODE_PROFILES)})."
            )
