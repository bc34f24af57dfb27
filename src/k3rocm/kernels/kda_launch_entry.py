# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.27.1).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_launch_entry.py by
# `k3rocm patchgen`: edit that file, not this one.
"""The precompiled launches' entry points, and the plans they have found.

``chunk_kda_launched`` takes the chunk KDA calls that bring their chunk
metadata (patch 0006), ``recurrent_kda_launched`` a mixed batch's decodes
(patch 0004). Each finds the plan of the call's kind and launches its
binaries directly; a call of a kind without a plan runs vLLM's own path,
which autotunes and compiles as 0.27.1 always did, and the plan is made
after it (kda_chunk_plans.py, kda_recurrent_plans.py). These are the hot
paths: what they do a call is what the series measures.

The plan tables and their counters live here, beside the only code that
fills them on a serving step; the warm-ups (kda_launch_warm_up.py) fill
the same objects ahead, and nothing ever rebinds them.
"""

import torch

from .kda_chunk_forward import _forward, prepare
from .kda_chunk_plans import Plan, _call_key, _handled, _make_plan
from .kda_direct_launch import DIRECT, _current_stream, _misaligned
from .kda_recurrent_plans import (
    RecurrentPlan,
    _decode_rows,
    _on_gpu,
    _plan_recurrent,
    _recurrent_arguments,
    _recurrent_key,
    _recurrent_layout,
    _recurrent_signature,
    _rows,
)

# One plan per kind of call (_call_key), and the kinds refused one.
_PLANS: dict[tuple, Plan] = {}
_REFUSED: set[tuple] = set()
# vendored_calls: calls that ran the vendored path (no plan for their kind
# yet, a call the plans do not cover, or a refused kind); plans_made: plans
# made after one; plans_refused: kinds given none (outside_allowed_configs).
STATS = {"vendored_calls": 0, "plans_made": 0, "plans_refused": 0}


def chunk_kda_launched(vendored, q, k, v, raw_g, raw_beta, A_log, g_bias,
                       scale, initial_state, output_final_state, lower_bound,
                       use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices,
                       chunk_offsets):  # fmt: skip
    """``chunk_kda_with_fused_gate`` for a call that brings its chunk
    metadata: through the plan of its kind; else through ``vendored`` (the
    vendored function, same arguments), making the plan after it."""
    prepared = prepare(q, k, v, raw_g, raw_beta, A_log, g_bias, scale,
                       initial_state, output_final_state, lower_bound,
                       use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices,
                       chunk_offsets)  # fmt: skip
    key = _call_key(*prepared) if DIRECT and _handled(prepared) else None
    if key is not None:
        plan = _PLANS.get(key)
        if plan is not None:
            launches = plan.launches
            stream = _current_stream(key[0])

            def launch(site, grid, *kernel_args):
                # No launch metadata and no enter/exit hooks (profilers
                # only); the launcher skips constexprs but takes them in place.
                run, function, packed_metadata = launches[site]
                run(grid[0], grid[1], grid[2], stream, function, packed_metadata,
                    None, None, None, *kernel_args)  # fmt: skip

            return _forward(launch, plan.consts, True, *prepared)
    STATS["vendored_calls"] += 1
    out = vendored(q, k, v, raw_g, raw_beta, A_log, g_bias, scale,
                   initial_state, output_final_state, lower_bound,
                   use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices,
                   chunk_offsets)  # fmt: skip
    if key is not None and key not in _REFUSED:
        plan = _make_plan(prepared)
        if plan is None:
            _REFUSED.add(key)
            STATS["plans_refused"] += 1
        else:
            _PLANS[key] = plan
            STATS["plans_made"] += 1
    return out


# checked so far (_recurrent_signature).
_RECURRENT_PLANS: dict[tuple, RecurrentPlan] = {}
_RECURRENT_SIGNATURES: dict[tuple, RecurrentPlan] = {}
# vendored_calls: calls that ran vLLM's wrapper; plans_made: plans made
# after one or by the warm-up.
RECURRENT_STATS = {"vendored_calls": 0, "plans_made": 0}


def recurrent_kda_launched(vendored, decodes, decode_tokens, q, k, v, raw_g,
                           raw_beta, A_log, dt_bias, lower_bound,
                           initial_state, cu_seqlens, ssm_state_indices,
                           out) -> None:  # fmt: skip
    """``vendored(...)`` (fused_recurrent_kda) for the ``decodes``
    sequences of ``decode_tokens`` tokens that open a mixed batch, given
    the whole batch's tensors (q, k, v, raw_g, raw_beta and out by token,
    cu_seqlens and ssm_state_indices by sequence; the calls read and write
    their first rows only, so no views are cut for them): through the plan
    of the call's kind; else through ``vendored`` with those rows
    (keyword arguments as the wrapper takes them), planning the kind after
    it. Writes the outputs into ``out`` and the states into
    ``initial_state`` in place, as the wrapper does."""
    if DIRECT and decodes == decode_tokens > 0:
        # The pointers are the launch's arguments and the alignment's source.
        d = None if dt_bias is None else dt_bias.data_ptr()
        pointers = (
            q.data_ptr(), k.data_ptr(), v.data_ptr(), raw_g.data_ptr(),
            raw_beta.data_ptr(), A_log.data_ptr(), d, out.data_ptr(),
            initial_state.data_ptr(), cu_seqlens.data_ptr(),
            ssm_state_indices.data_ptr(),
        )  # fmt: skip
        misaligned = 0
        if (pointers[0] | pointers[1] | pointers[2] | pointers[3] | pointers[4]
                | pointers[5] | (d or 0) | pointers[7] | pointers[8]
                | pointers[9] | pointers[10]) & 15:  # fmt: skip
            misaligned = _misaligned(q, k, v, raw_g, raw_beta, A_log, dt_bias,
                                     out, initial_state, cu_seqlens,
                                     ssm_state_indices)  # fmt: skip
        signature = _recurrent_signature(
            q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
            initial_state, cu_seqlens, ssm_state_indices, out, misaligned,
        )  # fmt: skip
        plan = _RECURRENT_SIGNATURES.get(signature)
        if plan is not None and _rows(decodes, q, k, v, raw_g, raw_beta, out,
                                      cu_seqlens, ssm_state_indices):  # fmt: skip
            plan.run(
                decodes * plan.programs_per_sequence, 1, 1,
                _current_stream(signature[0]), plan.function,
                plan.packed_metadata, None, None, None, *pointers, None,
                lower_bound, plan.scale, decodes, decode_tokens,
                *plan.constexprs,
            )  # fmt: skip
            return
    else:
        signature = None
    call = _decode_rows(
        decodes, decode_tokens, q, k, v, raw_g, raw_beta, A_log, dt_bias,
        lower_bound, initial_state, cu_seqlens, ssm_state_indices, out,
    )  # fmt: skip
    key = None
    if signature is not None and _on_gpu(q) and _recurrent_layout(*call):
        args = _recurrent_arguments(*call)
        key = _recurrent_key(args)
        plan = _RECURRENT_PLANS.get(key)
        if plan is not None:  # a kind planned already (the warm-up's)
            _RECURRENT_SIGNATURES[signature] = plan
            pointers = (a.data_ptr() if torch.is_tensor(a) else a for a in args)
            plan.run(
                decodes * plan.programs_per_sequence, 1, 1,
                _current_stream(key[0]), plan.function, plan.packed_metadata,
                None, None, None, *pointers,
            )  # fmt: skip
            return
    RECURRENT_STATS["vendored_calls"] += 1
    vendored(
        q=call[0], k=call[1], v=call[2], raw_g=call[3], raw_beta=call[4],
        A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
        initial_state=initial_state, cu_seqlens=call[9],
        ssm_state_indices=call[10], out=call[11],
    )  # fmt: skip
    if key is not None:
        plan = _plan_recurrent(args)
        if plan is not None:
            _RECURRENT_PLANS[key] = _RECURRENT_SIGNATURES[signature] = plan
            RECURRENT_STATS["plans_made"] += 1
