"""Shared set-up of the GPU harness: import the bundled vLLM kernel files of
one tree (patched, pristine) behind the shims, make KDA inputs at Kimi-K3
shapes, pin the timing thread to a quiet CPU, and keep a run's report."""

import json
import os
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
# The default line's bundle, or with K3_LINE=<version> another line's
# (gpu_bundle.py run in that line's environment).
BUNDLE = (
    REPO / ".gpu" / (f"line-{os.environ['K3_LINE']}" if "K3_LINE" in os.environ else "")
)
HEAD_DIM = 128  # Kimi-K3 KDA head size
# Kimi-K3's 96 KDA heads at TP8 (vLLM #52803: "TP8 is 12 heads per rank");
# tep16 runs 6, dep16 96 (K3_HEADS=6 or 96 for those spot checks). Runs
# before 2026-12-03 assumed 8 (docs/benchmarks.md).
HEADS_PER_RANK = int(os.environ.get("K3_HEADS", 12))


def load_tree(tree: str):
    """Import the AMD KDA ops of `tree` ("patched" or "pristine")."""
    sys.path[:0] = [str(BUNDLE / tree), str(REPO / "src"), str(REPO / "benchmarks")]
    import vllm_shims

    vllm_shims.install()
    # Kernels that build tensor descriptors in the kernel (0.32.0's) need a
    # scratch allocator on an NVIDIA GPU (not on AMD's); vLLM sets the same
    # one where its own such kernels run (vllm.triton_utils.allocation).
    import triton

    triton.set_allocator(
        lambda size, alignment, stream: torch.empty(
            size, device="cuda", dtype=torch.int8
        )
    )
    import vllm.models.kimi_k3.amd.ops.third_party.kda as kda_ops

    return kda_ops


def load_upstream_metadata():
    """The bundle's upstream ``amd/kda_metadata.py`` (vLLM's own chunk
    metadata, beside the patched tree's), loaded under its own name."""
    import importlib.util

    path = BUNDLE / "upstream/vllm/models/kimi_k3/amd/kda_metadata.py"
    spec = importlib.util.spec_from_file_location("upstream_kda_metadata", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def binaries(jit) -> int | None:
    """The binaries a Triton JIT function holds in this process, over every
    device (compiled here or read from Triton's disk cache); None when it
    holds none to count (the interpreter)."""
    caches = getattr(jit, "device_caches", None)
    return None if caches is None else sum(len(c[0]) for c in caches.values())


def forget_binaries(jit) -> None:
    """Drop the binaries a Triton JIT function holds in this process, so a
    run's count starts from none (compiled, or read back from Triton's disk
    cache); nothing to drop in the interpreter."""
    caches = getattr(jit, "device_caches", None)
    if caches is not None:
        caches.clear()


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


def _calibration_us(samples: int) -> float:
    """Median time of a fixed pure-Python workload on the current CPU."""
    import statistics
    import time

    times = []
    for _ in range(samples):
        start = time.perf_counter()
        sum(range(20_000))
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _fastest_cpu(passes: int, samples: int) -> tuple[int, dict[int, float]]:
    """The CPU that ran the workload fastest, the worst of `passes` passes
    over every allowed CPU counting; the thread is left pinned to it."""
    import os

    allowed = sorted(ALLOWED_CPUS)
    worst: dict[int, float] = {}
    for _ in range(passes):
        for cpu in allowed:
            os.sched_setaffinity(0, {cpu})
            worst[cpu] = max(worst.get(cpu, 0.0), _calibration_us(samples))
    chosen = min(worst, key=worst.get)
    os.sched_setaffinity(0, {chosen})
    return chosen, worst


ALLOWED_CPUS: set[int] = set()
# One entry per repin_to_quiet_cpu() call: (pinned CPU, its workload time in
# us, median over CPUs), so a report can show how fast the host was in each
# round.
REPINS: list[tuple[int, float, float]] = []


def pin_to_quiet_cpu() -> dict:
    """Pin this (the main) thread to one CPU: the one that ran a fixed pure-
    Python workload fastest, the worse of two passes over every CPU counting.
    CUDA is initialized first, so the driver's own threads keep every CPU.
    The calibration is reported with the results; repin_to_quiet_cpu()
    repeats the choice before each round, because the vCPUs' speeds change
    over a run (by 2x within minutes, observed)."""
    import os
    import statistics

    torch.zeros(1, device="cuda")
    ALLOWED_CPUS.update(os.sched_getaffinity(0))
    chosen, worst = _fastest_cpu(passes=2, samples=15)
    return {
        "cpus": len(worst),
        "pinned_cpu": chosen,
        "calibration_us_per_cpu": worst,
        "calibration_us_median_over_cpus": statistics.median(worst.values()),
    }


def repin_to_quiet_cpu() -> None:
    """Re-pick the fastest CPU now (one quick pass) and pin to it; a round's
    sides all run on the CPU picked before the round. No-op unless
    pin_to_quiet_cpu() ran first."""
    import statistics

    if not ALLOWED_CPUS:
        return
    chosen, times = _fastest_cpu(passes=1, samples=5)
    REPINS.append((chosen, times[chosen], statistics.median(times.values())))


class RunReport(dict):
    """A run's JSON report, OUT/<name>: the device, versions and date first,
    then what the run adds. save() rewrites the file after each part, so a
    run cut off by its time limit keeps what it had; a run that pinned its
    thread (host_cpu) records the re-pins too."""

    def __init__(self, name: str, device: str | None = None, **fields):
        import triton

        super().__init__(
            gpu=device or torch.cuda.get_device_name(),
            torch=torch.__version__,
            triton=triton.__version__,
            date=time.strftime("%Y-%m-%d %H:%M:%S"),
            **fields,
        )
        out = Path(os.environ.get("OUT", "/tmp"))
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / name

    def save(self) -> None:
        if "host_cpu" in self:
            self["repins"] = REPINS
        self.path.write_text(json.dumps(self, indent=1, default=str))
