"""Series k3.11's speculative recurrent warm-up (patch 0005,
``warm_up_spec_recurrent_kda``) on the lent GPU, default line, at K3_HEADS
heads a rank (default 12): does a dspark server still compile recurrent
binaries after it?

Two arms in one process, each starting with no recurrent binary in the
process: "none" (k3.10: serving calls straight away) and "k3.11" (the
builder's warm-up first, for two stand-in Kimi KDA layers, low-rank and
full-rank output gate, each with a state pool: gpu_kda_launch.StandInLayer,
whose raw_beta views are the layer's own split_projection's). Then CALLS
serving calls through vLLM 0.27.1's wrapper (``fused_recurrent_kda``, which
the layer's spec path calls), laid out as that path lays out its call
(kimi_gdn_linear_attn.py ``_forward``), written here from the layer's code,
not from the warm-up's: 1 to 128 spec requests of 2 to 8 tokens (dspark's
7 drafts), in a step of spec decodes only (q, k, v split from the
convolution update's output, raw_g the gate projection's rows, raw_beta
the fused projection's view, out core_attn_out's first rows of a padded
forward) or beside other requests (raw_g and raw_beta gathered with
index_select, out left to the wrapper). Counted: binaries the warm-up
compiled, new binaries while serving and at which calls; outputs finite.

    cd benchmarks && K3_HEADS=12 python3 gpu_spec_warm_up.py  # needs .gpu/

Writes $OUT/spec-warm-up.json.
"""

import os
import random
import time

import gpu_kda_launch as gkl  # loads the patched tree; the stand-in layers
import kda_harness
import torch
from kda_harness import HEAD_DIM, HEADS_PER_RANK, RunReport
from vllm.models.kimi_k3.amd.ops.third_party.kda import (
    fused_recurrent,
    kda_chunk_launch,
)

NUM_SPEC = 7  # dspark's draft tokens
MAX_NUM_SEQS = 128  # the recipe's --max-num-seqs
SLOTS = 2 * MAX_NUM_SEQS * (NUM_SPEC + 1) + 1
CALLS = int(os.environ.get("K3_SPEC_WARM_CALLS", 1500))
RECURRENT_JIT = kda_chunk_launch.unwrap(fused_recurrent.fused_recurrent_kda_fwd_kernel)[
    0
]


def serving_call(layer, pool, rng: random.Random) -> str:
    """One spec call of a random dspark step, as the layer's spec path makes
    it; returns its layout."""
    heads, dim = layer.local_num_heads, layer.head_dim
    local = heads * dim
    n = min(rng.choice([1, 2, 4, 8, rng.randint(1, MAX_NUM_SEQS)]), MAX_NUM_SEQS)
    lengths = [rng.randint(2, NUM_SPEC + 1) for _ in range(n)]
    tokens = sum(lengths)
    lone = rng.random() < 0.6
    padded = tokens + rng.choice([0, 1, 7])  # the forward's token padding

    def rows(count, width):
        return torch.randn(count, width, device="cuda").to(torch.bfloat16)

    projected = rows(padded, layer.in_proj_qkvgfab.output_size_per_partition)
    beta = layer.split_projection(projected)[3].unsqueeze(0)[:, :tokens]
    g1 = rows(padded, local).view(1, padded, heads, dim)[:, :tokens]
    conv_out = rows(tokens, 3 * local)  # the convolution update's own output
    q, k, v = (x.view(1, tokens, heads, dim) for x in conv_out.split(local, dim=-1))
    cu = torch.zeros(n + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    indices = torch.randint(1, pool.shape[0], (n, NUM_SPEC + 1), device="cuda").int()
    accepted = torch.tensor([rng.randint(1, m) for m in lengths], dtype=torch.int32)
    if lone:
        core_attn_out = torch.empty(
            1, padded, heads, dim, dtype=torch.bfloat16, device="cuda"
        )
        out = core_attn_out[:, :tokens]
    else:  # beside others: the spec tokens gathered out of the step's
        index = torch.arange(tokens, device="cuda")
        g1, beta = g1.index_select(1, index), beta.index_select(1, index)
        out = None
    result, _ = fused_recurrent.fused_recurrent_kda(
        q=q, k=k, v=v, raw_g=g1, raw_beta=beta, A_log=layer.A_log,
        dt_bias=layer.dt_bias, lower_bound=layer.gate_lower_bound,
        initial_state=pool, cu_seqlens=cu.cuda(), ssm_state_indices=indices,
        num_accepted_tokens=accepted.cuda(), out=out,
    )  # fmt: skip
    assert torch.isfinite(result).all()
    return "speculative step" if lone else "beside others"


def arm(warm: str, pools, seed: int) -> dict:
    rng = random.Random(seed)
    kda_harness.forget_binaries(RECURRENT_JIT)
    row = {"warm-up": warm}
    if warm == "k3.11":
        start = time.perf_counter()
        done = kda_chunk_launch.warm_up_spec_recurrent_kda(gkl.LAYERS, pools, NUM_SPEC)
        torch.cuda.synchronize()
        row.update(
            kinds=done.kinds,
            layers=done.layers,
            seconds=round(time.perf_counter() - start, 2),
        )
    before = last = kda_harness.binaries(RECURRENT_JIT)
    row["binaries after warm-up"] = before
    new_at, layouts = [], {}
    for i in range(CALLS):
        layer = rng.randrange(len(gkl.LAYERS))
        layout = serving_call(gkl.LAYERS[layer], pools[layer], rng)
        layouts[layout] = layouts.get(layout, 0) + 1
        if kda_harness.binaries(RECURRENT_JIT) != last:
            new_at.append(i)
            last = kda_harness.binaries(RECURRENT_JIT)
    row.update(
        {
            "serving calls": CALLS,
            "calls by layout": layouts,
            "new binaries while serving": last - before,
            "at calls": new_at,
        }
    )
    return row


def main() -> None:
    report = RunReport(
        "spec-warm-up.json",
        heads=HEADS_PER_RANK,
        num_speculative_tokens=NUM_SPEC,
        max_num_seqs=MAX_NUM_SEQS,
        arms=[],
    )
    pools = [
        torch.randn(SLOTS, HEADS_PER_RANK, HEAD_DIM, HEAD_DIM, device="cuda") * 0.1
        for _ in gkl.LAYERS
    ]
    for warm in ("none", "k3.11"):
        row = arm(warm, pools, seed=HEADS_PER_RANK)
        report["arms"].append(row)
        report.save()
        print(row, flush=True)


if __name__ == "__main__":
    main()
