"""Clients that try to hurt a serving API server (issue 39), each bounded in
count and time and aimed at a loopback port: bodies over the limit (declared
or chunked), a prompt nested deep, streams abandoned at random points, and
the resident memory of the server while they run."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

PIECE = 1 << 20  # bytes a chunked client sends at a time


def status_of(answer: bytes) -> int | None:
    """The status code of an HTTP/1.1 answer's first line."""
    parts = answer.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return None
    return int(parts[1])


def _read_answer(client: socket.socket) -> bytes:
    try:
        return client.recv(4096)
    except OSError:
        return b""


def _post_head(length: int | None) -> bytes:
    framing = (
        f"Content-Length: {length}"
        if length is not None
        else "Transfer-Encoding: chunked"
    )
    return (
        f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


def oversized_body(
    port: int, size: int, *, declared: bool, model: str, timeout: float = 60
) -> tuple[int | None, int]:
    """Send a completion whose body is ``size`` bytes (its length declared,
    or chunked), piece by piece until the server stops taking it; the
    answer's status and the bytes sent."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as client:
        client.sendall(_post_head(size if declared else None))
        start = f'{{"model": "{model}", "prompt": "'.encode()
        filler = start + b"a" * (PIECE - len(start))
        try:
            while sent < size:
                piece = filler[: min(PIECE, size - sent)]
                filler = b"a" * PIECE
                if declared:
                    client.sendall(piece)
                else:
                    client.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
        except OSError:
            pass  # the server answered and closed: what a limit does
        return status_of(_read_answer(client)), sent


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def peak_growth(pid: int, load: Callable[[], object]) -> tuple[object, int]:
    """Run ``load`` while sampling the process's resident memory; its result
    and the highest growth over the resident memory before it."""
    before = resident_bytes(pid)
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, resident_bytes(pid))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = load()
    finally:
        done.set()
        sampler.join()
    return result, peak - before


def deep_prompt(depth: int, model: str) -> bytes:
    """A completion whose prompt is a list nested ``depth`` deep."""
    return (
        f'{{"model": "{model}", "max_tokens": 1, "prompt": '.encode()
        + b"[" * depth
        + b"1"
        + b"]" * depth
        + b"}"
    )


def post_raw(port: int, body: bytes, timeout: float = 120) -> int | None:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as client:
        client.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        return status_of(_read_answer(client))


def abandoned_streams(port: int, count: int, model: str, seed: int) -> int:
    """``count`` streaming completions, each closed by its client after a
    random number of bytes of its answer (none at all for some); how many
    streams the server had begun to answer."""
    rng = random.Random(seed)
    cuts = [rng.choice([0, rng.randint(1, 2000)]) for _ in range(count)]
    body = json.dumps(
        {"model": model, "prompt": "hello", "max_tokens": 64, "stream": True}
    ).encode()
    begun = 0
    lock = threading.Lock()

    def client(cut: int) -> None:
        nonlocal begun
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            got = b""
            while len(got) < cut:
                data = sock.recv(cut - len(got))
                if not data:
                    break
                got += data
            if got.startswith(b"HTTP/1.1 200"):
                with lock:
                    begun += 1
            # closed here, mid-stream

    threads = [threading.Thread(target=client, args=(cut,)) for cut in cuts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return begun
