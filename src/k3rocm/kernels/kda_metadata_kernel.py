# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_metadata_kernel.py by
# `k3rocm patchgen`: edit that file, not this one.
"""The device side of the stall-free KDA chunk metadata
(kda_metadata_launch.py launches it): one Triton kernel that writes
``chunk_indices`` and ``chunk_offsets`` from a device ``cu_seqlens``, and
its fixed set of compiled variants.

A variant is a tile shape and a prefix-load width. The sequence count is not
specialized and the outputs' alignment never depends on it, so the set is
small and known in advance: the metadata builder compiles every variant its
scheduler limits can reach before the server is ready.
"""

from bisect import bisect_left

from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
from vllm.triton_utils import tl, triton

# A program covers SEQ_TILE sequences x CHUNK_TILE chunks: one long prompt
# spreads over many programs, many short ones share one. Small one-warp
# tiles keep many programs in flight; batches of short sequences take wide
# four-warp tiles, so few programs repeat the prefix load. A batch takes the
# first shape whose CHUNK_TILE covers its longest sequence, else the last.
# (SEQ_TILE, CHUNK_TILE, warps):
_TILE_SHAPES = ((64, 4, 4), (2, 32, 1), (1, 256, 1))
_CHUNK_TILES = tuple(shape[1] for shape in _TILE_SHAPES)
# Widths of the load that sums the chunks of the sequences before a tile. A
# batch takes the narrowest that covers its sequence count (a wider load
# costs time); a batch wider than the widest takes a variant that loops over
# it, so any count works with a fixed set of variants. Only that variant has
# the loop: even never entered, it cost 0.13-0.2 us a launch on the H200.
_PREFIX_WIDTHS = (128, 256, 512, 1024, 2048)

# A variant is (index into _TILE_SHAPES, width index): a width index into
# _PREFIX_WIDTHS, or len(_PREFIX_WIDTHS) for the widest width with the loop.
Variant = tuple[int, int]


@triton.jit
def _chunks_of(cu_seqlens, seq, below, CHUNK_SIZE: tl.constexpr):
    """Total chunks of the sequences `seq` that are below `below`."""
    counted = seq < below
    seq_len = tl.load(cu_seqlens + seq + 1, mask=counted, other=0) - tl.load(
        cu_seqlens + seq, mask=counted, other=0
    )
    return tl.sum(tl.cdiv(seq_len, CHUNK_SIZE).to(tl.int32))


# num_seqs is not specialized (Triton would otherwise compile again for a
# count of 1 and for counts divisible by 16), nor is cu_seqlens' alignment
# (vLLM may hand a slice); the outputs are fresh allocations, always aligned.
@triton.jit(
    do_not_specialize=["num_seqs"], do_not_specialize_on_alignment=["cu_seqlens"]
)
def _chunk_metadata_kernel(
    cu_seqlens,
    chunk_indices,
    chunk_offsets,
    num_seqs,
    CHUNK_SIZE: tl.constexpr,
    SEQ_TILE: tl.constexpr,
    CHUNK_TILE: tl.constexpr,
    PREFIX_WIDTH: tl.constexpr,
    LOOP_PAST_WIDTH: tl.constexpr,
):
    first_seq = tl.program_id(0) * SEQ_TILE
    chunk_block = tl.program_id(1)

    # Chunks of every sequence before this tile: one wide load covers any
    # batch within the width (one memory round trip); only batches wider
    # than the widest width loop over the rest.
    prev = tl.arange(0, PREFIX_WIDTH)
    base = _chunks_of(cu_seqlens, prev, first_seq, CHUNK_SIZE)
    if LOOP_PAST_WIDTH:
        for start in range(PREFIX_WIDTH, first_seq, PREFIX_WIDTH):
            base += _chunks_of(cu_seqlens, start + prev, first_seq, CHUNK_SIZE)

    seq = first_seq + tl.arange(0, SEQ_TILE)
    in_batch = seq < num_seqs
    seq_len = tl.load(cu_seqlens + seq + 1, mask=in_batch, other=0) - tl.load(
        cu_seqlens + seq, mask=in_batch, other=0
    )
    n_chunks = tl.cdiv(seq_len, CHUNK_SIZE).to(tl.int32)
    seq_offset = base + tl.cumsum(n_chunks, axis=0) - n_chunks

    if chunk_block == 0:
        tl.store(chunk_offsets + seq, seq_offset, mask=in_batch)
        if first_seq + SEQ_TILE >= num_seqs:
            tl.store(chunk_offsets + num_seqs, base + tl.sum(n_chunks))

    chunk = chunk_block * CHUNK_TILE + tl.arange(0, CHUNK_TILE)
    row = seq_offset[:, None] + chunk[None, :]
    owned = chunk[None, :] < n_chunks[:, None]
    # Each row carries its sequence's own index, so an empty sequence
    # anywhere in the batch shifts nothing.
    tl.store(
        chunk_indices + 2 * row,
        tl.broadcast_to(seq[:, None], (SEQ_TILE, CHUNK_TILE)),
        mask=owned,
    )
    tl.store(
        chunk_indices + 2 * row + 1,
        tl.broadcast_to(chunk[None, :], (SEQ_TILE, CHUNK_TILE)),
        mask=owned,
    )


def select_variant(num_seqs: int, most_chunks: int) -> Variant:
    """The variant a batch runs: the first tile shape whose chunk tile covers
    its longest sequence (else the last), the narrowest prefix width that
    covers its sequence count (else the widest, looping)."""
    return (
        min(bisect_left(_CHUNK_TILES, most_chunks), len(_CHUNK_TILES) - 1),
        bisect_left(_PREFIX_WIDTHS, num_seqs),
    )


def reachable_variants(max_num_seqs: int, max_num_batched_tokens: int) -> list[Variant]:
    """Every variant a batch of at most ``max_num_seqs`` sequences and
    ``max_num_batched_tokens`` tokens can select."""
    most_chunks = triton.cdiv(max_num_batched_tokens, FLA_CHUNK_SIZE)
    tiles = [
        t for t in range(len(_TILE_SHAPES))
        if t == 0 or _TILE_SHAPES[t - 1][1] < most_chunks
    ]  # fmt: skip
    widths = [
        w for w in range(len(_PREFIX_WIDTHS) + 1)
        if w == 0 or _PREFIX_WIDTHS[w - 1] < max_num_seqs
    ]  # fmt: skip
    return [(t, w) for t in tiles for w in widths]


def variant_arguments(variant: Variant) -> tuple[tuple[int, ...], int]:
    """The kernel's constexpr arguments for ``variant`` (after the four
    runtime ones) and its warp count."""
    seq_tile, chunk_tile, warps = _TILE_SHAPES[variant[0]]
    loops = variant[1] == len(_PREFIX_WIDTHS)
    width = _PREFIX_WIDTHS[variant[1] - loops]
    return (FLA_CHUNK_SIZE, seq_tile, chunk_tile, width, loops), warps
