"""A node's place in a deployment (k3rocm.common.node): what the settings
describe, malformed settings left to the launcher, and the established
connection to node 0 seen in the kernel's socket table (real sockets)."""

from __future__ import annotations

import socket

import pytest
from support.node_sockets import NODE1, connection

from k3rocm.common.node import connected_to, headless_node, node_from_env


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
