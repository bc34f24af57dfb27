"""One run at a time on a vLLM tree: an exclusive flock on
``<target>/.k3rocm-patch.lock``.

flock is released by the kernel when the holder exits, however it exits, so
a lock is never stale and the lock file itself is left in place (removing it
would let two runs lock two different files).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

LOCK_NAME = ".k3rocm-patch.lock"


class Refusal(Exception):
    """The tree is not one the series may touch, or cannot be written."""


class TreeLock:
    """Exclusive flock on the tree's lock file, waited for up to ``timeout``.

    A run that may not write the tree (``status`` as an unprivileged user)
    locks an existing lock file read-only, or goes without when there is
    none: then no locking run has ever written the tree."""

    def __init__(
        self,
        target: Path,
        timeout: float,
        must_write: bool,
        on_wait: Callable[[Path], None] | None = None,
    ) -> None:
        self.path = target / LOCK_NAME
        self.timeout, self.must_write, self.on_wait = timeout, must_write, on_wait
        self.fd: int | None = None

    def __enter__(self) -> TreeLock:
        self.fd = self._open()
        if self.fd is None:
            return self
        deadline = time.monotonic() + self.timeout
        waited = False
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                pass
            if not waited and self.on_wait is not None:
                self.on_wait(self.path)
            waited = True
            if time.monotonic() >= deadline:
                os.close(self.fd)
                raise Refusal(
                    f"another patch tool run has held {self.path} for more than "
                    f"{self.timeout:g} s; nothing was changed. Wait for it to "
                    "finish and run again (the lock is released when that "
                    "process exits, so it is never stale), or pass a longer "
                    "--lock-timeout."
                )
            time.sleep(0.05)

    def _open(self) -> int | None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            if self.must_write:
                raise Refusal(
                    f"cannot write to {self.path.parent} ({err}); nothing was "
                    "changed. Run as a user that may write the vLLM install."
                ) from None
            try:
                return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        try:  # readable by every user whatever the umask; may fail if not ours
            os.fchmod(fd, 0o644)
        except OSError:
            pass
        return fd

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None
