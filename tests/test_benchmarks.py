"""The GPU harness (benchmarks/) runs only on a lent GPU; here it must at
least bundle from the real trees and import, so it cannot rot unnoticed."""

import subprocess
import sys
from pathlib import Path

from vllm_trees import REPO, UPSTREAM_TREE, patched_tree

BENCHMARKS = REPO / "benchmarks"


def test_bundle_holds_patched_pristine_and_upstream_kernels():
    subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_bundle.py")], check=True, cwd=REPO
    )
    series_module = Path("vllm/models/kimi_k3/amd/kda_metadata.py")
    bundled = {
        tree: REPO / ".gpu" / tree / series_module for tree in ("patched", "upstream")
    }
    assert (
        bundled["patched"].read_bytes() == (patched_tree() / series_module).read_bytes()
    )
    assert (
        bundled["upstream"].read_bytes() == (UPSTREAM_TREE / series_module).read_bytes()
    )
    assert not (REPO / ".gpu/pristine" / series_module).exists()


def test_gpu_scripts_import_against_the_bundle():
    test_bundle_holds_patched_pristine_and_upstream_kernels()
    for script in ("gpu_check", "gpu_bench"):
        result = subprocess.run(
            [sys.executable, "-c", f"import {script}"],
            cwd=BENCHMARKS,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"},
        )
        assert result.returncode == 0, result.stderr[-2000:]
