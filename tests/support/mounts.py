"""Real tmpfs mounts for the tests that need a file system with a property
(read-only, noexec, full); mounting needs root, which the suite runs as."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def mounted(path: Path, options: str, size: str = "1m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"{options},size={size}", "tmpfs", str(path)],
        check=True,
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@contextlib.contextmanager
def full(path: Path) -> Iterator[Path]:
    """A tiny tmpfs with every block taken: creating files and directories
    still works, writing a byte fails with ENOSPC, as on a full volume."""
    with mounted(path, "mode=0755", size="64k") as mount:
        # Unbuffered: a write that failed leaves nothing to flush at close.
        with (mount / "filler").open("wb", buffering=0) as filler:
            with contextlib.suppress(OSError):
                while True:
                    filler.write(b"\0" * 4096)
        yield mount
