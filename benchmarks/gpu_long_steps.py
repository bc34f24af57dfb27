"""One chunk KDA call past 2**31-element offsets, issue 38 item 1 (H200).

Each case is one step of TOKENS tokens at HEADS KDA heads a rank (head size
128): half of it one long sequence, the rest sequences of 1 to 8,192
tokens. The step runs as one chunk KDA call, and the same sequences (their
own copies of the inputs: the kernels write into v) run again in calls of
at most 16,384 tokens; every sequence's output and final state of the one
call must agree with the smaller calls'. On the patched tree the one call
runs twice through the series' entry with its device metadata: first
through vLLM's dispatcher (the first call of a kind), then through the
precompiled launches of patch 0005. An illegal memory access kills the CUDA
context, so each case runs in a process of its own:

    python3 benchmarks/gpu_long_steps.py            # all cases, JSON lines
    python3 benchmarks/gpu_long_steps.py patched 96 104000   # one case

needs .gpu/ (gpu_bundle.py): "patched" is series k3.7 with patch 0012,
"pristine" vLLM 0.27.1's own kernels; with K3_LINE=0.32.0 the 0.32.0
line's bundle: its series (patch 0003) and 0.32.0's own kernels, through
vLLM's dispatcher only (that series has no precompiled launches).
"""

import json
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (heads a rank, tokens in the step): dep16's 96 heads and TP8's 12, both at
# 9,984,000 token-heads, past the 8,388,608 where 0.27.1's chunk-state
# offset (i_tg * H + i_h) * K * V wraps.
CASES = [(96, 104_000), (12, 832_000)]
SMALL_CALL_TOKENS = 16_384
TOLERANCE = 2e-3  # relative norm; the calls differ only in autotuned tiling


def step_lengths(tokens: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    lengths = [tokens // 2]
    while sum(lengths) < tokens:
        lengths.append(min(rng.randint(1, 8192), tokens - sum(lengths)))
    return lengths


def small_groups(lengths: list[int]) -> list[list[int]]:
    """Consecutive sequence indices in calls of at most SMALL_CALL_TOKENS
    (a longer sequence alone)."""
    groups, current, size = [], [], 0
    for i, n in enumerate(lengths):
        if current and size + n > SMALL_CALL_TOKENS:
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += n
    return [*groups, current]


def run_case(tree: str, heads: int, tokens: int) -> dict:
    import torch

    sys.path.insert(0, str(HERE))
    from kda_harness import cu_seqlens, kda_inputs, load_tree

    kda_ops = load_tree(tree)
    chunk = kda_ops.chunk
    lengths = step_lengths(tokens, seed=heads)
    x = kda_inputs(lengths, seed=heads, heads=heads)
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)

    def call(seqs: list[int], with_metadata: bool):
        lo, hi = starts[seqs[0]], starts[seqs[-1] + 1]
        cu, cu_cpu = cu_seqlens([lengths[i] for i in seqs])
        kwargs = {}
        if with_metadata:
            from vllm.models.kimi_k3.amd.kda_metadata_launch import (
                prepare_chunk_metadata_device,
            )

            indices, offsets = prepare_chunk_metadata_device(cu, cu_cpu)
            kwargs = {"chunk_indices": indices, "chunk_offsets": offsets}
        o, final = chunk.chunk_kda_with_fused_gate(
            q=x["q"][:, lo:hi].clone(),
            k=x["k"][:, lo:hi].clone(),
            v=x["v"][:, lo:hi].clone(),
            raw_g=x["raw_g"][:, lo:hi].clone(),
            raw_beta=x["raw_beta"][:, lo:hi].clone(),
            A_log=x["A_log"],
            g_bias=x["g_bias"],
            initial_state=x["initial_state"][seqs[0] : seqs[-1] + 1].clone(),
            output_final_state=True,
            lower_bound=x["lower_bound"],
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu,
            **kwargs,
        )
        torch.cuda.synchronize()
        return o, final

    result = {"tree": tree, "heads": heads, "tokens": tokens, "sequences": len(lengths)}
    result["longest"] = max(lengths)
    everything = list(range(len(lengths)))
    start = time.perf_counter()
    big = [call(everything, with_metadata=tree == "patched")]
    try:  # a line whose series has the precompiled launches (0.27.1's 0005)
        from vllm.models.kimi_k3.amd.ops.third_party.kda import (
            kda_chunk_launch as launches,
        )
    except ImportError:
        launches = None
    if tree == "patched" and launches is not None:
        big.append(call(everything, with_metadata=True))
        # 1: the first call of the kind; the second took the launches.
        result["vendored_calls"] = launches.STATS["vendored_calls"]
    result["one_call_s"] = round(time.perf_counter() - start, 2)
    small_o = torch.empty_like(big[0][0])
    small_final = torch.empty_like(big[0][1])
    for seqs in small_groups(lengths):
        o, final = call(seqs, with_metadata=False)
        small_o[:, starts[seqs[0]] : starts[seqs[-1] + 1]] = o
        small_final[seqs[0] : seqs[-1] + 1] = final

    def rel(a, b):
        a, b = a.double(), b.double()
        return float((a - b).norm() / b.norm())

    worst = []
    for o, final in big:
        per_seq = max(
            rel(o[:, starts[i] : starts[i + 1]], small_o[:, starts[i] : starts[i + 1]])
            for i in everything
        )
        worst.append(
            {
                "output_rel_worst_sequence": per_seq,
                "final_state_rel": rel(final, small_final),
                "nan": bool(o.isnan().any() or final.isnan().any()),
            }
        )
    result["agreement"] = worst
    result["agrees"] = all(
        not w["nan"]
        and w["output_rel_worst_sequence"] < TOLERANCE
        and w["final_state_rel"] < TOLERANCE
        for w in worst
    )
    return result


def main() -> int:
    if len(sys.argv) == 4:
        print(json.dumps(run_case(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
        return 0
    failed = 0
    for tree in ("patched", "pristine"):
        for heads, tokens in CASES:
            proc = subprocess.run(
                [sys.executable, __file__, tree, str(heads), str(tokens)],
                capture_output=True,
                text=True,
                timeout=200 if tree == "patched" else 120,
            )
            lines = proc.stdout.strip().splitlines()
            report = json.loads(lines[-1]) if proc.returncode == 0 and lines else {}
            report.update(tree=tree, heads=heads, tokens=tokens, exit=proc.returncode)
            if proc.returncode:
                report["error"] = [
                    line for line in proc.stderr.splitlines() if "Error" in line
                ][-3:]
            agrees = report.get("agrees", False)
            expected = not agrees if tree == "pristine" else agrees
            failed += not expected
            print(json.dumps(report), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
