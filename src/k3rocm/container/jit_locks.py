"""Stale JIT build locks, swept before vLLM starts.

The compile caches live on the persistent ``k3-cache`` volume. Some of the
libraries that build into them lock a build by the mere existence of a file
(created with O_CREAT|O_EXCL, removed when the build ends); waiters spin
until it is gone. A process killed mid-build leaves that file for ever, and
the next start waits on it without end. Which ones do so (from their
sources):

- AITER (``aiter/jit/core.py``, ``aiter/jit/utils/file_baton.py``): a copy
  of torch's FileBaton at ``$AITER_JIT_DIR/build/lock_<module>`` and
  ``.../build/<module>/build/lock``; the holder keeps the file open while it
  builds. Newer AITER also holds a ``flock`` on it. Its tuning-table merge
  lock is ``/tmp/aiter_configs/<name>.csv.lock`` (in the container's own
  /tmp, which survives a restart of the same container).
- torch's C++ extension builds (``torch.utils.file_baton``): ``lock`` in
  each build directory under ``$TORCH_EXTENSIONS_DIR``; held open too.
- MoRI (``mori/jit/core.py``): ``.<kernel>.hsaco.lock`` beside each kernel
  under ``$MORI_JIT_CACHE_DIR`` (``~/.mori/jit``); it closes the file at
  once, so no open file tells of a live build.

Triton writes through temporary names and ``os.replace`` (no lock files);
vLLM, torch inductor and Hugging Face lock with ``flock`` (``filelock``),
which the kernel releases when the holder dies: their files never block and
are left alone.

A lock counts as held, and is left alone (and reported), when a process
anywhere on the host has it open or holds a ``flock`` on it: the kernel
answers both across containers that share the volume (a write lease is
refused while another open file exists). A lock the kernel cannot answer for
(MoRI's, or a file system without leases) is held while younger than
``UNPROVABLE_GRACE_SECONDS``, longer than any build of one kernel.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

UNPROVABLE_GRACE_SECONDS = 30 * 60


@dataclass(frozen=True)
class LockKind:
    library: str
    root_env: tuple[str, ...]  # the first one set names the root
    default_root: str  # relative to $HOME unless absolute
    patterns: tuple[str, ...]  # globs under the root
    holder_keeps_open: bool


KINDS = (
    LockKind(
        "AITER",
        ("AITER_JIT_DIR", "JIT_WORKSPACE_DIR"),
        ".aiter/jit",
        ("build/lock_*", "build/*/build/lock"),
        holder_keeps_open=True,
    ),
    LockKind("AITER tuning", (), "/tmp/aiter_configs", ("*.lock",), True),
    LockKind(
        "torch extensions",
        ("TORCH_EXTENSIONS_DIR",),
        ".cache/torch_extensions",
        ("*/lock", "*/*/lock"),
        holder_keeps_open=True,
    ),
    LockKind(
        "MoRI",
        ("MORI_JIT_CACHE_DIR",),
        ".mori/jit",
        ("**/.*.lock",),
        holder_keeps_open=False,
    ),
)


def lock_root(kind: LockKind, environ: Mapping[str, str]) -> Path:
    for name in kind.root_env:
        if environ.get(name, "").strip():
            return Path(environ[name].strip())
    root = Path(kind.default_root)
    return root if root.is_absolute() else Path(environ.get("HOME", "~")) / root


def candidate_locks(environ: Mapping[str, str]) -> Iterator[tuple[LockKind, Path]]:
    seen: set[Path] = set()
    for kind in KINDS:
        root = lock_root(kind, environ).expanduser()
        if not root.is_dir():
            continue
        for pattern in kind.patterns:
            for path in sorted(root.glob(pattern)):
                if path.is_file() and not path.is_symlink() and path not in seen:
                    seen.add(path)
                    yield kind, path


def holder(path: Path, kind: LockKind, now: float) -> str | None:
    """Why the lock counts as held, or None when no live process holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        return f"cannot open it ({err.strerror})"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return "a live process holds its flock"
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        provable = kind.holder_keeps_open
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        except OSError as err:
            if err.errno == errno.EAGAIN:
                return "a live process has it open"
            provable = False  # no lease here: the kernel cannot tell
        if provable:
            return None
        age = now - os.fstat(fd).st_mtime
        if age < UNPROVABLE_GRACE_SECONDS:
            return (
                f"{age:.0f} s old, and {kind.library} leaves no trace of a live "
                f"build: younger than {UNPROVABLE_GRACE_SECONDS} s counts as one"
            )
        return None
    finally:
        os.close(fd)


def sweep(environ: Mapping[str, str], log: Callable[[str], None]) -> list[Path]:
    """Remove every lock no live process holds, a line each; report held
    ones. The removed paths."""
    removed = []
    now = time.time()
    for kind, path in candidate_locks(environ):
        try:
            inode = path.stat().st_ino
        except FileNotFoundError:
            continue
        why = holder(path, kind, now)
        if why is not None:
            log(f"left {kind.library} JIT lock {path} alone: {why}")
            continue
        try:
            if path.stat().st_ino != inode:
                continue  # released and taken again meanwhile: a live build
            path.unlink()
        except FileNotFoundError:
            continue  # its build ended meanwhile
        except OSError as err:
            log(f"could not remove stale {kind.library} JIT lock {path}: {err}")
            continue
        log(f"removed stale {kind.library} JIT lock {path} (its holder is gone)")
        removed.append(path)
    return removed
