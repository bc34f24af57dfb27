"""Clients that send a POST's headers and never the body they announce
(issue 31: such connections once held every stop to its grace)."""

from __future__ import annotations

import socket


def headers_only(port: int, host: str = "127.0.0.1") -> socket.socket:
    """A connection that has sent a POST's headers, announcing a body it
    never sends."""
    client = socket.create_connection((host, port), timeout=30)
    client.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    return client


def answer_of(client: socket.socket) -> bytes:
    """What the server sent back before closing (or the error reading it)."""
    with client:
        try:
            return client.recv(200)
        except OSError as err:
            return repr(err).encode()
