"""The KDA recurrence in float64, the ground the reference (``kda_reference``)
stands on: the fused gate, the L2 norm, one token, one sequence token by
token, and the same sequence chunk by chunk in closed form (another route
to the same results, to check the token loop). Plain PyTorch: no vLLM, no
pytest, any device.

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
"""

from __future__ import annotations

import torch

F64 = torch.float64
L2NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0
CHUNK_SIZE = 64


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
