# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_metadata_launch.py by
# `k3rocm patchgen`: edit that file, not this one.
"""Stall-free FLA chunk metadata for the ROCm Kimi-K3 KDA layers: the host
side of the device kernel (kda_metadata_kernel.py), which the metadata
builder (kda_metadata.py) calls.

Chunk KDA needs, for the ``cu_seqlens`` it runs over, ``chunk_indices``
(one ``(sequence, chunk)`` row per 64-token chunk, sequences in order) and
``chunk_offsets`` (exclusive running chunk counts, ``num_seqs + 1`` long).
Rebuilding them from a device ``cu_seqlens`` calls ``.tolist()``, which makes
the host wait for the whole device queue on every prefill step. Here one
Triton launch writes both on the device; the host only reads the lengths it
already holds to size the outputs and the grid.

No compile after the server is ready: the builder compiles every kernel
variant its scheduler limits can reach when it is constructed
(warm_up_chunk_metadata). A step then launches the compiled binary directly,
without Triton's JIT dispatcher (argument binding and specialization cost
tens of microseconds per call).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
from vllm.triton_utils import triton

from .kda_metadata_kernel import (
    _TILE_SHAPES,
    Variant,
    _chunk_metadata_kernel,
    reachable_variants,
    select_variant,
    variant_arguments,
)

# launch(grid_x, grid_y, cu_seqlens, chunk_indices, chunk_offsets, num_seqs)
Launch = Callable[[int, int, torch.Tensor, torch.Tensor, torch.Tensor, int], None]
# One launch per (device index, variant), made once; -1 is the CPU (the
# interpreter), as torch.Tensor.get_device() says.
_LAUNCHES: dict[tuple[int, int, int], Launch] = {}
# Chunks are FLA's 64 tokens, the only size the Kimi layers use and the
# only one compiled; a power of two, so counting chunks is a shift.
assert FLA_CHUNK_SIZE & (FLA_CHUNK_SIZE - 1) == 0
_CHUNK_SHIFT = FLA_CHUNK_SIZE.bit_length() - 1
_CHUNK_ROUND = FLA_CHUNK_SIZE - 1
# Up to this many sequences, plain integers size a step faster than NumPy
# (whose fixed cost per call is about seven calls' worth of a short loop).
_PLAIN_INT_MAX_SEQS = 32
# Under TRITON_INTERPRET=1 the kernel is an interpreted function: nothing is
# compiled, every launch goes through Triton.
_COMPILES = isinstance(_chunk_metadata_kernel, triton.runtime.jit.JITFunction)


def _make_launch(device_index: int, variant: Variant) -> Launch:
    constants, warps = variant_arguments(variant)
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
    # in for tensors at address 0; prepare_chunk_metadata_device keeps every
    # real output 16-byte aligned).
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


def _chunk_counts(cu_seqlens_cpu: torch.Tensor) -> tuple[int, int, int]:
    """(sequences, chunks in all, chunks of the longest sequence), read from
    the host copy of cu_seqlens. Host work is most of a step's cost."""
    num_seqs = cu_seqlens_cpu.shape[0] - 1
    if num_seqs <= _PLAIN_INT_MAX_SEQS:
        ends = cu_seqlens_cpu.tolist()
        start = ends[0]
        total_chunks = most_chunks = 0
        for end in ends[1:]:
            chunks = (end - start + _CHUNK_ROUND) >> _CHUNK_SHIFT
            start = end
            total_chunks += chunks
            if chunks > most_chunks:
                most_chunks = chunks
        return num_seqs, total_chunks, most_chunks
    # One temporary array. Start minus end is minus the length, and an
    # arithmetic shift floors: -(-length >> shift) is the length's chunk
    # count, with no add. The ufuncs' own reductions: ndarray.sum/min add a
    # Python layer.
    ends = cu_seqlens_cpu.numpy()
    minus_chunks = np.subtract(ends[:-1], ends[1:])
    minus_chunks >>= _CHUNK_SHIFT
    return (
        num_seqs,
        -int(np.add.reduce(minus_chunks)),
        -int(np.minimum.reduce(minus_chunks)),
    )


def _outputs(
    cu_seqlens: torch.Tensor, num_seqs: int, total_chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialized ``(chunk_indices, chunk_offsets)``: two allocations,
    each aligned whatever the counts, as every compiled variant assumes. One
    allocation cut into both would need one 16-byte pad and three view
    calls, which cost about what the second allocation does (benchmarks/
    gpu_bench.py measures both)."""
    # empty_strided skips the stride computation that empty/new_empty do.
    device = cu_seqlens.device
    return (
        torch.empty_strided(
            (total_chunks, 2), (2, 1), dtype=torch.int32, device=device
        ),
        torch.empty_strided((num_seqs + 1,), (1,), dtype=torch.int64, device=device),
    )


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
    num_seqs, total_chunks, most_chunks = _chunk_counts(cu_seqlens_cpu)
    tile, width = select_variant(num_seqs, most_chunks)
    seq_tile, chunk_tile, _ = _TILE_SHAPES[tile]
    chunk_indices, chunk_offsets = _outputs(cu_seqlens, num_seqs, total_chunks)
    device_index = cu_seqlens.get_device()
    launch = _LAUNCHES.get((device_index, tile, width)) or _launch_for(
        device_index, (tile, width)
    )
    # At least one program, so that a batch of no sequences still writes
    # chunk_offsets' single 0.
    launch(
        -(-num_seqs // seq_tile) or 1,
        -(-most_chunks // chunk_tile) or 1,
        cu_seqlens,
        chunk_indices,
        chunk_offsets,
        num_seqs,
    )
    return chunk_indices, chunk_offsets
