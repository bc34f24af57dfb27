"""The GPU harness (benchmarks/) runs only on a lent GPU; here it must at
least bundle from the real trees and import, so it cannot rot unnoticed."""

import subprocess
import sys
from pathlib import Path

from vllm_trees import REPO

BENCHMARKS = REPO / "benchmarks"


def test_bundle_holds_patched_pristine_and_upstream_kernels():
    subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_bundle.py")], check=True, cwd=REPO
    )
    series_module = Path("vllm/models/kimi_k3/amd/kda_metadata.py")
    patched = (REPO / ".gpu/patched" / series_module).read_text()
    upstream = (REPO / ".gpu/upstream" / series_module).read_text()
    assert "_CHUNK_TILES" in patched and "_CHUNK_TILES" not in upstream
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
