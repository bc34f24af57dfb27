"""A multi-node job's settings for node 1 and a real established TCP
connection, for the tests of a node's place (tests/common/test_node.py) and
of the headless node's health and guard (tests/container/test_headless_node.py)."""

from __future__ import annotations

import contextlib
import socket

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
