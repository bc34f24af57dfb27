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

No compile after the server is ready: the kernel has a fixed, small set of
compiled variants (tile shape x prefix-load width; the sequence count is not
specialized and the outputs' alignment never depends on it), and the
metadata builder compiles every variant its scheduler limits can reach when
it is constructed. A step then launches the compiled binary directly,
without Triton's JIT dispatcher (argument binding and specialization cost
tens of microseconds per call).
"""

import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from vllm.logger import init_logger
from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
from vllm.triton_utils import tl, triton
from vllm.v1.attention.backends.gdn_attn import (
    GDNAttentionBackend,
    GDNAttentionMetadataBuilder,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import AttentionSpec

logger = init_logger(__name__)

# A program covers SEQ_TILE sequences x CHUNK_TILE chunks: one long prompt
# spreads over many programs, many short ones share one. Small one-warp
# tiles keep many programs in flight; batches of short sequences take wide
# four-warp tiles, so few programs repeat the prefix load. A batch takes the
# first shape whose CHUNK_TILE covers its longest sequence, else the last.
# (SEQ_TILE, CHUNK_TILE, warps):
_TILE_SHAPES = ((64, 4, 4), (2, 32, 1), (1, 256, 1))
# Widths of the load that sums the chunks of the sequences before a tile. A
# batch takes the narrowest that covers its sequence count (a wider load
# costs time); a batch wider than the widest takes a variant that loops over
# it, so any count works with a fixed set of variants. Only that variant has
# the loop: even never entered, it cost 0.13-0.2 us a launch on the H200.
_PREFIX_WIDTHS = (128, 256, 512, 1024, 2048)


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


# A variant is (index into _TILE_SHAPES, width index): a width index into
# _PREFIX_WIDTHS, or len(_PREFIX_WIDTHS) for the widest width with the loop.
Variant = tuple[int, int]
# launch(grid_x, grid_y, cu_seqlens, chunk_indices, chunk_offsets, num_seqs)
Launch = Callable[[int, int, torch.Tensor, torch.Tensor, torch.Tensor, int], None]
# One launch per (device index, variant), made once; -1 is the CPU (the
# interpreter), as torch.Tensor.get_device() says.
_LAUNCHES: dict[tuple[int, int, int], Launch] = {}
# Chunks are FLA's 64 tokens, the only size the Kimi layers use and the
# only one compiled; a power of two, so counting chunks is a shift.
assert FLA_CHUNK_SIZE & (FLA_CHUNK_SIZE - 1) == 0
_CHUNK_SHIFT = FLA_CHUNK_SIZE.bit_length() - 1
# Under TRITON_INTERPRET=1 the kernel is an interpreted function: nothing is
# compiled, every launch goes through Triton.
_COMPILES = isinstance(_chunk_metadata_kernel, triton.runtime.jit.JITFunction)


_CHUNK_TILES = tuple(shape[1] for shape in _TILE_SHAPES)


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


def _make_launch(device_index: int, variant: Variant) -> Launch:
    seq_tile, chunk_tile, warps = _TILE_SHAPES[variant[0]]
    loops = variant[1] == len(_PREFIX_WIDTHS)
    width = _PREFIX_WIDTHS[variant[1] - loops]
    constants = (FLA_CHUNK_SIZE, seq_tile, chunk_tile, width, loops)
    kernel = _chunk_metadata_kernel

    def through_triton(grid_x, grid_y, cu_seqlens, chunk_indices, chunk_offsets, n):
        kernel[grid_x, grid_y](
            cu_seqlens,
            chunk_indices,
            chunk_offsets,
            n,
            *constants,
            num_warps=warps,
        )

    if not _COMPILES:
        return through_triton
    # Compile once for this variant's specialization: cu_seqlens and
    # num_seqs unspecialized, both outputs 16-byte aligned (the dtypes stand
    # in for tensors at address 0; every real output is a fresh allocation,
    # which the caching allocator aligns far beyond 16 bytes).
    with torch.cuda.device(device_index):
        binary = kernel.warmup(
            torch.int32,
            torch.int32,
            torch.int64,
            1,
            *constants,
            grid=(1,),
            num_warps=warps,
        )
    try:
        binary._init_handles()
        run, function = binary.run, binary.function
        packed_metadata = binary.packed_metadata
        current_stream = triton.runtime.driver.active.get_current_stream
    except AttributeError:  # a Triton without these internals: stay correct
        return through_triton

    def direct(grid_x, grid_y, cu_seqlens, chunk_indices, chunk_offsets, n):
        # The launcher skips constexpr arguments but takes them in place;
        # no launch metadata and no enter/exit hooks (profilers only).
        run(
            grid_x,
            grid_y,
            1,
            current_stream(device_index),
            function,
            packed_metadata,
            None,
            None,
            None,
            cu_seqlens,
            chunk_indices,
            chunk_offsets,
            n,
            *constants,
        )

    return direct


def _launch_for(device_index: int, variant: Variant) -> Launch:
    key = (device_index, *variant)
    launch = _LAUNCHES.get(key)
    if launch is None:
        launch = _LAUNCHES[key] = _make_launch(device_index, variant)
    return launch


@dataclass(frozen=True)
class WarmUp:
    """What warm_up_chunk_metadata did."""

    variants: tuple[Variant, ...]  # ready to launch on the device now
    prepared: int  # of those, made by this call (compiled, or loaded from
    # Triton's disk cache); 0 when an earlier call had made them all
    seconds: float


def warm_up_chunk_metadata(
    max_num_seqs: int, max_num_batched_tokens: int, device: torch.device | str
) -> WarmUp:
    """Make the launch of every variant reachable under the scheduler's
    limits, so that no step compiles. Idempotent and cheap once done."""
    start = time.perf_counter()
    device = torch.device(device)
    variants = tuple(reachable_variants(max_num_seqs, max_num_batched_tokens))
    if device.type == "cuda":
        device_index = (
            device.index if device.index is not None else torch.cuda.current_device()
        )
    elif not _COMPILES:
        device_index = -1  # the interpreter runs on CPU tensors
    else:
        return WarmUp((), 0, time.perf_counter() - start)  # nothing runs there
    before = len(_LAUNCHES)
    for variant in variants:
        _launch_for(device_index, variant)
    return WarmUp(variants, len(_LAUNCHES) - before, time.perf_counter() - start)


def prepare_chunk_metadata_device(
    cu_seqlens: torch.Tensor, cu_seqlens_cpu: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Build ``(chunk_indices, chunk_offsets)`` for ``cu_seqlens`` on its device.

    ``cu_seqlens_cpu`` must hold the same values on the host; it only sizes
    the outputs and the grid, so nothing is copied from the device.
    ``chunk_indices`` is int32 ``(chunks, 2)``; ``chunk_offsets`` is int64,
    like the CPU reference. Chunks are FLA_CHUNK_SIZE (64) tokens.
    """
    assert cu_seqlens.dtype == torch.int32
    # In place, no temporaries: host work is most of this step's cost.
    chunks = cu_seqlens_cpu.numpy()
    chunks = chunks[1:] - chunks[:-1]
    chunks += FLA_CHUNK_SIZE - 1
    chunks >>= _CHUNK_SHIFT
    num_seqs = len(chunks)
    # The ufuncs' own reductions: ndarray.sum/max add a Python layer.
    total_chunks = int(np.add.reduce(chunks))
    most_chunks = int(np.maximum.reduce(chunks))
    tile, width = select_variant(num_seqs, most_chunks)
    seq_tile, chunk_tile, _ = _TILE_SHAPES[tile]

    # Two allocations rather than views of one: each is aligned whatever the
    # sequence count, and it takes fewer host calls than slicing and viewing.
    chunk_offsets = cu_seqlens.new_empty(num_seqs + 1, dtype=torch.int64)
    chunk_indices = cu_seqlens.new_empty((total_chunks, 2))
    device_index = cu_seqlens.get_device()
    launch = _LAUNCHES.get((device_index, tile, width)) or _launch_for(
        device_index, (tile, width)
    )
    launch(
        -(-num_seqs // seq_tile),
        max(1, -(-most_chunks // chunk_tile)),
        cu_seqlens,
        chunk_indices,
        chunk_offsets,
        num_seqs,
    )
    return chunk_indices, chunk_offsets


class KimiK3ROCmKDAMetadataBuilder(GDNAttentionMetadataBuilder):
    """GDN metadata builder whose chunk metadata is made on the device.

    The Kimi KDA layer runs chunk KDA over the whole non-spec batch, decodes
    included (``non_spec_query_start_loc``), not over the decode-peeled
    prefill slice that the generic builder describes; the metadata here
    describes exactly what the layer hands the kernel.

    Built before the server reports ready, it compiles every kernel variant
    its scheduler limits can reach, so no serving step waits on a compile.
    """

    def __init__(
        self,
        kv_cache_spec: "AttentionSpec",
        layer_names: list[str],
        vllm_config: "VllmConfig",
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        scheduler = vllm_config.scheduler_config
        self.chunk_metadata_warm_up = warm_up_chunk_metadata(
            scheduler.max_num_seqs, scheduler.max_num_batched_tokens, device
        )
        logger.info(
            "KDA chunk metadata: %d kernel variants ready (%d prepared now) "
            "for max_num_seqs=%d, max_num_batched_tokens=%d in %.2f s",
            len(self.chunk_metadata_warm_up.variants),
            self.chunk_metadata_warm_up.prepared,
            scheduler.max_num_seqs,
            scheduler.max_num_batched_tokens,
            self.chunk_metadata_warm_up.seconds,
        )

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
