"""An independent float64 reference of what vLLM's Kimi KDA ops compute.

Written from the definition of Kimi Delta Attention (a gated delta rule with
one decay per key channel), not from vLLM's kernels; only the interfaces and
the fused gate's formula come from vLLM 0.27.1 (the wrappers and kernels in
``vllm/models/kimi_k3/amd/ops/third_party/kda/{chunk,fused_recurrent}.py``,
``vllm/third_party/flash_linear_attention/ops/l2norm.py`` and the layer
``vllm/model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py``). Plain
PyTorch: no vLLM, no pytest, any device (computes in float64).

The ops here run the recurrence (``kda_recurrence``) over vLLM's
sequences and state slots, as ``chunk_kda_with_fused_gate``,
``fused_recurrent_kda`` and one non-spec step of the layer do. How far a
kernel may be from them: ``kda_tolerance``, with the derivation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from k3rocm.smoke.kda_recurrence import (
    F64,
    _peak,
    kda_gate,
    kda_sequence,
    kda_step,
    l2norm,
)


def _bounds(cu_seqlens: torch.Tensor | Sequence[int]) -> list[tuple[int, int]]:
    cu = [int(x) for x in cu_seqlens]
    if cu[0] != 0 or any(b < a for a, b in itertools.pairwise(cu)):
        raise ValueError(f"cu_seqlens {cu} must start at 0 and never decrease")
    return list(itertools.pairwise(cu))


def chunk_kda_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    raw_g: torch.Tensor,
    raw_beta: torch.Tensor,
    A_log: torch.Tensor,
    g_bias: torch.Tensor | None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    lower_bound: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_indices: torch.Tensor | None = None,
    chunk_offsets: torch.Tensor | None = None,
    *,
    peak: list[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What ``chunk_kda_with_fused_gate`` returns, same arguments: q/k/raw_g
    [1, T, H, K], v [1, T, H, V], raw_beta [1, T, H], A_log [H], g_bias
    [H * K] or None, initial_state [N, H, V, K] or None (zeros), N the
    number of sequences in ``cu_seqlens`` (or one per batch row without
    it). Returns (o [1, T, H, V], final states [N, H, V, K] or None),
    float64. A zero-length sequence's final state is its initial state.
    ``chunk_indices``/``chunk_offsets`` describe ``cu_seqlens`` and change
    nothing here. ``peak``: see ``kda_sequence``."""
    del chunk_indices, chunk_offsets
    B, T, H, K = k.shape
    V = v.shape[-1]
    if scale is None:
        scale = K**-0.5
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    g = kda_gate(raw_g, A_log, g_bias, lower_bound)
    beta = torch.sigmoid(raw_beta.to(F64))
    if cu_seqlens is None:
        rows = [(b, 0, T) for b in range(B)]
    else:
        if B != 1:
            raise ValueError("cu_seqlens needs a batch of 1")
        rows = [(0, bos, eos) for bos, eos in _bounds(cu_seqlens)]
        if rows and rows[-1][2] != T:
            raise ValueError(f"cu_seqlens end at {rows[-1][2]}, inputs have {T}")
    out = torch.zeros(B, T, H, V, dtype=F64, device=k.device)
    finals = []
    for n, (b, bos, eos) in enumerate(rows):
        state = None if initial_state is None else initial_state[n]
        o, S = kda_sequence(
            q[b, bos:eos], k[b, bos:eos], v[b, bos:eos], g[b, bos:eos],
            beta[b, bos:eos], state, scale, peak,
        )  # fmt: skip
        out[b, bos:eos] = o
        finals.append(S)
    final = torch.stack(finals) if output_final_state and finals else None
    return out, final


def recurrent_kda_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    raw_g: torch.Tensor,
    raw_beta: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor | None,
    lower_bound: float | None,
    initial_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    ssm_state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor | None = None,
    *,
    peak: list[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``fused_recurrent_kda`` computes as the Kimi layer calls it
    (fused gate and beta sigmoid, q/k L2-normalized in the kernel, scale
    ``K ** -0.5``), with the same arguments: raw (post-convolution) q/k/v,
    ``initial_state`` the state pool [slots, H, V, K], ``ssm_state_indices``
    [N] (plain decodes: one token per sequence) or [N, max_query_len]
    (spec decode, with ``num_accepted_tokens`` [N]).

    Sequence n starts from slot ``idx[n, num_accepted[n] - 1]`` (``idx[n]``
    for plain decodes); where that slot is <= 0 (vLLM's padding, slot 0
    included) its first output is 0, nothing else of it is written and the
    pool is untouched. Otherwise after its token i the state goes to slot
    ``idx[n, i]`` (``idx[n]``) when that is > 0.

    Returns (o [1, T, H, V], the pool after the call), float64; rows of o
    that the kernel leaves unwritten (a padded spec sequence's later
    tokens) are NaN. The pool is not modified (the kernel updates it in
    place). ``peak``: see ``kda_sequence``."""
    K = k.shape[-1]
    scale = K**-0.5
    q, k = l2norm(q), l2norm(k)
    g = kda_gate(raw_g, A_log, dt_bias, lower_bound)
    beta = torch.sigmoid(raw_beta.to(F64))
    pool = initial_state.to(F64).clone()
    out = torch.full(v.shape, math.nan, dtype=F64, device=k.device)
    spec = ssm_state_indices.ndim == 2
    for n, (bos, eos) in enumerate(_bounds(cu_seqlens)):
        if eos == bos:
            continue
        slots = ssm_state_indices[n].tolist() if spec else [int(ssm_state_indices[n])]
        first = int(num_accepted_tokens[n]) - 1 if spec else 0
        if slots[first] <= 0:
            out[0, bos] = 0.0
            continue
        S = pool[slots[first]]
        largest = _peak(S, None)
        for i, t in enumerate(range(bos, eos)):
            vt = v[0, t].to(F64)
            out[0, t], S = kda_step(S, q[0, t], k[0, t], vt, g[0, t], beta[0, t], scale)
            largest = max(largest, _peak(S, vt))
            slot = slots[i] if spec else slots[0]
            if slot > 0:
                pool[slot] = S
        if peak is not None:
            peak.append(largest)
    return out, pool


def mixed_batch_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    raw_g: torch.Tensor,
    raw_beta: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor | None,
    lower_bound: float | None,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    has_initial_state: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_decodes: int,
    *,
    peak: list[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The core attention of one non-spec step of the Kimi KDA layer, in
    vLLM's order (decodes first, then prefills, zero-length padding at the
    back): raw post-convolution q/k/v [1, T, H, K|V], raw_g [1, T, H, K],
    raw_beta [1, T, H], the pool [slots, H, V, K], ``state_indices`` [N],
    ``has_initial_state`` [N] bool, ``query_start_loc`` [N + 1].

    The first ``num_decodes`` sequences (one token each) are decodes:
    ``recurrent_kda_reference`` (state read from and written to their slot;
    slot <= 0 is padding: output 0, pool untouched). The rest are
    prefills, as the layer's chunk call treats them: they start from their
    slot's state where ``has_initial_state``, else from zeros, and their
    final state is written to their slot (``pool[idx] = final``, as the
    layer's index assignment does; a zero-length sequence writes its
    initial state).

    Returns (o [1, T, H, V], the pool after the step), float64. ``peak``:
    see ``kda_sequence``."""
    bounds = _bounds(query_start_loc)
    if any(eos - bos != 1 for bos, eos in bounds[:num_decodes]):
        raise ValueError("decodes are one token each and come first")
    split = bounds[num_decodes][0] if num_decodes < len(bounds) else bounds[-1][1]
    out = torch.zeros(*v.shape, dtype=F64, device=k.device)
    pool = state_pool.to(F64).clone()
    if num_decodes:
        o, pool = recurrent_kda_reference(
            q[:, :split], k[:, :split], v[:, :split], raw_g[:, :split],
            raw_beta[:, :split], A_log, dt_bias, lower_bound, pool,
            query_start_loc[: num_decodes + 1], state_indices[:num_decodes],
            peak=peak,
        )  # fmt: skip
        out[:, :split] = o
    prefill_slots = state_indices[num_decodes:].long()
    if len(prefill_slots):
        initial = pool[prefill_slots].clone()
        initial[~has_initial_state[num_decodes:].bool()] = 0.0
        cu = query_start_loc[num_decodes:] - split
        o, final = chunk_kda_reference(
            q[:, split:], k[:, split:], v[:, split:], raw_g[:, split:],
            raw_beta[:, split:], A_log, dt_bias, None, initial, True,
            lower_bound, True, cu, peak=peak,
        )  # fmt: skip
        out[:, split:] = o
        pool[prefill_slots] = final
    return out, pool
