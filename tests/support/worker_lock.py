"""One lock per shared thing the test workers make (./scripts/test runs two
pytest-xdist workers): the first to need it makes it, the other waits and
finds it made. A worker may take a lock it already holds (a build inside a
build); a lock is released when its outermost holder leaves."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import IO

LOCKS = Path(__file__).resolve().parents[2] / ".cache" / "locks"
_held: dict[str, tuple[IO[str], int]] = {}


@contextlib.contextmanager
def worker_lock(name: str) -> Iterator[None]:
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
