"""Inputs for the float64 KDA reference (k3rocm.smoke.kda_reference) as
Kimi-K3's layer passes them, and the reference's answer with its tolerance:
shared by the reference's own tests (tests/smoke/test_kda_reference.py) and
the kernels' tests against it (tests/kernels/test_kda_kernels_vs_reference.py)."""

from __future__ import annotations

import pytest
import torch

from k3rocm.smoke import kda_reference as ref
from k3rocm.smoke import kda_tolerance
from k3rocm.smoke.chunk_reference import cu_seqlens_of, reference_chunk_metadata

HEADS, HEAD_DIM = 2, 16
BOUNDS = pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["bound", "no-bound"])


def randn(gen, *size, dtype=torch.float32):
    return torch.randn(*size, generator=gen, dtype=torch.float32).to(dtype)


def chunk_args(seq_lens, lower_bound, *, initial=True, dim=HEAD_DIM, seed=0):
    """chunk_kda_with_fused_gate's arguments as the layer passes them, with
    the series' metadata (real sequence indices)."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(seq_lens)
    shape = (1, total, HEADS, dim)
    indices, offsets = reference_chunk_metadata(seq_lens)
    h0 = randn(gen, len(seq_lens), HEADS, dim, dim) if initial else None
    return (
        randn(gen, *shape), randn(gen, *shape), randn(gen, *shape),
        randn(gen, *shape), randn(gen, 1, total, HEADS), randn(gen, HEADS),
        randn(gen, HEADS * dim), None, h0, True, lower_bound, True,
        cu_seqlens_of(seq_lens), indices, offsets,
    )  # fmt: skip


def chunk_expected(args, **perturb):
    """The reference for ``args`` (with arguments replaced by ``perturb``),
    and the tolerance for float32 kernels in the interpreter."""
    names = (
        "q k v raw_g raw_beta A_log g_bias scale initial_state output_final_state "
        "lower_bound use_qk_l2norm_in_kernel cu_seqlens chunk_indices chunk_offsets"
    ).split()
    kwargs = dict(zip(names, args, strict=True)) | perturb
    peak = []
    out, final = ref.chunk_kda_reference(**kwargs, peak=peak)
    lens = torch.diff(args[12]).tolist()
    tol = kda_tolerance.tolerance(
        torch.float32, "chunk", scale=HEAD_DIM**-0.5, peak=max(peak),
        max_len=max(lens), truncating=True,
    )  # fmt: skip
    return out, final, tol
