"""The GPU harness (benchmarks/) runs only on a lent GPU; here it must at
least bundle from the real trees and import, so it cannot rot unnoticed."""

import subprocess
import sys
from pathlib import Path

import pytest
from support.vllm_trees import REPO, UPSTREAM_TREE, patched_tree

BENCHMARKS = REPO / "benchmarks"


@pytest.fixture(scope="module")
def bundle():
    subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_bundle.py")], check=True, cwd=REPO
    )
    return REPO / ".gpu"


def test_bundle_holds_patched_pristine_and_upstream_kernels(bundle):
    series_module = Path("vllm/models/kimi_k3/amd/kda_metadata.py")
    patched, upstream = bundle / "patched", bundle / "upstream"
    assert (patched / series_module).read_bytes() == (
        patched_tree() / series_module
    ).read_bytes()
    assert (upstream / series_module).read_bytes() == (
        UPSTREAM_TREE / series_module
    ).read_bytes()
    assert not (bundle / "pristine" / series_module).exists()


def test_gpu_scripts_import_against_the_bundle(bundle):
    for script in (
        "gpu_check",
        "gpu_bench",
        "gpu_compiles",
        "gpu_ablation",
        "gpu_spec",
        "gpu_reference",
        "gpu_long_steps",
        "gpu_smoke_time",
        "gpu_report",
    ):
        # gpu_peel and gpu_kda_launch make CUDA tensors as they load.
        result = subprocess.run(
            [sys.executable, "-c", f"import {script}"],
            cwd=BENCHMARKS,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1"},
        )
        assert result.returncode == 0, result.stderr[-2000:]
