"""What the test workers (./scripts/test runs two, pytest-xdist, --dist
loadfile) need to share a machine: the order the files start in, the files
one worker runs together, a lock per thing both may make, and ports of
each worker's own."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from xdist.scheduler import LoadFileScheduling

LOCKS = Path(__file__).resolve().parents[2] / ".cache" / "locks"
_held: dict[str, tuple[IO[str], int]] = {}
# Ports a worker hands out: a range of its own below the kernel's ephemeral
# ports (32768 up by default), which bind(0) hands to any process, the other
# worker's too, between a test finding one free and its server binding it.
PORTS_PER_WORKER = 2000
FIRST_PORT = 20000
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def worker_ports(worker: int = WORKER) -> range:
    start = FIRST_PORT + PORTS_PER_WORKER * worker
    return range(start, start + PORTS_PER_WORKER)


def start_order(items) -> dict:
    """Sort keys for the collected tests: slow files first, the many quick
    ones last to even out the end: the first container file (it builds the
    images) while the other worker runs the vLLM server files, then the
    other container files, then the rest. Within a file, the order it was
    written in."""
    kinds: dict = {}
    first_docker_file = None
    for item in items:
        kind = 3
        if item.get_closest_marker("docker"):
            first_docker_file = first_docker_file or item.path
            kind = 0 if item.path == first_docker_file else 2
        elif item.get_closest_marker("server"):
            kind = 1
        kinds[item.path] = min(kind, kinds.get(item.path, 3))
    return {item: (kinds[item.path], index) for index, item in enumerate(items)}


# Files whose costly session fixture is made once if one worker runs them
# all: the image scripts/build-image --push builds and pushes to the
# worker's own registry (about 2.5 minutes a worker).
RUN_TOGETHER = {
    "tests/deploy/test_compose_live.py": "the pushed image",
    "tests/supply_chain/test_registry_docker.py": "the pushed image",
}


def together(scope: str) -> str:
    """The unit a worker is given a file in (loadfile's scope, the file's
    path): the file, or the label of the files it runs together with."""
    return RUN_TOGETHER.get(scope, scope)


class TogetherScheduling(LoadFileScheduling):
    """--dist loadfile, with the files of RUN_TOGETHER on one worker."""

    def _split_scope(self, nodeid: str) -> str:
        return together(super()._split_scope(nodeid))


@contextlib.contextmanager
def worker_lock(name: str) -> Iterator[None]:
    """The first worker to need a shared thing makes it, the other waits and
    finds it made. A worker may take a lock it already holds (a build inside
    a build); it is released when its outermost holder leaves."""
    if name in _held:
        handle, depth = _held[name]
        _held[name] = (handle, depth + 1)
    else:
        LOCKS.mkdir(parents=True, exist_ok=True)
        handle = open(LOCKS / f"{name}.lock", "w")
        fcntl.flock(handle, fcntl.LOCK_EX)
        _held[name] = (handle, 1)
    try:
        yield
    finally:
        handle, depth = _held[name]
        if depth == 1:
            del _held[name]
            handle.close()  # releases the flock
        else:
            _held[name] = (handle, depth - 1)


_PORTS = iter(worker_ports())


def free_port() -> int:
    """A loopback port nothing listens on that no other test is given."""
    for port in _PORTS:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"this worker used all its {PORTS_PER_WORKER} ports")
