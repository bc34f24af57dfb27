"""The start-up sweep of stale JIT locks (k3rocm.container.jit_locks), on lock files
made the way each library makes them, by real processes: a holder killed
mid-build (removed) and a live holder in another process sharing the
directory (kept)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3rocm.container import jit_locks

# torch's FileBaton, which AITER's JIT and torch's extension builds use: the
# file is created with O_EXCL and held open until the build ends.
TORCH_BATON = """
import sys, time
from torch.utils.file_baton import FileBaton
assert FileBaton(sys.argv[1]).try_acquire()
print("held", flush=True)
time.sleep(600)
"""
# Newer AITER: the baton's file carries the holder and a flock for the build.
AITER_FLOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL | os.O_RDWR)
os.write(fd, f"{os.getpid()}\\nhost\\n".encode())
fcntl.flock(fd, fcntl.LOCK_EX)
os.close(os.dup(fd))
print("held", flush=True)
time.sleep(600)
"""
# MoRI: O_EXCL and closed at once; the build runs with the file closed.
MORI = """
import os, sys, time
os.close(os.open(sys.argv[1], os.O_CREAT | os.O_EXCL))
print("held", flush=True)
time.sleep(600)
"""


class Holder:
    def __init__(self, program: str, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, "-c", program, str(path)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout.readline().strip() == "held"
        self.path = path

    def kill(self) -> None:
        """As a container stop kills a build: the file stays."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        assert self.path.exists()


@pytest.fixture
def holders():
    made: list[Holder] = []

    def make(program: str, path: Path) -> Holder:
        made.append(Holder(program, path))
        return made[-1]

    yield make
    for holder in made:
        holder.process.kill()
        holder.process.wait()


def environ(tmp_path: Path) -> dict[str, str]:
    return {
        "HOME": str(tmp_path / "home"),
        "AITER_JIT_DIR": str(tmp_path / "cache" / "aiter"),
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "cache" / "torch_extensions"),
        "MORI_JIT_CACHE_DIR": str(tmp_path / "cache" / "mori"),
    }


def sweep(tmp_path: Path) -> tuple[list[Path], list[str]]:
    lines: list[str] = []
    return jit_locks.sweep(environ(tmp_path), lines.append), lines


AITER_BUILD = "cache/aiter/build/lock_module_moe_asm"
AITER_NESTED = "cache/aiter/build/module_moe_asm/build/lock"
TORCH_BUILD = "cache/torch_extensions/py312_cpu/fused_op/lock"


@pytest.mark.parametrize("relative", [AITER_BUILD, AITER_NESTED, TORCH_BUILD])
def test_a_baton_of_a_killed_build_is_removed(tmp_path, holders, relative):
    holder = holders(TORCH_BATON, tmp_path / relative)
    holder.kill()
    removed, lines = sweep(tmp_path)
    assert removed == [holder.path]
    assert not holder.path.exists()
    assert lines == [f"removed stale {_library(relative)} JIT lock {holder.path} "
                     "(its holder is gone)"]  # fmt: skip


@pytest.mark.parametrize("relative", [AITER_BUILD, AITER_NESTED, TORCH_BUILD])
def test_a_baton_held_by_a_live_process_is_kept_and_reported(
    tmp_path, holders, relative
):
    holder = holders(TORCH_BATON, tmp_path / relative)
    removed, lines = sweep(tmp_path)
    assert removed == [] and holder.path.exists()
    assert lines == [f"left {_library(relative)} JIT lock {holder.path} alone: "
                     "a live process has it open"]  # fmt: skip


def test_newer_aiter_flock_locks_live_kept_dead_removed(tmp_path, holders):
    live = holders(AITER_FLOCK, tmp_path / "cache/aiter/build/lock_live")
    dead = holders(AITER_FLOCK, tmp_path / "cache/aiter/build/lock_dead")
    dead.kill()
    removed, lines = sweep(tmp_path)
    assert removed == [dead.path] and live.path.exists()
    assert any("a live process" in line and str(live.path) in line for line in lines)


def test_mori_locks_are_kept_while_young_and_removed_when_old(tmp_path, holders):
    """MoRI closes its lock file at once: no open file tells of a live
    build, so only age can."""
    young = holders(MORI, tmp_path / "cache/mori/gfx950/abc/.moe.hsaco.lock")
    old = holders(MORI, tmp_path / "cache/mori/gfx950/def/.dispatch.hsaco.lock")
    young.kill()
    old.kill()
    past = time.time() - jit_locks.UNPROVABLE_GRACE_SECONDS - 5
    os.utime(old.path, (past, past))
    removed, lines = sweep(tmp_path)
    assert removed == [old.path] and young.path.exists()
    assert any("MoRI leaves no trace of a live build" in line for line in lines)


def test_flock_locks_of_other_libraries_are_not_touched(tmp_path):
    """vLLM's and Hugging Face's filelock files never block: not swept."""
    hub = tmp_path / "home/.cache/huggingface/hub/.locks/models--x/abc.lock"
    hub.parent.mkdir(parents=True)
    hub.write_text("")
    triton = tmp_path / "home/.cache/triton/lock"
    triton.parent.mkdir(parents=True)
    triton.write_text("")
    assert sweep(tmp_path) == ([], [])
    assert hub.exists() and triton.exists()


def test_nothing_to_sweep_without_cache_directories(tmp_path):
    assert sweep(tmp_path) == ([], [])


def test_a_symlinked_lock_is_never_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    link = tmp_path / AITER_BUILD
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    assert sweep(tmp_path) == ([], [])
    assert target.read_text() == "keep"


def _library(relative: str) -> str:
    return "AITER" if "aiter" in relative else "torch extensions"
