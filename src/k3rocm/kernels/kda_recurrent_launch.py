# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.32.0).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_recurrent_launch.py by
# `k3rocm patchgen`: edit that file, not this one.
"""vLLM 0.32.0's recurrent KDA kernel launched directly: the binary its
wrapper launches, without the wrapper's checks and Triton's dispatcher.

The wrapper (``fused_recurrent_kda_fwd``) costs 28 to 65 us of host time a
call more than a direct launch of the same binary (kimi-k3-rocm
docs/benchmarks.md, run M): the Triton recurrent kernel takes every
decode of a mixed step and every step with speculation, in each of the 48
KDA layers. A call is matched to its plan by a signature
(``_signature``): its tensors' layouts, and the launch configuration the
wrapper's own functions pick for its request and token counts. The first
call of a signature runs the wrapper, which checks it and launches through
Triton, and the plan is read back from Triton after it (``plan_after``:
the binary Triton launched for those arguments); later calls of the
signature launch that binary with their own pointers and counts. What a
signature fixes and what each call still checks: ``_signature`` and
``_counts_agree``; the test holds them to the wrapper.
"""

from dataclasses import dataclass

import torch
from vllm.utils.math_utils import cdiv

from .kda_direct_launch import (
    DIRECT,
    _current_stream,
    _direct,
    _far,
    _misaligned,
    unwrap,
)

# Kernel arguments the plan does not fix: the tensors' pointers (the
# kernel's first 13 parameters, lower_bound among them), N and T.
_VARYING = 16


@dataclass(frozen=True)
class RecurrentLaunch:
    """One signature's binary as a direct launch, and the arguments after T
    (dimensions, strides, flags, the static length, the stages), which
    are the same for every call of it."""

    run: object
    function: object
    packed_metadata: object
    scale: float
    constexprs: tuple
    programs_per_sequence: int  # value blocks x heads


# Plans by signature; "wrapper_calls": calls that ran the wrapper (the first
# of a signature, or one no plan covers), "plans_made": plans read back.
PLANS: dict[tuple, RecurrentLaunch] = {}
STATS = {"wrapper_calls": 0, "plans_made": 0}


def _on_gpu(tensor: torch.Tensor) -> bool:
    """Where plans are made and launched (a test stands in for it)."""
    return tensor.is_cuda


def _config(N: int, T: int, H: int, spec: bool, uniform) -> tuple:
    """(static sequence length, BV, num_warps, num_stages) as the wrapper
    picks them for these counts, by its own functions."""
    from .ops.third_party.kda import fused_recurrent as wrapper

    static = wrapper._get_static_sequence_length(
        total_tokens=T, head_sequences=H * N, is_single_sequence=spec and N == 1,
        uniform_sequence_length=uniform,
    )  # fmt: skip
    return (static, *wrapper._select_kda_launch_config(
        use_gate_in_kernel=True, is_spec_decoding=spec, head_sequences=H * N,
        static_sequence_length=static, has_multi_token_sequence=T > N,
    ))  # fmt: skip


def _signature(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, state,
               cu_seqlens, indices, accepted, uniform, out) -> tuple:  # fmt: skip
    """What a plan is found by: the device, every tensor's dtype, its
    strides and its shape but the token or request count (and the stride
    of q's batch dimension of size 1, which nothing reads: it follows the
    step), the pointers' alignment and 2 GiB class (AMD), which optional
    inputs are given, and the launch configuration of this call's counts.
    Two calls of one signature whose counts agree (``_counts_agree``) pass
    the wrapper's checks alike and launch one binary (tested)."""
    N = cu_seqlens.shape[0] - 1
    T, H = q.shape[1], q.shape[2]
    spec = accepted is not None
    tensors = (q, k, v, raw_g, raw_beta, A_log, dt_bias, out, state, cu_seqlens,
               indices, accepted)  # fmt: skip
    return (
        q.get_device(), _misaligned(*tensors), _far(*tensors), type(lower_bound),
        spec, uniform is None, N == 1, _config(N, T, H, spec, uniform),
        *((x.dtype, x.shape[0], x.shape[2:], x.stride()[1:])
          for x in (q, k, v, raw_g, raw_beta, out)),
        state.dtype, state.shape[1:], state.stride(),
        cu_seqlens.dtype, cu_seqlens.stride(),
        indices.dtype, indices.ndim, indices.shape[1:], indices.stride(),
        None if accepted is None else (accepted.dtype, accepted.stride()),
        A_log.dtype, A_log.shape, A_log.stride(),
        None if dt_bias is None else (dt_bias.dtype, dt_bias.shape, dt_bias.stride()),
    )  # fmt: skip


def _counts_agree(q, k, v, raw_g, raw_beta, indices, accepted, uniform, out,
                  N: int) -> bool:  # fmt: skip
    """The wrapper's checks a signature does not fix: every tensor has the
    call's T tokens, and T fits N (one token a request without speculation,
    N common lengths with one)."""
    T = q.shape[1]
    if not (k.shape[1] == v.shape[1] == raw_g.shape[1] == raw_beta.shape[1]
            == out.shape[1] == T):  # fmt: skip
        return False
    if accepted is None:
        return T == N
    return uniform is None or (uniform > 0 and N * uniform == T)


def recurrent_launched(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                       state, cu_seqlens, indices, accepted, uniform,
                       out) -> tuple[tuple | None, tuple | None]:  # fmt: skip
    """``fused_recurrent_kda`` with the gate in the kernel, launched
    directly: ((out, state), None) once launched; else (None, planned),
    where planned is what ``plan_after`` takes once the wrapper ran the
    call (its signature, and the out tensor to hand the wrapper), or None
    where no plan is made (the interpreter, a CPU tensor)."""
    if not (DIRECT and _on_gpu(q)):
        return None, None
    if out is None:
        out = torch.empty_like(v)
    signature = _signature(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                           state, cu_seqlens, indices, accepted, uniform,
                           out)  # fmt: skip
    plan = PLANS.get(signature)
    N = cu_seqlens.shape[0] - 1
    if plan is None or not _counts_agree(q, k, v, raw_g, raw_beta, indices,
                                         accepted, uniform, out, N):  # fmt: skip
        STATS["wrapper_calls"] += 1
        return None, (signature if plan is None else None, out)
    pointers = (
        q.data_ptr(), k.data_ptr(), v.data_ptr(), raw_g.data_ptr(),
        raw_beta.data_ptr(), A_log.data_ptr(),
        None if dt_bias is None else dt_bias.data_ptr(), out.data_ptr(),
        state.data_ptr(), cu_seqlens.data_ptr(), indices.data_ptr(),
        None if accepted is None else accepted.data_ptr(),
    )  # fmt: skip
    plan.run(
        N * plan.programs_per_sequence, 1, 1, _current_stream(signature[0]),
        plan.function, plan.packed_metadata, None, None, None, *pointers,
        lower_bound, plan.scale, N, q.shape[1], *plan.constexprs,
    )  # fmt: skip
    return (out, state), None


def kernel_arguments(kernel, launch_kwargs: dict) -> tuple:
    """The kernel's arguments in its parameter order, from the wrapper's
    keyword arguments and what the kernel's heuristics add to them (as
    Triton's Heuristics does before the JIT function sees them)."""
    from triton.runtime.autotuner import Heuristics

    values = dict(launch_kwargs)
    layer = kernel
    while isinstance(layer, Heuristics):
        for name, rule in layer.values.items():
            values[name] = rule(values)
        layer = layer.fn
    jit, _ = unwrap(kernel)
    return tuple(values[name] for name in jit.arg_names)


def plan_after(planned, kernel, launch_kwargs: dict) -> None:
    """Read back the binary the wrapper just launched through Triton with
    ``launch_kwargs`` for ``planned`` (from ``recurrent_launched``): Triton
    has it compiled, so its warm-up run compiles and launches nothing."""
    signature, _ = planned
    if signature is None:  # a plan's call whose counts the wrapper checked
        return
    args = kernel_arguments(kernel, launch_kwargs)
    jit, _ = unwrap(kernel)
    warps = launch_kwargs["num_warps"]
    # num_stages is the kernel's last parameter and a compile option: given
    # by name it is both, as the wrapper gives it.
    binary = jit.run(*args[:-1], grid=(1,), warmup=True, num_warps=warps,
                     num_stages=args[-1])  # fmt: skip
    direct = _direct(binary)
    if direct is None:
        return
    H, V, BV = args[_VARYING], args[_VARYING + 2], args[_VARYING + 4]
    PLANS[signature] = RecurrentLaunch(
        *direct, scale=args[13], constexprs=args[_VARYING:],
        programs_per_sequence=cdiv(V, BV) * H,
    )  # fmt: skip
    STATS["plans_made"] += 1
