"""What the container must be able to write (and, for compile caches, run
code from), checked before anything starts.

Under ``docker run --read-only`` (compose ``read_only: true``) only mounts
are writable, and Docker's ``--tmpfs`` mounts are ``noexec`` unless told
otherwise. A compile cache there lets vLLM start and pass a greedy check,
then fails on the first compiled kernel it loads (torch inductor's sampler:
"failed to map segment"); the run directory or /tmp missing fails the smoke
test with a message about something else. So each place is tried here, and
what is not writable, or not executable where it must be, is named in one
line with the setting that moves it; where a permission was refused (a cache
volume or tmpfs owned by root, say, while the container runs as uid 1000),
the line names the directory in the way, its owner and mode.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from k3rocm.common.setting_table import FORENSICS_DIR, RUN_DIR


@dataclass(frozen=True)
class Place:
    what: str
    env: str
    default: str | None  # None: only checked when the variable is set
    runs_code: bool  # compiled objects are loaded (mmap PROT_EXEC) from it


def places(environ: Mapping[str, str]) -> tuple[Place, ...]:
    home = environ.get("HOME", "/home/k3")
    # Not tempfile.gettempdir(): it raises when no candidate is writable.
    tmp = environ.get("TMPDIR", "").strip() or "/tmp"
    return (
        Place("the run directory", RUN_DIR.env, str(RUN_DIR.default), False),
        Place("temporary files", "TMPDIR", tmp, False),
        Place(
            "Triton's kernel cache", "TRITON_CACHE_DIR", f"{home}/.triton/cache", True
        ),
        Place(
            "torch inductor's cache (the compiled sampler)",
            "TORCHINDUCTOR_CACHE_DIR",
            f"{tmp}/torchinductor_{environ.get('USER', 'k3')}",
            True,
        ),
        Place("numba's cache", "NUMBA_CACHE_DIR", None, False),
        Place("AITER's JIT builds", "AITER_JIT_DIR", None, True),
        Place("vLLM's compile cache", "VLLM_CACHE_ROOT", f"{home}/.cache/vllm", True),
        Place("Hugging Face's cache", "HF_HOME", f"{home}/.cache/huggingface", False),
        Place(
            "stall stack dumps", FORENSICS_DIR.env, str(FORENSICS_DIR.default), False
        ),
    )


def problem(place: Place, path: Path) -> str | None:
    """Why path cannot serve as place, or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".k3rocm-write-probe-"):
            pass
        noexec = place.runs_code and bool(os.statvfs(path).f_flag & os.ST_NOEXEC)
    except OSError as err:
        return (
            f"{place.what} at {path} ({place.env}) is not writable "
            f"({err.strerror or err}); {_remedy(err, path)}, or set {place.env} "
            "to a writable place"
        )
    if noexec:
        return (
            f"{place.what} at {path} ({place.env}) is on a file system mounted "
            "noexec, so nothing compiled there can be loaded; mount it without "
            f"noexec (a volume, or tmpfs with exec), or set {place.env} elsewhere"
        )
    return None


def _remedy(err: OSError, path: Path) -> str:
    """What to do about the error: a permission refused is about the owner
    or mode of the directory in the way, not about a missing mount."""
    if err.errno == errno.EROFS:
        return "with a read-only root file system mount a volume or tmpfs there"
    if err.errno not in (errno.EACCES, errno.EPERM):
        return "make it a directory this process can write to"
    blocker, found = _in_the_way(path)
    uid, gid, mode = os.geteuid(), os.getegid(), stat.S_IMODE(found.st_mode)
    if found.st_uid != uid:
        return (
            f"{blocker} is owned by uid {found.st_uid} (mode {mode:04o}) and this "
            f"process runs as uid {uid}; chown it to uid {uid} (a tmpfs: mount it "
            f"with uid={uid},gid={gid}, or mode=1777)"
        )
    return (
        f"{blocker} is owned by this process's uid {uid} but its mode "
        f"{mode:04o} does not let it write there; chmod u+rwx it"
    )


def _in_the_way(path: Path) -> tuple[Path, os.stat_result]:
    """The deepest directory on the way to path that exists and can be
    looked at (the one whose permissions stopped the write), and its stat."""
    while True:
        try:
            return path, path.stat()
        except OSError:
            # Absent, or its parent cannot be searched: the parent is in the way.
            if path == path.parent:
                raise
            path = path.parent


def problems(environ: Mapping[str, str]) -> list[str]:
    found = []
    for place in places(environ):
        value = environ.get(place.env, "").strip() or place.default
        if value:
            why = problem(place, Path(value).expanduser())
            if why is not None:
                found.append(why)
    return found
