"""No 32-bit pointer-offset product on the shipped KDA path (issue 38 item 1).

A chunk KDA call of more than 8,388,608 token-heads (96 heads and 87,400
tokens) wraps vLLM 0.27.1's chunk-state offset `(i_tg * H + i_h) * K * V`
and ends in an illegal memory access (on the H200: docs/benchmarks.md,
"Long steps"). Buffers that size do not fit a CPU test, so the suite checks
the arithmetic by reading it: tests/support/offset_audit.py finds every
product in an offset added to a pointer that is computed from a run-time
index and has no 64-bit operand yet. The patched tree must have none, other
than the products listed here as bounded; vLLM 0.27.1's own kernels must
show the overflow named in the issue and upstream's 0.34.0 change. The
Triton interpreter tests of the chunk kernels (test_chunk_kernel.py,
test_chunk_launch.py) run the patched kernels numerically.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.offset_audit import audit_source
from support.vllm_trees import installed_root, patched_tree

pytestmark = pytest.mark.every_line

REPO = Path(__file__).resolve().parents[2]
KDA = "vllm/models/kimi_k3/amd/ops/third_party/kda"
FLA = "vllm/third_party/flash_linear_attention/ops"
# The Triton files the Kimi KDA layer runs (patch 0005's launch sites, the
# recurrent decode kernels) and the series' own kernels.
SHIPPED = [
    f"{FLA}/chunk_delta_h.py",
    f"{FLA}/l2norm.py",
    f"{KDA}/chunk.py",
    f"{KDA}/chunk_intra.py",
    f"{KDA}/chunk_intra_token_parallel.py",
    f"{KDA}/fused_recurrent.py",
]
SERIES_KERNELS = sorted((REPO / "src/k3rocm/kernels").glob("*.py"))

# Indices whose products stay below 2**31 without a cast, and why:
# - a token's place within its own sequence (i_tc*, i_ti, i, j, its length
#   T, a chunk i_t of a sequence), a batch index of the fixed-length layout (i_b): below
#   the call's tokens, and tokens x heads x 128 < 2**31 for every step the
#   launcher admits (k3rocm.launcher.step_bound: at most 9,984,000
#   token-heads, x 128 = 1.28e9);
# - a head or an in-head tile (i_h, o_hv, o_v): below the head count;
# - a sequence (i_n) or a decode row of the packed decode kernel: below
#   max-num-seqs (128 in the recipe), times at most 3 x 96 x 128 elements.
#   fused_recurrent_kda_packed_decode is another change's (speculative
#   decoding's state indices) and is left as vLLM ships it.
WITHIN_SEQUENCE = frozenset({"i_tc0", "i_tc1", "i_tc2", "i_tc3", "i_ti", "i", "j", "T"})
BOUNDED = {
    "chunk_kda_fwd_kernel_inter_solve_fused": WITHIN_SEQUENCE,
    "chunk_kda_fwd_kernel_intra_sub_chunk": WITHIN_SEQUENCE,
    "chunk_kda_fwd_kernel_intra_token_parallel": WITHIN_SEQUENCE | {"o_hv"},
    "kda_gate_chunk_cumsum_vector_kernel": frozenset({"i_t", "i_b"}),
    "kda_gate_fwd_kernel": frozenset({"i_h"}),
    "_kda_gate_beta_fwd_kernel": frozenset({"i_h"}),
    "fused_recurrent_kda_fwd_kernel": frozenset({"i_n"}),
    "fused_recurrent_kda_packed_decode_kernel": frozenset({"i_n", "o_v"}),
    # 0.32.0's state kernel addresses its initial and final states by value
    # tile (o_v < V) instead of a block pointer.
    "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": frozenset({"o_v"}),
}


@pytest.mark.parametrize("rel", SHIPPED)
def test_shipped_kernels_form_offsets_in_64_bits(rel):
    source = (patched_tree() / rel).read_text()
    assert [str(f) for f in audit_source(source, BOUNDED)] == []


@pytest.mark.parametrize("path", SERIES_KERNELS, ids=lambda p: p.name)
def test_series_kernels_form_offsets_in_64_bits(path):
    assert [str(f) for f in audit_source(path.read_text(), BOUNDED)] == []


def test_the_audit_finds_the_releases_own_32_bit_offsets():
    """The installed release's own kernels (0.27.1's; 0.32.0's, where the
    output kernel's state offset sits in a tensor descriptor): the products
    the issue names, and one or more in every kernel the patch changes."""
    found = []
    for rel in SHIPPED:
        found += audit_source((installed_root() / rel).read_text(), BOUNDED)
    products = {(f.kernel, f.product) for f in found}
    assert ("chunk_gla_fwd_kernel_o", "(i_tg * H + i_h) * K * V") in products
    assert (
        "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
        "(boh * H + i_h) * V * K",
    ) in products
    assert {f.kernel for f in found} == {
        "chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
        "l2norm_fwd_kernel1",
        "l2norm_fwd_kernel2",
        "recompute_w_u_fwd_kernel",
        "chunk_gla_fwd_kernel_o",
        "kda_gate_chunk_cumsum_vector_kernel",
        "chunk_kda_fwd_kernel_inter_solve_fused",
        "chunk_kda_fwd_kernel_intra_sub_chunk",
        "chunk_kda_fwd_kernel_intra_token_parallel",
        "_kda_gate_beta_fwd_kernel",
    }


def test_the_audit_sees_a_cast_made_after_the_product():
    """0.27.1's chunk_delta_h casts the wrapped product: too late."""
    late = "@triton.jit\ndef k(h, H, K, i_h):\n    boh = tl.load(h)\n"
    late += "    h += ((boh * H + i_h) * K).to(tl.int64)\n    tl.store(h, 0)\n"
    early = late.replace("tl.load(h)", "tl.load(h).to(tl.int64)")
    products = {f.product for f in audit_source(late)}
    assert products == {"(boh * H + i_h) * K", "boh * H"}
    assert audit_source(early) == []
