"""An independent float64 reference of what vLLM's Kimi KDA ops compute.

Written from the definition of Kimi Delta Attention (a gated delta rule with
one decay per key channel), not from vLLM's kernels; only the interfaces and
the fused gate's formula come from vLLM 0.27.1 (the wrappers and kernels in
``vllm/models/kimi_k3/amd/ops/third_party/kda/{chunk,fused_recurrent}.py``,
``vllm/third_party/flash_linear_attention/ops/l2norm.py`` and the layer
``vllm/model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py``). Plain
PyTorch: no vLLM, no pytest, any device (computes in float64).

The recurrence, per head, state ``S`` of shape [V, K] (``S[v, k]``, the
layout of vLLM's state pool ``[slots, H, V, K]``), one token at a time::

    a      = exp(g_t)                     # decay per key channel, in (0, 1]
    S      = S * a[None, :]               # decay, column k by a[k]
    u      = beta_t * (v_t - S @ k_t)     # delta rule: correct the prediction
    S      = S + outer(u, k_t)
    o_t    = S @ (scale * q_t)            # read with the updated state

with ``q_t, k_t`` L2-normalized when asked (``x / sqrt(sum(x**2) + 1e-6)``,
eps 1e-6 inside the root: ``l2norm_fwd``'s default for the chunk path, the
literal in the recurrent kernels), ``scale`` ``K ** -0.5`` unless given,
``beta_t = sigmoid(raw_beta_t)`` (both paths apply the sigmoid themselves:
the chunk gate kernel stores ``sigmoid(raw_beta)``, the recurrent kernel
runs with ``APPLY_BETA_SIGMOID`` when the layer calls it), and the gate
``g_t = kda_gate(raw_g_t, A_log, dt_bias, lower_bound)`` (see there).

Tolerances: ``tolerance`` below, with the derivation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

F64 = torch.float64
L2NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0
CHUNK_SIZE = 64


# ---------------------------------------------------------------- pieces


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """x / sqrt(sum(x**2) + eps) over the last dimension, in float64."""
    x = x.to(F64)
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def kda_gate(
    raw_g: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor | None,
    lower_bound: float | None,
) -> torch.Tensor:
    """The fused KDA gate: log decay ``g`` (<= 0) per token, head and key
    channel, from ``raw_g`` [..., H, K], ``A_log`` [H] and ``dt_bias``
    (``g_bias`` in the chunk API) [H * K] or None.

    With ``x = raw_g + dt_bias`` and ``A = exp(A_log)`` (per head):

    - ``lower_bound`` set (the "safe gate", Kimi-K3's ``gate_lower_bound``,
      in [-5, 0)): ``g = lower_bound * sigmoid(A * x)``, so ``g`` lies in
      (lower_bound, 0): A scales the argument of the sigmoid;
    - ``lower_bound`` None: ``g = -A * softplus(x)`` with softplus's beta 1
      and threshold 20 (``x`` itself where ``x > 20``), so ``g`` lies in
      (-inf, 0): A scales the result.
    """
    *_, H, K = raw_g.shape
    x = raw_g.to(F64)
    if dt_bias is not None:
        x = x + dt_bias.to(F64).reshape(H, K)
    A = torch.exp(A_log.to(F64).reshape(H, 1))
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(A * x)
    softplus = torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log1p(torch.exp(x)))
    return -A * softplus


def kda_step(
    S: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token, all heads: S [H, V, K], q/k/g [H, K], v [H, V], beta [H]
    (q and k as the recurrence uses them: normalized already). Returns
    (o [H, V], the new S)."""
    S = S * torch.exp(g)[:, None, :]
    u = beta[:, None] * (v - torch.einsum("hvk,hk->hv", S, k))
    S = S + u[:, :, None] * k[:, None, :]
    return torch.einsum("hvk,hk->hv", S, scale * q), S


def kda_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    scale: float,
    peak: list[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence token by token: q/k/g [T, H, K] (q, k normalized
    already, g the log decay), v [T, H, V], beta [T, H] (after the sigmoid),
    state [H, V, K] or None (zeros). Returns (o [T, H, V], final state
    [H, V, K]), float64; T may be 0 (o empty, the state unchanged). With
    ``peak`` (a list), appends the largest norm met (``_peak``)."""
    T, H, K = k.shape
    V = v.shape[-1]
    S = _state(state, H, V, K, k.device)
    q, k, v, g, beta = (x.to(F64) for x in (q, k, v, g, beta))
    out = torch.empty(T, H, V, dtype=F64, device=k.device)
    largest = _peak(S, None)
    for t in range(T):
        out[t], S = kda_step(S, q[t], k[t], v[t], g[t], beta[t], scale)
        largest = max(largest, _peak(S, v[t]))
    if peak is not None:
        peak.append(largest)
    return out, S


def _peak(S: torch.Tensor, v: torch.Tensor | None) -> float:
    """The largest 2-norm of a row S[h, v, :] of the state [H, V, K] and the
    largest |v[h, v]| (row v of the state only ever meets element v of the
    values: the recurrence acts on each row alone)."""
    norm = float(torch.linalg.vector_norm(S, dim=-1).max()) if S.numel() else 0.0
    if v is not None and v.numel():
        norm = max(norm, float(v.abs().max()))
    return norm


def kda_sequence_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    scale: float,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``kda_sequence`` evaluated chunk by chunk in closed form (the same
    arguments and results), to check the token loop by another route.

    Within a chunk, with ``G_i`` the running sum of the log decays up to
    token i and ``S0`` the state before the chunk, the state after token i
    is ``S0 * exp(G_i) + sum_{j<=i} outer(u_j, k_j * exp(G_i - G_j))``,
    so the deltas ``u`` solve the unit lower-triangular system
    ``u_i + beta_i * sum_{j<i} A_ij u_j = beta_i * (v_i - S0 @ (k_i *
    exp(G_i)))`` with ``A_ij = sum_c k_i[c] k_j[c] exp(G_i[c] - G_j[c])``."""
    T, H, K = k.shape
    V = v.shape[-1]
    S = _state(state, H, V, K, k.device)
    q, k, v, g, beta = (x.to(F64) for x in (q, k, v, g, beta))
    out = torch.empty(T, H, V, dtype=F64, device=k.device)
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        n = end - start
        # [H, n, K] / [H, n, V] / [H, n]
        qc, kc, gc = (x[start:end].transpose(0, 1) for x in (q, k, g))
        vc, bc = v[start:end].transpose(0, 1), beta[start:end].transpose(0, 1)
        G = gc.cumsum(1)
        diff = G[:, :, None, :] - G[:, None, :, :]  # [H, i, j, K]: G_i - G_j
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=k.device))
        decay = torch.where(causal[None, :, :, None], torch.exp(diff), 0.0)
        A = torch.einsum("hic,hjc,hijc->hij", kc, kc, decay)
        A = A * (~torch.eye(n, dtype=torch.bool, device=k.device))
        system = torch.eye(n, dtype=F64, device=k.device) + bc[:, :, None] * A
        rhs = bc[:, :, None] * (vc - torch.einsum("hvk,hik->hiv", S, kc * G.exp()))
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        read = torch.einsum("hic,hjc,hijc->hij", qc, kc, decay)  # inclusive j <= i
        oc = torch.einsum("hvk,hik->hiv", S, qc * G.exp()) + read @ u
        out[start:end] = (scale * oc).transpose(0, 1)
        last = G[:, -1:, :]
        S = S * last.exp() + torch.einsum("hjv,hjk->hvk", u, kc * (last - G).exp())
    return out, S


def _state(state, H, V, K, device) -> torch.Tensor:
    if state is None:
        return torch.zeros(H, V, K, dtype=F64, device=device)
    if tuple(state.shape) != (H, V, K):
        raise ValueError(f"state shape {tuple(state.shape)}, expected {(H, V, K)}")
    return state.to(F64)


def _bounds(cu_seqlens: torch.Tensor | Sequence[int]) -> list[tuple[int, int]]:
    cu = [int(x) for x in cu_seqlens]
    if cu[0] != 0 or any(b < a for a, b in itertools.pairwise(cu)):
        raise ValueError(f"cu_seqlens {cu} must start at 0 and never decrease")
    return list(itertools.pairwise(cu))


# ------------------------------------------------------------- the ops


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


# ------------------------------------------------------------ tolerance

# How the bound is built (first-order rounding error analysis; u is a
# format's unit roundoff: bfloat16 2^-8, float16 2^-11, float32 2^-24).
#
# The reference is exact for our purposes (float64, 2^-53) and reads the
# very values the kernel reads (bf16 inputs convert to float64 exactly), so
# input rounding is no error source; what differs is every later rounding:
#
# - storing in the input dtype: the output, and on the chunk path the
#   normalized q/k (l2norm_fwd writes the input dtype), Aqk/Akk, w, u, kg,
#   the per-chunk states h and v_new. One store errs by at most u where
#   casts round to nearest even (compiled Triton) and by less than 2u where
#   they truncate (the Triton interpreter's plain casts: ``truncating``).
#   The recurrent path keeps everything but the output in fp32 registers
#   and an fp32 state pool.
# - fp32 arithmetic: dot products of length n <= 128 (K <= 64 channels, a
#   64-token chunk): n * u32 worst case, sqrt(n) * u32 for independent
#   rounding errors, so eps_arith = sqrt(128) * 2^-24.
#
# Sizes: |q^| <= 1 and |k^| <= 1 (x / sqrt(|x|^2 + 1e-6)), beta in (0, 1),
# decay a = exp(g) in (0, 1]. One token maps each row s of the state (row v
# meets only element v of the values) by s -> s D (I - beta k k^T) +
# beta v[v] k^T, and s -> s D (I - beta k k^T) is non-expansive (|D| <= 1;
# I - beta k k^T has eigenvalues 1 and 1 - beta in (0, 1)), so
# |s_t| <= |s_0| + sum |v[v]|, and an error made at one token is never
# amplified by later ones: errors add. Every rounded quantity of a row is a
# product of factors bounded by 1 with a state row or a value, so at most
# ``peak`` (the largest |S_t[h, v, :]|_2 and |v_t[h, v]| the reference
# meets). A token's
# path through the kernels crosses about 8 rounded quantities (q^, k^ twice,
# A, w or u, kg, h, v_new); over m tokens the errors of the state add up to
# m * 8 * eps * peak in the worst case and to about sqrt(m) * 8 * eps * peak
# for independent roundings (probabilistic rounding error analysis, Higham
# and Mary 2019): we use lam = 8 for the count and take the sqrt(m) growth.
# The output reads the state through scale * q^: its error is its own store
# (relative) plus scale times the state's.
#
# So, for a sequence of at most m tokens:
#   |o - o_ref| <= out_rel * |o_ref row|_inf + out_abs   (per token and head)
#   |S - S_ref| <= state_abs                              (every element)
# with r = u_dtype (2 u_dtype truncating), eps = r + eps_arith on the chunk
# path and eps_arith on the recurrent path, out_rel = r + eps_arith,
# out_abs = lam * eps * sqrt(m + 1) * scale * peak and state_abs = lam * eps
# * sqrt(m + 1) * peak. Float32 inputs: eps ~ 7e-7, bounds ~1e-4 of the
# output's size (the interpreter's errors are ~100x below). bf16 on the
# chunk path (GPU only: the interpreter has no bf16 arithmetic): for m = 65,
# out_abs = 0.25 * scale * peak, a worst-case-leaning bound of the order
# of the outputs themselves; it still catches O(|o|) errors (a wrong gate,
# a lost or transposed state, a NaN) but not subtle ones, so a GPU check
# should report the measured ratio beside the verdict. Measured on the lent
# H200 (vLLM 0.27.1's chunk path as patched, head size 128, 2 heads,
# lengths 1 to 1,000 with empty sequences, both gates, caching allocator
# poisoned with NaN): largest output error 2.6e-4 to 7.2e-4 (outputs up to
# 0.18), 0.0003 to 0.009 of this bound, state errors 0.0002 to 0.005 of
# it; normwise ||o - o_ref|| / ||o_ref|| 3.3e-3 to 4.4e-3, i.e. 0.85 to
# 1.13 u. The errors did not grow with m there (the gates forget), the
# bound's sqrt(m) does.

UNIT_ROUNDOFF = {
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
    torch.float32: 2.0**-24,
}
EPS_ARITH = math.sqrt(128) * 2.0**-24
LAMBDA = 8.0
PATHS = ("chunk", "recurrent")


@dataclass(frozen=True)
class Tolerance:
    out_rel: float
    out_abs: float
    state_abs: float


def tolerance(
    dtype: torch.dtype,
    path: str,
    *,
    scale: float,
    peak: float,
    max_len: int,
    truncating: bool = False,
) -> Tolerance:
    """The bound above for inputs of ``dtype`` (q/k/v and the output; the
    states are float32) on ``path`` ('chunk' or 'recurrent'), with the
    reference's ``peak`` (see ``kda_sequence``), the longest sequence's
    length ``max_len``, and ``truncating`` casts (the Triton interpreter)."""
    if path not in PATHS:
        raise ValueError(f"path {path!r}, expected one of {PATHS}")
    store = UNIT_ROUNDOFF[dtype] * (2 if truncating else 1)
    eps = EPS_ARITH + (store if path == "chunk" else 0.0)
    state_abs = LAMBDA * eps * math.sqrt(max_len + 1) * peak
    return Tolerance(store + EPS_ARITH, state_abs * scale, state_abs)


def excess(
    out: torch.Tensor,
    out_ref: torch.Tensor,
    tol: Tolerance,
    state: torch.Tensor | None = None,
    state_ref: torch.Tensor | None = None,
) -> dict[str, float]:
    """How far a kernel's results are from the reference, in units of the
    tolerance: {'out': ..., 'state': ...}, each the largest error over its
    allowed error (<= 1 passes; NaN or inf where expected is finite gives
    inf). Rows of ``out_ref`` that are NaN (left unwritten by the kernel)
    are skipped. Outputs are [..., V] rows (token and head)."""
    out_ref = out_ref.to(F64)
    written = ~torch.isnan(out_ref).any(-1)
    error = (out.to(F64) - out_ref).abs().amax(-1)
    allowed = tol.out_rel * out_ref.abs().amax(-1) + tol.out_abs
    result = {"out": _worst(error[written], allowed[written])}
    if state is not None:
        state_error = (state.to(F64) - state_ref.to(F64)).abs()
        result["state"] = _worst(
            state_error, torch.full_like(state_error, tol.state_abs)
        )
    return result


def _worst(error: torch.Tensor, allowed: torch.Tensor) -> float:
    if error.numel() == 0:
        return 0.0
    error = torch.where(torch.isfinite(error), error, math.inf)
    return float((error / allowed).max())
