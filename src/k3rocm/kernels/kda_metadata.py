# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.27.1).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_metadata.py by
# `python -m k3rocm.patchgen`: edit that file, not this one.
"""Stall-free FLA chunk metadata for the ROCm Kimi-K3 KDA layers.

Chunk KDA needs, for the ``cu_seqlens`` it runs over, ``chunk_indices``
(one ``(sequence, chunk)`` row per 64-token chunk, sequences in order) and
``chunk_offsets`` (exclusive running chunk counts, ``num_seqs + 1`` long).
Rebuilding them from a device ``cu_seqlens`` calls ``.tolist()``, which makes
the host wait for the whole device queue on every prefill step. Here one
Triton launch writes both on the device; the host only reads the lengths it
already holds to size the outputs and the grid.
"""

import torch
from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
from vllm.triton_utils import tl, triton
from vllm.v1.attention.backends.gdn_attn import (
    GDNAttentionBackend,
    GDNAttentionMetadataBuilder,
)

# A program covers SEQ_TILE sequences x CHUNK_TILE chunks: one long prompt
# spreads over many programs, many short ones share one. Small one-warp
# tiles keep many programs in flight; batches of short sequences take wide
# four-warp tiles, so few programs repeat the wide prefix load. Three shapes
# keep the compiled variants few. (SEQ_TILE, CHUNK_TILE, warps):
_TILE_SHAPES = ((64, 4, 4), (2, 32, 1), (1, 256, 1))
# Lanes of the one wide load that sums the chunks before a tile.
_MIN_PREFIX_LANES = 128


@triton.jit
def _chunk_metadata_kernel(
    cu_seqlens,
    chunk_indices,
    chunk_offsets,
    num_seqs,
    CHUNK_SIZE: tl.constexpr,
    SEQ_TILE: tl.constexpr,
    CHUNK_TILE: tl.constexpr,
    PREFIX_LANES: tl.constexpr,
):
    first_seq = tl.program_id(0) * SEQ_TILE
    chunk_block = tl.program_id(1)

    # Chunks of every sequence before this tile, from one wide load: one
    # memory round trip per program, not one per preceding tile.
    prev = tl.arange(0, PREFIX_LANES)
    is_prev = prev < first_seq
    prev_len = tl.load(cu_seqlens + prev + 1, mask=is_prev, other=0) - tl.load(
        cu_seqlens + prev, mask=is_prev, other=0
    )
    base = tl.sum(tl.cdiv(prev_len, CHUNK_SIZE).to(tl.int32))

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


def prepare_chunk_metadata_device(
    cu_seqlens: torch.Tensor,
    cu_seqlens_cpu: torch.Tensor,
    chunk_size: int = FLA_CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Build ``(chunk_indices, chunk_offsets)`` for ``cu_seqlens`` on its device.

    ``cu_seqlens_cpu`` must hold the same values on the host; it only sizes
    the outputs and the grid, so nothing is copied from the device.
    ``chunk_indices`` is int32 ``(chunks, 2)``; ``chunk_offsets`` is int64,
    like the CPU reference. Both are views of one allocation.
    """
    assert cu_seqlens.dtype == torch.int32
    host = cu_seqlens_cpu.numpy()
    n_chunks = (host[1:] - host[:-1] + (chunk_size - 1)) // chunk_size
    num_seqs = n_chunks.shape[0]
    total_chunks, most_chunks = int(n_chunks.sum()), int(n_chunks.max())
    # The smallest chunk tile that covers the longest sequence.
    seq_tile, chunk_tile, warps = next(
        (shape for shape in _TILE_SHAPES if shape[1] >= most_chunks),
        _TILE_SHAPES[-1],
    )

    # int64 offsets first (8-byte aligned), then the int32 index pairs.
    buffer = torch.empty(
        2 * (num_seqs + 1) + 2 * total_chunks,
        dtype=torch.int32,
        device=cu_seqlens.device,
    )
    chunk_offsets = buffer[: 2 * (num_seqs + 1)].view(torch.int64)
    chunk_indices = buffer[2 * (num_seqs + 1) :].view(total_chunks, 2)
    grid = (
        triton.cdiv(num_seqs, seq_tile),
        max(1, triton.cdiv(most_chunks, chunk_tile)),
    )
    _chunk_metadata_kernel[grid](
        cu_seqlens,
        chunk_indices,
        chunk_offsets,
        num_seqs,
        CHUNK_SIZE=chunk_size,
        SEQ_TILE=seq_tile,
        CHUNK_TILE=chunk_tile,
        PREFIX_LANES=max(_MIN_PREFIX_LANES, triton.next_power_of_2(num_seqs)),
        num_warps=warps,
    )
    return chunk_indices, chunk_offsets


class KimiK3ROCmKDAMetadataBuilder(GDNAttentionMetadataBuilder):
    """GDN metadata builder whose chunk metadata is made on the device.

    The Kimi KDA layer runs chunk KDA over the whole non-spec batch, decodes
    included (``non_spec_query_start_loc``), not over the decode-peeled
    prefill slice that the generic builder describes; the metadata here
    describes exactly what the layer hands the kernel.
    """

    def _build_chunk_metadata(
        self,
        *,
        prefill_query_start_loc: torch.Tensor | None,
        prefill_query_start_loc_cpu: torch.Tensor | None,
        non_spec_query_start_loc: torch.Tensor | None,
        non_spec_query_start_loc_cpu: torch.Tensor | None,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert non_spec_query_start_loc is not None
        assert non_spec_query_start_loc_cpu is not None
        return prepare_chunk_metadata_device(
            non_spec_query_start_loc, non_spec_query_start_loc_cpu
        )


class KimiK3ROCmKDABackend(GDNAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "KIMI_K3_KDA_ROCM"

    @staticmethod
    def get_builder_cls() -> type[GDNAttentionMetadataBuilder]:
        return KimiK3ROCmKDAMetadataBuilder
