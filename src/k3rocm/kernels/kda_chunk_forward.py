# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.27.1).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_chunk_forward.py by
# `k3rocm patchgen`: edit that file, not this one.
"""vLLM 0.27.1's chunk KDA forward, kernel for kernel, every launch handed
to the caller.

``_forward`` is the vendored ``chunk_kda_with_fused_gate`` (AMD copy) after
its argument handling (``prepare``): the eight kernels of a call in the same
order, on the same buffers, with the same arguments. The caller's
``launch(site, grid, *args)`` issues each: Triton's dispatcher, while a plan
is read back (kda_chunk_plans.py), and the plan's binaries themselves after
that (kda_launch_entry.py). One thing differs from the vendored path: the
fused inter + solve kernel writes Akk's zeros above the diagonal itself
(patch 0007), so Akk is not zero-filled first (a fill kernel fewer a call).
"""

import math
from collections.abc import Callable

import torch
from vllm.third_party.flash_linear_attention.ops import l2norm as _l2norm_module
from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
from vllm.utils.math_utils import RCP_LN2

# The kernels, in the order one call launches them ("intra" is one of two:
# the sub-chunk kernel with a gate lower bound, token-parallel without).
SITES = (
    "l2norm_q",
    "l2norm_k",
    "gate",
    "intra",
    "inter_solve",
    "recompute_w_u",
    "delta_h",
    "output",
)
_BC = 16  # sub-chunk size of chunk_kda_fwd_intra
_L2NORM_EPS = 1e-6  # l2norm_fwd's default, as chunk_kda_with_fused_gate calls it
_L2NORM_MBLOCK = 32

# launch(site, grid, *arguments in the kernel's parameter order)
Launch = Callable[..., None]


def _kernels() -> dict[str, object]:
    """Each site's kernel as the vendored code calls it (imported late: the
    vendored chunk module imports the launches, this module among them)."""
    from vllm.models.kimi_k3.amd.ops.third_party.kda import (
        chunk,
        chunk_intra,
        chunk_intra_token_parallel,
    )
    from vllm.third_party.flash_linear_attention.ops import chunk_delta_h

    return {
        "l2norm": _l2norm_module.l2norm_fwd_kernel2,
        "gate": chunk.kda_gate_chunk_cumsum_vector_kernel,
        "intra_sub_chunk": chunk_intra.chunk_kda_fwd_kernel_intra_sub_chunk,
        "intra_token_parallel": (
            chunk_intra_token_parallel.chunk_kda_fwd_kernel_intra_token_parallel
        ),
        "inter_solve": chunk_intra.chunk_kda_fwd_kernel_inter_solve_fused,
        "recompute_w_u": chunk.recompute_w_u_fwd_kernel,
        "delta_h": chunk_delta_h.chunk_gated_delta_rule_fwd_kernel_h_blockdim64,
        "output": chunk.chunk_gla_fwd_kernel_o,
    }


def site_kernel(site: str, lower_bound: float | None) -> object:
    """The kernel (as the vendored code calls it) launched at ``site``."""
    kernels = _kernels()
    if site.startswith("l2norm"):
        return kernels["l2norm"]
    if site == "intra":
        name = "intra_sub_chunk" if lower_bound is not None else "intra_token_parallel"
        return kernels[name]
    return kernels[site]


def _platform_constants() -> dict[str, object]:
    """What the vendored code reads from the platform on every call."""
    from vllm.models.kimi_k3.amd.ops.third_party.kda import chunk_intra
    from vllm.platforms import current_platform

    return {
        "use_gather": chunk_intra.is_gather_supported,
        "solve_tril_precision": (
            "tf32"
            if current_platform.is_cuda() and current_platform.has_device_capability(80)
            else "ieee"
        ),
    }


# Every intermediate of a call starts on a multiple of this many bytes of
# the call's one allocation (the compiled binaries assume 16-byte-aligned
# pointers, as fresh allocations are).
_PIECE_BYTES = 256


def _starts(pieces) -> tuple[list[int], int]:
    """(each piece's first byte, the allocation's size) for ``(shape,
    dtype)`` pieces laid out one after another."""
    starts, end = [], 0
    for shape, dtype in pieces:
        starts.append(end)
        end += -(-math.prod(shape) * dtype.itemsize // _PIECE_BYTES) * _PIECE_BYTES
    return starts, end


def _carve(device: torch.device, pieces, pointers: bool) -> tuple[torch.Tensor, list]:
    """(one allocation, room in it for uninitialized contiguous tensors of
    the given ``(shape, dtype)``): one call into the caching allocator where
    the vendored path makes eleven or thirteen. With ``pointers`` each
    piece is its device address (an int, which Triton's launchers take as a
    pointer as it is); else a tensor with the strides torch.empty gives."""
    starts, end = _starts(pieces)
    memory = torch.empty(end, dtype=torch.uint8, device=device)
    if pointers:
        base = memory.data_ptr()
        return memory, [base + start for start in starts]
    return memory, [
        memory[start:].view(dtype)[: math.prod(shape)].view(shape)
        for (shape, dtype), start in zip(pieces, starts, strict=True)
    ]


def intermediates(q, k, v, raw_g, raw_beta, use_l2norm, num_chunks) -> tuple:
    """The ``(shape, dtype)`` of every intermediate of a call, in the order
    the vendored path allocates them (``_carve`` cuts them from one
    allocation)."""
    B, T, _, K = k.shape
    HV, HU, V = raw_g.shape[2], v.shape[2], v.shape[3]
    f32 = torch.float32
    return (
        *(((q.shape, q.dtype), (k.shape, k.dtype)) if use_l2norm else ()),
        (raw_g.shape, f32),  # g
        (raw_beta.shape, f32),  # beta
        ((B, T, HV, FLA_CHUNK_SIZE), k.dtype),  # Aqk
        ((B, T, HV, FLA_CHUNK_SIZE), k.dtype),  # Akk (torch.zeros there)
        ((B, T, HV, _BC), f32),  # Akkd
        (k.shape, k.dtype),  # w
        (v.shape, v.dtype),  # u
        (k.shape, k.dtype),  # kg
        ((B, num_chunks, HU, V, K), k.dtype),  # h (kg's dtype)
        (v.shape, v.dtype),  # v_new
    )  # fmt: skip


def carved_bytes(q, k, v, raw_g, raw_beta, use_l2norm, num_chunks) -> int:
    """The size of a call's one allocation of intermediates: what AMD's
    Triton sees as every intermediate's storage."""
    return _starts(intermediates(q, k, v, raw_g, raw_beta, use_l2norm, num_chunks))[1]


def final_state_shape(num_seqs: int, k, v) -> tuple[int, int, int, int]:
    """The final states' shape (float32, a tensor of its own)."""
    return num_seqs, v.shape[2], v.shape[3], k.shape[3]


def _forward(launch, consts, pointers, q, k, v, raw_g, raw_beta, A_log, g_bias,
             scale, initial_state, output_final_state, lower_bound, use_l2norm,
             cu_seqlens, chunk_indices, chunk_offsets):  # fmt: skip
    """vLLM 0.27.1's chunk_kda_with_fused_gate after its argument handling
    (l2norm_fwd of q and k, then chunk_kda_with_fused_gate_fwd), kernel for
    kernel, every launch through ``launch(site, grid, *args)`` with the
    arguments in the kernel's parameter order, constexprs included.
    ``consts`` holds the pinned configurations' values and the platform's.
    The intermediates have the vendored path's shapes and dtypes and are cut
    from one allocation (``_carve``). With ``pointers``, every tensor
    argument goes to the launch as its device address, which is what the
    compiled binary receives either way (Triton's launcher then neither
    calls data_ptr() nor asks the driver about the pointer, argument by
    argument); else as the tensor (what Triton's dispatcher specializes on).
    Returns the output (written over v) and the final state."""
    BT = FLA_CHUNK_SIZE
    num_chunks = chunk_indices.shape[0]
    num_seqs = cu_seqlens.shape[0] - 1
    B, T, H, K = k.shape  # the l2norm outputs have the inputs' shapes
    Bq, Tq, Hq, Kq = q.shape
    HV = raw_g.shape[2]  # g has raw_g's shape
    Bg, Tg, _, S = raw_g.shape
    HU, V = v.shape[2], v.shape[3]  # u and v_new have v's
    beta_strides = raw_beta.stride()
    f32 = torch.float32
    memory, carved = _carve(
        q.device,
        intermediates(q, k, v, raw_g, raw_beta, use_l2norm, num_chunks),
        pointers,
    )
    normed = carved[:2] if use_l2norm else ()
    g, beta, Aqk, Akk, Akkd, w, u, kg, h, v_new = carved[len(normed) :]
    final_state = (
        torch.empty(final_state_shape(num_seqs, k, v), dtype=f32, device=q.device)
        if output_final_state
        else None
    )
    out, state = v, final_state
    if pointers:
        q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state, state = (
            None if x is None else x.data_ptr()
            for x in (q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state,
                      state)
        )  # fmt: skip
        cu_seqlens, chunk_indices, chunk_offsets = (
            x.data_ptr() for x in (cu_seqlens, chunk_indices, chunk_offsets)
        )

    if use_l2norm:  # l2norm_fwd (its fused-kernel branch)
        q_in, q, k_in, k = q, normed[0], k, normed[1]
        rows = Bq * Tq * Hq
        launch("l2norm_q", (-(-rows // _L2NORM_MBLOCK), 1, 1),
               q_in, q, _L2NORM_EPS, rows, Kq, consts["l2norm_q_BD"],
               _L2NORM_MBLOCK)  # fmt: skip
        rows = B * T * H
        launch("l2norm_k", (-(-rows // _L2NORM_MBLOCK), 1, 1),
               k_in, k, _L2NORM_EPS, rows, K, consts["l2norm_k_BD"],
               _L2NORM_MBLOCK)  # fmt: skip

    # fused_kda_gate_chunk_cumsum (raw_g's dims)
    gate_bs = consts["gate_BS"]
    launch("gate", (-(-S // gate_bs) + 1, num_chunks, Bg * HV),
           raw_g, raw_beta, A_log, g_bias, g, beta, cu_seqlens, chunk_indices,
           RCP_LN2, lower_bound or 0.0, 1.0, 20.0, Tg, *beta_strides,
           HV, S, BT, gate_bs, g_bias is not None, True,
           lower_bound is not None)  # fmt: skip

    # chunk_kda_fwd_intra (k's dims; HV from g). Its Akk = torch.zeros(...)
    # is not repeated: the fused inter + solve kernel, told to, writes the
    # zeros above the diagonal itself (patch 0007), every element the
    # later kernels read of Akk, so a fill kernel and a torch call go.
    if lower_bound is not None:  # chunk_kda_fwd_kernel_intra_sub_chunk
        launch("intra", (num_chunks, -(-BT // _BC), B * HV),
               q, k, g, beta, Aqk, Akkd, scale, cu_seqlens, chunk_indices, T,
               H, HV, K, BT, _BC, consts["intra_BK"], True,
               consts["use_gather"])  # fmt: skip
    else:  # chunk_kda_fwd_intra_token_parallel (q's dims)
        launch("intra", (Bq * Tq, -(-HV // consts["intra_BH"]), 1),
               q, k, g, beta, Aqk, Akkd, scale, cu_seqlens, num_seqs, Tq,
               Hq, HV, Kq, BT, _BC, consts["intra_BH"], True)  # fmt: skip
    launch("inter_solve", (num_chunks, B * HV, 1),
           q, k, g, beta, Aqk, Akkd, Akk, scale, cu_seqlens, chunk_indices, T,
           H, HV, K, BT, _BC, consts["inter_solve_BK"], True,
           lower_bound is not None, consts["solve_tril_precision"],
           True)  # fmt: skip

    # recompute_w_u_fwd (A is Akk; k's dims)
    launch("recompute_w_u", (num_chunks, B * H, 1),
           None, k, None, kg, v, beta, w, u, Akk, g, cu_seqlens, chunk_indices,
           T, H, K, V, BT, 64, 64, False, True, True, "ieee")  # fmt: skip

    # chunk_gated_delta_rule_fwd_h (k is kg, v is u)
    delta_bv = consts["delta_h_BV"]
    launch("delta_h", (-(-V // delta_bv), num_seqs * HU, 1),
           kg, u, w, v_new, None, g, h, initial_state, state, cu_seqlens,
           chunk_offsets, T, HU, H, K, V, BT, delta_bv, False, True,
           initial_state is not None, state is not None, True, True,
           True)  # fmt: skip

    # chunk_gla_fwd_o_gk, written over v (q's dims)
    out_bv = consts["output_BV"]
    launch("output", (-(-V // out_bv), num_chunks, Bq * Hq),
           q, v_new, g, h, v, Aqk, cu_seqlens, chunk_indices, scale, Tq, Hq, Kq,
           V, BT, consts["output_BK"], out_bv, True)  # fmt: skip
    # Held until here: the launches got only addresses in it, so this name
    # is all that keeps it from the allocator until they are issued.
    del memory
    return out, final_state


def prepare(q, k, v, raw_g, raw_beta, A_log, g_bias, scale, initial_state,
            output_final_state, lower_bound, use_qk_l2norm_in_kernel,
            cu_seqlens, chunk_indices, chunk_offsets) -> tuple:  # fmt: skip
    """The call's arguments as the vendored path hands them to its kernels
    (contiguous copies, flattened gate parameters, the default scale)."""
    if use_qk_l2norm_in_kernel:
        q, k = q.contiguous(), k.contiguous()
    return (
        q, k, v.contiguous(), raw_g.contiguous(), raw_beta, A_log.reshape(-1),
        None if g_bias is None else g_bias.reshape(-1),
        k.shape[-1] ** -0.5 if scale is None else scale,
        None if initial_state is None else initial_state.contiguous(),
        output_final_state, lower_bound, use_qk_l2norm_in_kernel, cu_seqlens,
        chunk_indices, chunk_offsets,
    )  # fmt: skip
