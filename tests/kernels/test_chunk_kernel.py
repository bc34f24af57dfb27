"""The series' device kernel against the reference semantics, run by the
Triton interpreter on CPU tensors. It is imported from its sources,
src/k3rocm/kernels/kda_metadata_kernel.py (the kernel and its variants) and
kda_metadata_launch.py (the host side); patch 0002 is generated from them, and
test_patch_sources checks that the patched tree holds the same bytes.

The reference (k3rocm.smoke.chunk_reference) is itself checked against vLLM
0.27.1's own CPU functions wherever those are right (every empty sequence at
the back), and the one place they differ is documented by a test.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.third_party.flash_linear_attention.ops.index import (
    prepare_chunk_indices,
    prepare_chunk_offsets,
)

from k3rocm.kernels import kda_metadata_kernel, kda_metadata_launch
from k3rocm.kernels.kda_metadata_launch import prepare_chunk_metadata_device
from k3rocm.smoke.chunk_reference import cu_seqlens_of, reference_chunk_metadata


def device_metadata(seq_lens):
    cu = cu_seqlens_of(seq_lens)
    # A distinct tensor for the host copy, as in the builder.
    return prepare_chunk_metadata_device(cu, cu.clone())


def assert_matches_reference(seq_lens):
    indices, offsets = device_metadata(seq_lens)
    ref_indices, ref_offsets = reference_chunk_metadata(seq_lens)
    assert indices.dtype == torch.int32  # cu_seqlens' dtype, as vLLM's
    assert offsets.dtype == torch.int64  # as prepare_chunk_offsets
    assert indices.shape == ref_indices.shape
    assert offsets.shape == (len(seq_lens) + 1,)
    assert torch.equal(indices, ref_indices)
    assert torch.equal(offsets, ref_offsets)


def vllm_cpu_metadata(seq_lens):
    cu = cu_seqlens_of(seq_lens)
    return prepare_chunk_indices(cu, 64), prepare_chunk_offsets(cu, 64)


def empties_at_back(seq_lens):
    return sorted(seq_lens, key=lambda n: n == 0)


# --- the reference is vLLM 0.27.1's semantics where vLLM is right -----------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 700), min_size=1, max_size=40))
def test_reference_equals_vllm_cpu_functions_with_empties_at_back(seq_lens):
    seq_lens = empties_at_back(seq_lens)
    ref_indices, ref_offsets = reference_chunk_metadata(seq_lens)
    vllm_indices, vllm_offsets = vllm_cpu_metadata(seq_lens)
    assert torch.equal(vllm_indices.reshape(-1, 2), ref_indices)
    assert torch.equal(vllm_offsets, ref_offsets)


def test_vllm_cpu_function_misnumbers_sequences_after_an_empty_one():
    """0.27.1's prepare_chunk_indices numbers sequences by non-empty ordinal:
    with an empty sequence before a non-empty one, the later rows name the
    wrong sequence (the kernels would read the wrong cu_seqlens entry). The
    builder only pads at the back, so the series leaves that function alone;
    the device kernel uses the real index."""
    seq_lens = [100, 0, 65]
    vllm_indices, _ = vllm_cpu_metadata(seq_lens)
    ref_indices, _ = reference_chunk_metadata(seq_lens)
    assert vllm_indices.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert ref_indices.tolist() == [[0, 0], [0, 1], [2, 0], [2, 1]]
    assert_matches_reference(seq_lens)


# --- named edge cases ----------------------------------------------------


@pytest.mark.parametrize(
    "seq_lens",
    [
        pytest.param([0, 0, 130, 5], id="empty-at-start"),
        pytest.param([70, 0, 0, 64, 1], id="empty-in-middle"),
        pytest.param([64, 200, 0, 0, 0], id="empty-at-end"),
        pytest.param([0], id="only-an-empty-sequence"),
        pytest.param([0, 0, 0], id="all-empty"),
        pytest.param([64, 128, 640], id="multiples-of-chunk-size"),
        pytest.param([1, 63, 65, 127, 129], id="not-multiples-of-chunk-size"),
        pytest.param([1] * 7 + [300], id="decodes-then-a-prefill"),
    ],
)
def test_edge_case(seq_lens):
    assert_matches_reference(seq_lens)


# Up to 256 tokens the kernel takes 64-sequence tiles, beyond it 2-sequence
# tiles; its prefix load widens past 128 sequences.
@pytest.mark.parametrize("longest", [256, 300])
@pytest.mark.parametrize(
    "num_seqs", [1, 63, 64, 65, 127, 128, 129, 1023, 1024, 1025, 2000]
)
def test_sequence_counts_around_tile_boundaries(num_seqs, longest):
    generator = torch.Generator().manual_seed(num_seqs)
    seq_lens = torch.randint(0, longest + 1, (num_seqs,), generator=generator)
    seq_lens[0] = longest  # the longest sequence picks the tile shape
    assert_matches_reference(seq_lens.tolist())


def test_single_1m_token_prompt():
    assert_matches_reference([1 << 20])


def test_long_prompt_among_decodes_and_padding():
    assert_matches_reference([1] * 200 + [100_000] + [1] * 55 + [0] * 16)


def test_batch_of_no_sequences():
    indices, offsets = prepare_chunk_metadata_device(*[cu_seqlens_of([])] * 2)
    assert indices.shape == (0, 2) and offsets.tolist() == [0]


# Small batches are sized with plain integers, larger ones with NumPy.
@pytest.mark.parametrize("delta", [-1, 0, 1])
def test_sequence_counts_around_the_plain_integer_sizing(delta):
    num_seqs = kda_metadata_launch._PLAIN_INT_MAX_SEQS + delta
    generator = torch.Generator().manual_seed(num_seqs)
    seq_lens = torch.randint(0, 2000, (num_seqs,), generator=generator).tolist()
    seq_lens[1] = 0
    assert_matches_reference(seq_lens)


# --- property test over random batches ------------------------------------


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.one_of(st.just(0), st.just(1), st.integers(0, 5000)),
        min_size=1,
        max_size=300,
    )
)
def test_random_batches_match_reference(seq_lens):
    assert_matches_reference(seq_lens)


# --- the compiled variants: each one tested, none unreachable -------------

# The last width index is the widest width with its loop.
ALL_VARIANTS = [
    (tile, width)
    for tile in range(len(kda_metadata_kernel._TILE_SHAPES))
    for width in range(len(kda_metadata_kernel._PREFIX_WIDTHS) + 1)
]


def batch_selecting(variant, loops=False):
    """A batch whose sequence count and longest sequence select `variant`;
    with `loops`, more sequences than the widest prefix load covers."""
    tile, width = variant
    shapes, widths = (
        kda_metadata_kernel._TILE_SHAPES,
        kda_metadata_kernel._PREFIX_WIDTHS,
    )
    num_seqs = widths[width - 1] + 1 if width else 5
    if loops:
        num_seqs = 2 * widths[-1] + 1
    most_chunks = shapes[tile - 1][1] + 1 if tile else shapes[0][1]
    generator = torch.Generator().manual_seed(tile * 10 + width)
    seq_lens = torch.randint(0, 64 * most_chunks, (num_seqs,), generator=generator)
    seq_lens[num_seqs // 2] = 64 * most_chunks
    return seq_lens.tolist()


@pytest.mark.parametrize("variant", ALL_VARIANTS, ids=str)
def test_every_variant_matches_reference(variant):
    seq_lens = batch_selecting(variant)
    most_chunks = -(-max(seq_lens) // 64)
    assert kda_metadata_launch.select_variant(len(seq_lens), most_chunks) == variant
    assert_matches_reference(seq_lens)


def test_prefix_load_loops_past_the_widest_width():
    variant = (0, len(kda_metadata_kernel._PREFIX_WIDTHS))
    seq_lens = batch_selecting(variant, loops=True)
    assert len(seq_lens) > 2 * kda_metadata_kernel._PREFIX_WIDTHS[-1]
    assert kda_metadata_launch.select_variant(len(seq_lens), 4) == variant
    assert_matches_reference(seq_lens)


def test_every_variant_is_reachable_and_no_other_exists():
    assert (
        sorted(kda_metadata_launch.reachable_variants(1 << 20, 1 << 30)) == ALL_VARIANTS
    )
    selected = {
        kda_metadata_launch.select_variant(num_seqs, most_chunks)
        for num_seqs in range(1, 4000, 7)
        for most_chunks in range(0, 600, 3)
    }
    assert selected == set(ALL_VARIANTS)


@settings(max_examples=300, deadline=None)
@given(
    max_num_seqs=st.integers(1, 4096),
    max_num_batched_tokens=st.integers(1, 1 << 21),
    data=st.data(),
)
def test_warm_up_covers_every_batch_within_the_limits(
    max_num_seqs, max_num_batched_tokens, data
):
    """Whatever batch the scheduler can form under its limits runs a variant
    the warm-up made: no compile after the builder is constructed."""
    reachable = kda_metadata_launch.reachable_variants(
        max_num_seqs, max_num_batched_tokens
    )
    num_seqs = data.draw(st.integers(1, max_num_seqs))
    longest = data.draw(st.integers(0, max_num_batched_tokens))
    variant = kda_metadata_launch.select_variant(num_seqs, -(-longest // 64))
    assert variant in reachable


def test_recipe_limits_reach_few_variants():
    # Kimi-K3's AMD recipe: --max-num-seqs 128 --max-num-batched-tokens 4096.
    assert kda_metadata_launch.reachable_variants(128, 4096) == [(0, 0), (1, 0), (2, 0)]
    assert kda_metadata_launch.reachable_variants(128, 256) == [(0, 0)]
    assert kda_metadata_launch.reachable_variants(129, 2048) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]


def test_warm_up_prepares_each_reachable_variant_once():
    first = kda_metadata_launch.warm_up_chunk_metadata(300, 1 << 16, "cpu")
    assert first.variants == tuple(kda_metadata_launch.reachable_variants(300, 1 << 16))
    again = kda_metadata_launch.warm_up_chunk_metadata(300, 1 << 16, "cpu")
    assert again.variants == first.variants and again.prepared == 0
