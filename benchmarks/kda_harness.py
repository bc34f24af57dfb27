"""Shared set-up of the GPU harness: import the bundled vLLM kernel files of
one tree (patched, pristine) behind the shims, and make KDA inputs at
Kimi-K3 shapes."""

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / ".gpu"
HEAD_DIM = 128  # Kimi-K3 KDA head size
HEADS_PER_RANK = 8  # assumed per-rank KDA heads at TP8 (64 heads / 8)


def load_tree(tree: str):
    """Import the AMD KDA ops of `tree` ("patched" or "pristine")."""
    sys.path[:0] = [str(BUNDLE / tree), str(REPO / "src"), str(REPO / "benchmarks")]
    import vllm_shims

    vllm_shims.install()
    import vllm.models.kimi_k3.amd.ops.third_party.kda as kda_ops

    return kda_ops


def cu_seqlens(seq_lens, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(seq_lens, dtype=torch.int64).cumsum(0)
    return cu.to(device), cu


def kda_inputs(seq_lens, seed: int, heads: int = HEADS_PER_RANK):
    """Random inputs of chunk_kda_with_fused_gate for one varlen batch."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    total = int(sum(seq_lens))
    shape = (1, total, heads, HEAD_DIM)

    def randn(*size, dtype=torch.bfloat16):
        return torch.randn(*size, generator=g, device="cuda", dtype=dtype)

    return {
        "q": randn(*shape),
        "k": randn(*shape),
        "v": randn(*shape),
        "raw_g": randn(*shape),
        "raw_beta": randn(1, total, heads),
        "A_log": randn(heads, dtype=torch.float32),
        "g_bias": randn(heads * HEAD_DIM, dtype=torch.float32),
        "initial_state": randn(
            len(seq_lens), heads, HEAD_DIM, HEAD_DIM, dtype=torch.float32
        ),
        "lower_bound": -5.0,
        "output_final_state": True,
        "use_qk_l2norm_in_kernel": True,
    }


def cpu_steal_ticks() -> int:
    """Jiffies the hypervisor ran something else while this VM's CPUs
    wanted to run (all CPUs; /proc/stat's eighth 'cpu' field)."""
    with open("/proc/stat") as stat:
        return int(stat.readline().split()[8])


def pin_to_quiet_cpu() -> dict:
    """Pin this (the main) thread to one CPU: the one that ran a fixed pure-
    Python workload fastest, the worse of two passes over every CPU counting.
    CUDA is initialized first, so the driver's own threads keep every CPU.
    Every side of every comparison then runs on that CPU; the calibration is
    reported with the results."""
    import os
    import statistics
    import time

    torch.zeros(1, device="cuda")
    allowed = sorted(os.sched_getaffinity(0))

    def calibrate() -> float:
        samples = []
        for _ in range(15):
            start = time.perf_counter()
            sum(range(20_000))
            samples.append(time.perf_counter() - start)
        return statistics.median(samples) * 1e6

    passes = []
    for _ in range(2):
        times = {}
        for cpu in allowed:
            os.sched_setaffinity(0, {cpu})
            times[cpu] = calibrate()
        passes.append(times)
    worse = {cpu: max(p[cpu] for p in passes) for cpu in allowed}
    chosen = min(worse, key=worse.get)
    os.sched_setaffinity(0, {chosen})
    return {
        "cpus": len(allowed),
        "pinned_cpu": chosen,
        "calibration_us_per_cpu": worse,
        "calibration_us_median_over_cpus": statistics.median(worse.values()),
    }
