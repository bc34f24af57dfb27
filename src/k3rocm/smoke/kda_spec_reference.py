"""The float64 reference of one speculative-decoding step of the Kimi KDA
layer, from the recurrence's definition (``kda_reference``), not from
vLLM's kernels.

With speculative decoding a request's Mamba block-table row holds
``1 + num_speculative_tokens`` state slots. A spec-verify step runs a
request's ``1 + d`` tokens (its last accepted token and ``d`` draft tokens)
and the layer:

- starts the request from the state in column ``num_accepted - 1`` of its
  row: the state after the last token the previous step's verification
  accepted (the previous step wrote one state per token);
- writes the state after its token ``i`` to column ``i``, so that the next
  step can start from whichever token is accepted.

``kda_reference.recurrent_kda_reference`` computes exactly that for a
[N, 1 + K] index table with ``num_accepted_tokens``. A step may also carry
non-spec requests (plain decodes, which vLLM 0.27.1's builder then counts as
prefills, and prefills), in vLLM's token order; ``spec_step_reference``
splits the tokens as the layer does, runs both parts from the same pool
(their slots are disjoint) and puts every output back in its row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k3rocm.smoke.kda_recurrence import F64
from k3rocm.smoke.kda_reference import mixed_batch_reference, recurrent_kda_reference


@dataclass(frozen=True)
class SpecStep:
    """Where a step's tokens and slots are, as vLLM's GDN metadata says it
    (``GDNAttentionMetadata`` field names, trimmed to the real requests)."""

    spec_token_indx: torch.Tensor  # [spec tokens] rows of the step
    spec_query_start_loc: torch.Tensor  # [num_spec_decodes + 1]
    spec_state_indices: torch.Tensor  # [num_spec_decodes, 1 + K]
    num_accepted_tokens: torch.Tensor  # [num_spec_decodes], 1..1 + K
    non_spec_token_indx: torch.Tensor | None = None
    non_spec_query_start_loc: torch.Tensor | None = None
    non_spec_state_indices: torch.Tensor | None = None
    has_initial_state: torch.Tensor | None = None  # None: all decodes continue
    non_spec_decodes: int = 0  # leading one-token non-spec requests (peeled)


def _rows(x: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    return x.index_select(dim, index.long())


def spec_step_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    raw_g: torch.Tensor,
    raw_beta: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor | None,
    lower_bound: float | None,
    state_pool: torch.Tensor,
    step: SpecStep,
    *,
    peak: list[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Core attention of one step with spec decodes: raw post-convolution
    q/k/v [1, T, H, K|V], raw_g [1, T, H, K], raw_beta [1, T, H], the pool
    [slots, H, V, K]. Returns (o [1, T, H, V], the pool after the step),
    float64; rows no request owns are NaN."""
    out = torch.full(v.shape, float("nan"), dtype=F64, device=v.device)
    pool = state_pool.to(F64).clone()
    per_token = (q, k, v, raw_g, raw_beta)
    spec = [_rows(x, step.spec_token_indx, 1) for x in per_token]
    o, pool = recurrent_kda_reference(
        *spec, A_log, dt_bias, lower_bound, pool, step.spec_query_start_loc,
        step.spec_state_indices, step.num_accepted_tokens, peak=peak,
    )  # fmt: skip
    out[:, step.spec_token_indx.long()] = o
    index = step.non_spec_token_indx
    if index is None or index.numel() == 0:
        return out, pool
    rest = [_rows(x, index, 1) for x in per_token]
    cu = step.non_spec_query_start_loc
    lens = (cu[1:] - cu[:-1]).tolist()
    if all(n == 1 for n in lens) and step.has_initial_state is None:
        o, pool = recurrent_kda_reference(
            *rest, A_log, dt_bias, lower_bound, pool, cu, step.non_spec_state_indices,
            peak=peak,
        )  # fmt: skip
    else:
        has_initial = step.has_initial_state
        if has_initial is None:
            has_initial = torch.ones(len(lens), dtype=torch.bool)
        o, pool = mixed_batch_reference(
            *rest, A_log, dt_bias, lower_bound, pool, step.non_spec_state_indices,
            has_initial, cu, step.non_spec_decodes, peak=peak,
        )  # fmt: skip
    out[:, index.long()] = o
    return out, pool


def step_of(metadata) -> SpecStep:
    """The ``SpecStep`` of a ``GDNAttentionMetadata`` with spec decodes,
    trimmed to its real requests (full-graph metadata pads them)."""
    n = int(metadata.num_spec_decodes)
    spec_tokens = int(metadata.num_spec_decode_tokens)
    token_indx = metadata.spec_token_indx
    if token_indx is None or (metadata.num_prefills == 0 and metadata.num_decodes == 0):
        token_indx = torch.arange(spec_tokens)
    non_spec = metadata.non_spec_token_indx
    if metadata.num_prefills == 0 and metadata.num_decodes == 0:
        non_spec = None
    return SpecStep(
        spec_token_indx=token_indx[:spec_tokens],
        spec_query_start_loc=metadata.spec_query_start_loc[: n + 1],
        spec_state_indices=metadata.spec_state_indices_tensor[:n],
        num_accepted_tokens=metadata.num_accepted_tokens[:n],
        non_spec_token_indx=non_spec,
        non_spec_query_start_loc=metadata.non_spec_query_start_loc,
        non_spec_state_indices=metadata.non_spec_state_indices_tensor,
        has_initial_state=metadata.has_initial_state,
        non_spec_decodes=int(metadata.num_decodes),
    )
