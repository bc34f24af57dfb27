"""The float64 reference of one mixed batch, computed chunk by chunk for
every sequence at once: what gpu_reference.py checks the kernels against on
the lent GPU (issue 28 item 2), fast enough for thousands of batches.

The same results as ``k3rocm.smoke.kda_reference.mixed_batch_reference``
(the token loop, from the recurrence's definition) by another route: within
a chunk of C tokens the state after token i is

    S_i = S_0 * exp(G_i) + sum_{j <= i} outer(u_j, k_j * exp(G_i - G_j))

(``G_i`` the running sum of the log decays, per key channel), and the
deltas ``u`` solve a unit lower-triangular system (kda_recurrence's
``kda_sequence_chunked`` derives it). Every S_i is formed, so the outputs
(``S_i @ (scale * q_i)``) and the peak (the largest state row norm and |v|
met, which sizes the tolerance) are those of the token loop. Sequences of
one token take kda_recurrence's own ``kda_step``; longer ones are stepped
through their chunks in lockstep, each chunk padded with tokens that
change nothing (no decay, zero key, value and beta). Pure PyTorch, any
device; tests/benchmarks/test_reference_chunked.py checks it against the token loop
on the CPU.
"""

import torch

from k3rocm.smoke import kda_recurrence

F64 = torch.float64


def _take(x: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Rows [a, C] of ``x`` [T, H, ...] as [a, H, C, ...], padding tokens
    zero."""
    picked = x[rows] * valid.view(*valid.shape, *([1] * (x.dim() - 1)))
    return picked.transpose(1, 2)


def batch_reference(
    q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound, pool, slots, has_init,
    lens: list[int], decodes: int, chunk: int = kda_recurrence.CHUNK_SIZE,
) -> dict:  # fmt: skip
    """(``out`` [1, T, H, V] and ``pool`` after the step, float64; ``peak``;
    ``longest_prefill``) for a batch of sequences of ``lens`` tokens in
    order (the first ``decodes`` of them decodes), inputs as the layer hands
    the kernels (q/k/v/raw_g [1, T, H, K], raw_beta [1, T, H]), each
    sequence's state in ``pool[slots[n]]`` (zeros where not has_init)."""
    device = q.device
    _, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5
    qn, kn = kda_recurrence.l2norm(q[0]), kda_recurrence.l2norm(k[0])
    v64 = v[0].to(F64)
    gate = kda_recurrence.kda_gate(raw_g[0], A_log, dt_bias, lower_bound)
    beta = torch.sigmoid(raw_beta[0].to(F64))
    pool64 = pool.to(F64)
    slots = slots.long()
    initial = pool64[slots].clone()
    initial[~has_init] = 0.0
    final = initial.clone()
    out = torch.zeros(1, T, H, V, dtype=F64, device=device)
    peaks = [torch.linalg.vector_norm(initial, dim=-1).amax()] if len(lens) else []
    if T:
        peaks.append(v64.abs().amax())
    starts = [sum(lens[:n]) for n in range(len(lens))]

    ones = [n for n, length in enumerate(lens) if length == 1]
    if ones:
        rows = torch.tensor([starts[n] for n in ones], device=device)
        index = torch.tensor(ones, device=device)
        a = len(ones)
        o, new = kda_recurrence.kda_step(
            initial[index].reshape(a * H, V, K), qn[rows].reshape(a * H, K),
            kn[rows].reshape(a * H, K), v64[rows].reshape(a * H, V),
            gate[rows].reshape(a * H, K), beta[rows].reshape(a * H), scale,
        )  # fmt: skip
        final[index] = new.reshape(a, H, V, K)
        out[0, rows] = o.reshape(a, H, V)
        peaks.append(torch.linalg.vector_norm(new, dim=-1).amax())

    longer = sorted(
        (n for n, length in enumerate(lens) if length > 1), key=lambda n: -lens[n]
    )
    S = initial[longer] if longer else None  # [a, H, V, K]
    chunks = -(-lens[longer[0]] // chunk) if longer else 0
    offsets = torch.arange(chunk, device=device)
    causal = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=device))
    strict = causal & ~torch.eye(chunk, dtype=torch.bool, device=device)
    eye = torch.eye(chunk, dtype=F64, device=device)
    for c in range(chunks):
        while longer and lens[longer[-1]] <= c * chunk:
            final[longer[-1]] = S[-1]
            longer, S = longer[:-1], S[:-1]
        a = len(longer)
        first = torch.tensor([starts[n] + c * chunk for n in longer], device=device)
        left = torch.tensor([lens[n] - c * chunk for n in longer], device=device)
        valid = offsets[None, :] < left[:, None]  # [a, C]
        rows = torch.where(valid, first[:, None] + offsets[None, :], 0)

        qc, kc, vc, gc, bc = (_take(x, rows, valid) for x in (qn, kn, v64, gate, beta))
        G = gc.cumsum(2)  # [a, H, C, K]
        # exp(G_i - G_j) for j <= i only: the others would be exp of sums
        # of positive numbers, masked to zero before they can overflow.
        diff = G[:, :, :, None, :] - G[:, :, None, :, :]
        decay = torch.where(causal[:, :, None], diff, -torch.inf).exp()
        A = torch.einsum("ahic,ahjc,ahijc->ahij", kc, kc, decay) * strict
        system = eye + bc[..., None] * A
        rhs = bc[..., None] * (vc - torch.einsum("ahvk,ahik->ahiv", S, kc * G.exp()))
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        states = S[:, :, None] * G.exp()[:, :, :, None, :] + torch.einsum(
            "ahjv,ahijk->ahivk", u, kc[:, :, None] * decay
        )  # [a, H, C, V, K]: the state after each token of the chunk
        o = torch.einsum("ahivk,ahik->ahiv", states, scale * qc)
        out[0, rows[valid]] = o.transpose(1, 2)[valid]
        peaks.append(torch.linalg.vector_norm(states, dim=-1).amax())
        S = states[:, :, -1]  # padding tokens keep the last token's state
    for n, state in zip(longer, S if S is not None else [], strict=True):
        final[n] = state
    pool_after = pool64.clone()
    pool_after[slots] = final
    return {
        "out": out,
        "pool": pool_after,
        "peak": float(torch.stack(peaks).max()) if peaks else 0.0,
        "longest_prefill": max(lens[decodes:], default=0),
    }
