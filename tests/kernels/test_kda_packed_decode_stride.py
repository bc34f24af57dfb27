"""Patch 0011 (vLLM #51682): the AMD packed KDA decode reads its state
indices through their stride.

With speculative decoding the Mamba group's block table is
``1 + num_speculative_blocks`` columns wide and the GDN builder hands the
layer's pure-decode path ``block_table_tensor[:, 0]``: a strided column.
vLLM 0.27.1's ``fused_recurrent_kda_packed_decode`` refuses it with a
ValueError (the warm-up of ``K3_FEATURES=dspark`` dies on it); the patched
one runs it, and its outputs and state pool match the float64 reference
(k3rocm.smoke.kda_reference) in the Triton interpreter, with what the call
allocates poisoned with NaN bytes."""

import importlib.util

import pytest
import torch
import vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent as recurrent
from support.kda_interpreter import interpretable_kernel, poison_allocations
from support.vllm_trees import installed_root

from k3rocm.smoke import kda_reference as ref
from k3rocm.smoke import kda_tolerance
from k3rocm.smoke.chunk_reference import cu_seqlens_of

HEADS, DIM, SLOTS = 2, 16, 12
NUM_SPEC_BLOCKS = 2  # block table 1 + 2 columns wide, as with speculation
RELATIVE = "vllm/models/kimi_k3/amd/ops/third_party/kda/fused_recurrent.py"


def unpatched_recurrent():
    """vLLM 0.27.1's own fused_recurrent.py, from the installed wheel."""
    spec = importlib.util.spec_from_file_location(
        "unpatched_fused_recurrent", installed_root() / RELATIVE
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decode_step(lower_bound, seed=3):
    """Five one-token decodes; their slots are column 0 of a block table of
    1 + NUM_SPEC_BLOCKS columns (the other columns hold other slots, so a
    kernel that reads them contiguously picks wrong ones). Row 3 is padding
    (slot -1), row 1 sits in slot 0 (never read or written)."""
    gen = torch.Generator().manual_seed(seed)
    n = 5
    table = torch.tensor(
        [[3, 7, 8], [0, 9, 10], [5, 11, 1], [-1, -1, -1], [1, 2, 4]],
        dtype=torch.int32,
    )
    assert table.shape[1] == 1 + NUM_SPEC_BLOCKS
    indices = table[:, 0]
    assert indices.stride(0) == 1 + NUM_SPEC_BLOCKS and not indices.is_contiguous()

    def randn(*size):
        return torch.randn(*size, generator=gen).to(torch.bfloat16)

    q, k, v, raw_g = (randn(1, n, HEADS, DIM) for _ in range(4))
    return dict(
        q=q, k=k, v=v, raw_g=raw_g, raw_beta=randn(1, n, HEADS),
        A_log=torch.randn(HEADS, generator=gen),
        dt_bias=torch.randn(HEADS * DIM, generator=gen), lower_bound=lower_bound,
        initial_state=torch.randn(SLOTS, HEADS, DIM, DIM, generator=gen),
        cu_seqlens=cu_seqlens_of([1] * n), ssm_state_indices=indices,
    )  # fmt: skip


def packed_decode(module, step, pool):
    q, k, v = (step[name][0].flatten(1) for name in "qkv")
    return module.fused_recurrent_kda_packed_decode(
        mixed_qkv=torch.cat([q, k, v], -1), raw_g=step["raw_g"],
        raw_beta=step["raw_beta"], A_log=step["A_log"], dt_bias=step["dt_bias"],
        lower_bound=step["lower_bound"], initial_state=pool,
        state_indices=step["ssm_state_indices"],
    )  # fmt: skip


def expected(step):
    peak = []
    out, pool = ref.recurrent_kda_reference(**step, peak=peak)
    tol = kda_tolerance.tolerance(
        torch.bfloat16, "recurrent", scale=DIM**-0.5, peak=max(peak), max_len=1,
        truncating=True,
    )  # fmt: skip
    return out, pool, tol


@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["bound", "no-bound"])
def test_strided_state_indices_match_the_reference(monkeypatch, lower_bound):
    kernel = recurrent.fused_recurrent_kda_packed_decode_kernel
    interpretable_kernel(monkeypatch, kernel)
    poison_allocations(monkeypatch)
    step = decode_step(lower_bound)
    pool = step["initial_state"].clone()
    out, _ = packed_decode(recurrent, step, pool)
    want_out, want_pool, tol = expected(step)
    excess = kda_tolerance.excess(out, want_out, tol, pool, want_pool)
    assert max(excess.values()) <= 1.0, excess
    assert not out[0, [1, 3]].any()  # slot 0 and padding: zeros
    # The other columns' slots are untouched: nothing read them as column 0.
    for slot in (7, 8, 9, 10, 11, 2, 4):
        assert torch.equal(pool[slot], step["initial_state"][slot])
    # Planted error: the column read as if contiguous (what dropping the
    # stride does: the block table's first five entries) fails the reference.
    table = step["ssm_state_indices"].as_strided((5 * (1 + NUM_SPEC_BLOCKS),), (1,))
    wrong = {**step, "ssm_state_indices": table[:5].clone()}
    bad_out, bad_pool = ref.recurrent_kda_reference(**wrong)
    assert max(kda_tolerance.excess(out, bad_out, tol, pool, bad_pool).values()) > 1.0


def test_vllm_0_27_1_refuses_the_strided_column():
    """The failure #51682 fixed, on 0.27.1's own file: the check fires
    before any kernel runs."""
    step = decode_step(-5.0)
    with pytest.raises(ValueError, match="must be contiguous and one-dimensional"):
        packed_decode(unpatched_recurrent(), step, step["initial_state"].clone())
