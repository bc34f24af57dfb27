"""The tiny model's CPU server (the try-out, the container and process-tree
tests) takes the same branches of vLLM's CPU dispatch on every x86-64 host.

vLLM 0.27.1's CPU build picks kernels by the host's instruction set: with
AMX (``torch.cpu._is_amx_tile_supported()``) a bfloat16 or int8 linear layer
runs a packed AMX GEMM and bfloat16 attention the ``amx`` kernel. The tiny
model is served in float32 (``--dtype float32``), which neither takes: its
linear layers run oneDNN and its attention the ``vec`` kernel with AMX
reported present or absent. These tests hold the served dtype to that; the
host's actual flags never enter (both answers are monkeypatched).
"""

import json
import shlex

import pytest
import torch
from vllm.model_executor.layers.utils import check_cpu_sgl_kernel
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

from k3rocm.common.setting_table import EXTRA_ARGS
from k3rocm.tryout.cpu import CPU_SETTINGS, SERVE_ARGS
from k3rocm.tryout.tiny_model import build_tiny_llama

BLOCK_SIZE = 128  # vLLM's CPU platform default


def served_dtype(args: list[str]) -> torch.dtype:
    return getattr(torch, args[args.index("--dtype") + 1])


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict:
    config = build_tiny_llama(tmp_path_factory.mktemp("tiny")) / "config.json"
    return json.loads(config.read_text())


def cpu_branches(monkeypatch, amx: bool, dtype: torch.dtype, shapes: dict) -> tuple:
    """What vLLM's CPU dispatch picks for the tiny model's layers in
    ``dtype`` when the host reports AMX (or not): the packed AMX GEMM for
    each linear shape, and the attention kernel."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    hidden, inner = shapes["hidden_size"], shapes["intermediate_size"]
    linears = [(3 * hidden, hidden), (2 * inner, hidden), (hidden, inner)]
    return (
        [check_cpu_sgl_kernel(n, k, dtype) for n, k in linears],
        _get_attn_isa(dtype, BLOCK_SIZE, shapes["head_dim"]),
    )


@pytest.mark.parametrize(
    "args",
    [list(SERVE_ARGS), shlex.split(CPU_SETTINGS[EXTRA_ARGS.env])],
    ids=["tests' server", "container and try-out"],
)
def test_the_tiny_model_takes_the_same_cpu_kernels_with_and_without_amx(
    args, shapes, monkeypatch
):
    dtype = served_dtype(args)
    with_amx = cpu_branches(monkeypatch, True, dtype, shapes)
    without = cpu_branches(monkeypatch, False, dtype, shapes)
    assert with_amx == without == ([False, False, False], "vec")


def test_in_bfloat16_the_same_model_would_depend_on_the_host(shapes, monkeypatch):
    """Why the dtype is pinned: served in bfloat16, the tiny model would run
    other kernels on an AMX host than elsewhere."""
    with_amx = cpu_branches(monkeypatch, True, torch.bfloat16, shapes)
    without = cpu_branches(monkeypatch, False, torch.bfloat16, shapes)
    assert with_amx == ([True, True, True], "amx")
    assert without == ([False, False, False], "vec")
