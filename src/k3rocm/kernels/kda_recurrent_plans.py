# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.27.1).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_recurrent_plans.py by
# `k3rocm patchgen`: edit that file, not this one.
"""The plans of the precompiled recurrent KDA launch: the kernel that takes
a mixed batch's decodes.

Patch 0004 peels a mixed batch's decodes off chunk KDA and hands them to
fused_recurrent_kda as the layer calls it there (gate and beta sigmoid
fused, q/k L2-normalized in the kernel, one token per sequence). Its wrapper
and Triton's dispatcher cost more host time than the kernel runs
(docs/benchmarks.md), and so would checking every call in full: a call is
matched to its plan by a signature of its tensors' layouts
(``_recurrent_signature``), and a signature is checked in full
(``_recurrent_layout``, ``_recurrent_key``) once, the first time it is met.
The kernel bakes the state pool's and the state indices' row strides in,
which exist once the KV cache and the block table do: the ROCm builder
plans the layers' calls (kda_launch_warm_up.py) at its first build, which
vLLM makes while it captures CUDA graphs, before the server is ready.

Nothing here keeps plans or launches them: kda_launch_entry.py does both.
"""

from dataclasses import dataclass

import torch
from vllm.triton_utils import triton

from .kda_direct_launch import _direct, _far, _misaligned, unwrap

_RECURRENT_BV = 32  # the wrapper's block with the gate in the kernel
_RECURRENT_WARPS = 4
_RECURRENT_STAGES = 2


def _recurrent_kernel():
    from vllm.models.kimi_k3.amd.ops.third_party.kda import fused_recurrent

    return fused_recurrent.fused_recurrent_kda_fwd_kernel


def _recurrent_arguments(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                         state, cu_seqlens, state_indices, out,
                         num_accepted_tokens=None) -> tuple:  # fmt: skip
    """The kernel's arguments in its parameter order, as the wrapper
    (fused_recurrent_kda_fwd) and the kernel's heuristics make them; with
    ``num_accepted_tokens``, a speculative call's."""
    T, H, K = q.shape[1], q.shape[2], q.shape[3]
    V = v.shape[-1]
    spec = num_accepted_tokens is not None
    return (
        q, k, v, raw_g, raw_beta, A_log, dt_bias, out, state, cu_seqlens,
        state_indices, num_accepted_tokens, lower_bound, K**-0.5,
        cu_seqlens.shape[0] - 1, T, H, K, V, triton.next_power_of_2(K),
        _RECURRENT_BV, q.stride(1), raw_g.stride(1), raw_beta.stride(1),
        out.stride(1), state.stride(0), state_indices.stride(0), spec, True,
        True, True, dt_bias is not None, lower_bound is not None,
        _RECURRENT_STAGES,
    )  # fmt: skip


def _recurrent_layout(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                      state, cu_seqlens, state_indices, out) -> bool:  # fmt: skip
    """Calls the plans cover, on a GPU (``q.is_cuda`` too): what the wrapper
    asserts of them, one token per sequence."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    return (
        B == 1
        and k.shape == q.shape
        and v.shape == out.shape == (1, T, H, V)
        and raw_g.shape == (1, T, H, K)
        and raw_beta.shape == (1, T, H)
        and q.stride()[2:] == k.stride()[2:] == raw_g.stride()[2:] == (K, 1)
        and v.stride()[2:] == out.stride()[2:] == (V, 1)
        and raw_beta.stride(2) == 1
        and q.stride(1) == k.stride(1) == v.stride(1)
        and state.shape[1:] == (H, V, K)
        and state.stride()[1:] == (V * K, K, 1)
        and state_indices.ndim == 1
        and cu_seqlens.shape[0] - 1 == T == state_indices.shape[0]
        and cu_seqlens.is_contiguous()
        and A_log.is_contiguous()
        and (dt_bias is None or dt_bias.is_contiguous())
        and (lower_bound is None or type(lower_bound) is float)
    )


def _recurrent_key(args: tuple) -> tuple:
    """Everything the kernel's binary depends on: the device, every
    tensor's dtype, 16-byte alignment and storage past 2 GiB or not (AMD's
    pointer class), the constexprs (the dimensions, strides and flags),
    which optional inputs are given."""
    tensors = [a for a in args if torch.is_tensor(a)]
    constexprs = args[13:14] + args[16:]  # scale; H, K, V, blocks, strides, flags
    return (
        tensors[0].get_device(),
        tuple(t.dtype for t in tensors),
        _misaligned(*tensors),
        _far(*tensors),
        tuple(a is None for a in args[:13]),
        constexprs,
    )


def _recurrent_signature(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                         state, cu_seqlens, state_indices, out,
                         misaligned: int) -> tuple:  # fmt: skip
    """What the plan lookup compares, for the whole batch's tensors (the
    decodes are their first rows): every tensor's dtype, its strides and
    its shape but those that follow the token count (the batch's and the
    padded forward's: the token dimension, and the stride of the batch
    dimension of size 1, which nothing reads), the device, the pointers'
    alignment, which storages pass 2 GiB, which optional inputs are given.
    Two calls of one signature (and enough rows) pass or fail
    ``_recurrent_layout`` alike and have one ``_recurrent_key``: all either
    depends on is in it (tested)."""
    qs, ks, vs, gs, bs, os_ = (
        q.shape, k.shape, v.shape, raw_g.shape, raw_beta.shape, out.shape
    )  # fmt: skip
    far = _far(q, k, v, raw_g, raw_beta, A_log, dt_bias, out, state, cu_seqlens,
               state_indices)  # fmt: skip
    return (
        q.get_device(), misaligned, far, type(lower_bound),
        q.dtype, qs[0], qs[2:], q.stride()[1:],
        k.dtype, ks[0], ks[2:], k.stride()[1:],
        v.dtype, vs[0], vs[2:], v.stride()[1:],
        raw_g.dtype, gs[0], gs[2:], raw_g.stride()[1:],
        raw_beta.dtype, bs[0], bs[2:], raw_beta.stride()[1:],
        out.dtype, os_[0], os_[2:], out.stride()[1:],
        state.dtype, state.shape[1:], state.stride(),
        cu_seqlens.dtype, cu_seqlens.stride(),
        state_indices.dtype, state_indices.stride(),
        A_log.dtype, A_log.is_contiguous(),
        None if dt_bias is None else (dt_bias.dtype, dt_bias.is_contiguous()),
    )  # fmt: skip


@dataclass(frozen=True)
class RecurrentPlan:
    """One kind of recurrent call's binary as a direct launch, and the
    arguments it takes that are the same for every call of the kind."""

    run: object
    function: object
    packed_metadata: object
    scale: float
    constexprs: tuple  # the arguments after T: dimensions, strides, flags
    programs_per_sequence: int  # the wrapper's grid: value blocks x heads


def _compile_recurrent(args: tuple):
    """The binary Triton's dispatcher launches for these kernel arguments,
    compiled now unless Triton has it (its warm-up run launches nothing).
    num_stages is a constexpr of the kernel and its compile option both;
    given by name it is both, as the wrapper gives it."""
    jit, _ = unwrap(_recurrent_kernel())
    return jit.run(
        *args[:-1], grid=(1,), warmup=True, num_warps=_RECURRENT_WARPS,
        num_stages=args[-1],
    )  # fmt: skip


def _plan_recurrent(args: tuple) -> RecurrentPlan | None:
    """The plan of the call with these kernel arguments: the binary
    (``_compile_recurrent``) as a direct launch, or None where this Triton
    lacks the internals."""
    direct = _direct(_compile_recurrent(args))
    if direct is None:
        return None
    H, V = args[16], args[18]
    return RecurrentPlan(
        *direct, scale=args[13], constexprs=args[16:],
        programs_per_sequence=-(-V // _RECURRENT_BV) * H,
    )  # fmt: skip


def _on_gpu(tensor: torch.Tensor) -> bool:
    """Where plans are made (a test stands in for it on the CPU)."""
    return tensor.is_cuda


def _decode_rows(decodes, tokens, q, k, v, raw_g, raw_beta, A_log, dt_bias,
                 lower_bound, state, cu_seqlens, state_indices,
                 out) -> tuple:  # fmt: skip
    """The wrapper's arguments (in _recurrent_arguments' order) for the
    batch's first ``decodes`` sequences, ``tokens`` tokens."""
    return (
        q[:, :tokens], k[:, :tokens], v[:, :tokens], raw_g[:, :tokens],
        raw_beta[:, :tokens], A_log, dt_bias, lower_bound, state,
        cu_seqlens[: decodes + 1], state_indices[:decodes], out[:, :tokens],
    )  # fmt: skip


def _rows(decodes, q, k, v, raw_g, raw_beta, out, cu_seqlens, state_indices) -> bool:
    """Every tensor has the rows the decodes' launch reads or writes."""
    return (
        min(q.shape[1], k.shape[1], v.shape[1], raw_g.shape[1], raw_beta.shape[1],
            out.shape[1], state_indices.shape[0], cu_seqlens.shape[0] - 1)
        >= decodes
    )  # fmt: skip


def _recurrent_grid(args: tuple) -> int:
    """The wrapper's grid: a program per value block, sequence and head."""
    H, V = args[16], args[18]
    return -(-V // _RECURRENT_BV) * args[14] * H


def recurrent_call_kind(call: tuple) -> tuple | None:
    """The kind (plan key) of a recurrent_kda_launched call, from its
    arguments after ``vendored``; None for one no plan covers (it runs the
    wrapper)."""
    sliced = _decode_rows(*call)
    if call[0] != call[1] or not _recurrent_layout(*sliced):
        return None
    return _recurrent_key(_recurrent_arguments(*sliced))
