"""Compiles after ready: the series' kernel (warmed up as the builder does at
construction) against upstream 0.28.0's, over the same serving-like mix of
metadata steps, each side in its own process with an empty Triton cache.

    python3 benchmarks/gpu_compiles.py          # needs .gpu/ (gpu_bundle.py)

A compile is a new entry in the kernel's in-process binary cache (with an
empty TRITON_CACHE_DIR every one of them is a real compile). Per side it
reports the warm-up (ours only), the compiles during the steps, and the
host time of the steps (median, p99, worst: a compile shows as the worst).
"""

import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = 3_000
MAX_NUM_SEQS = 128  # Kimi-K3's AMD recipe
LONGEST_PREFILL = 300_000
# Limits the two experiments warm up for: prefills up to 300k tokens in one
# step, and the recipe's --max-num-batched-tokens 4096.
LIMITS = {
    "prefills up to 300k tokens": (MAX_NUM_SEQS, LONGEST_PREFILL + MAX_NUM_SEQS),
    "recipe: 4096 tokens a step": (MAX_NUM_SEQS, 4096),
}


def serving_mix(steps: int, max_num_seqs: int, max_tokens: int, seed: int = 0):
    """Sequence lengths of metadata steps (steps that prefill): 1 to
    max_num_seqs sequences, 1 to 4 prefills of log-uniform length sharing the
    token budget, the rest decodes, sometimes zero-length padding at the
    back."""
    rng = random.Random(seed)
    for _ in range(steps):
        num_seqs = rng.randint(1, max_num_seqs)
        prefills = rng.randint(1, min(4, num_seqs))
        budget = max(2, (max_tokens - num_seqs) // prefills)
        padding = rng.choice([0, 0, 0, rng.randint(0, num_seqs - prefills)])
        decodes = num_seqs - prefills - padding
        yield (
            [1] * decodes
            + [
                int(math.exp(rng.uniform(math.log(2), math.log(budget))))
                for _ in range(prefills)
            ]
            + [0] * padding
        )


def side(name: str, limit: str) -> dict:
    """One side in this process (the Triton cache is empty: see main)."""
    import torch
    from kda_harness import (
        binaries,
        cu_seqlens,
        load_tree,
        load_upstream_metadata,
        pin_to_quiet_cpu,
    )

    max_num_seqs, max_tokens = LIMITS[limit]
    load_tree("patched")
    pin_to_quiet_cpu()  # as gpu_bench.py does: the steps' host times
    warm_up = None
    if name == "ours":
        import vllm.models.kimi_k3.amd.kda_metadata_launch as module

        start = time.perf_counter()
        result = module.warm_up_chunk_metadata(max_num_seqs, max_tokens, "cuda")
        torch.cuda.synchronize()
        warm_up = {
            "variants": len(result.variants),
            "compiled": binaries(module._chunk_metadata_kernel),
            "seconds": time.perf_counter() - start,
        }
        prepare = module.prepare_chunk_metadata_device
    else:
        module = load_upstream_metadata()

        def prepare(dev, host):
            return module.prepare_chunk_metadata_device(dev, host, 64)

    kernel = module._chunk_metadata_kernel
    before = binaries(kernel)
    batches = [cu_seqlens(s) for s in serving_mix(STEPS, max_num_seqs, max_tokens)]
    torch.cuda.synchronize()
    host_us = []
    compile_steps = []
    for i, (dev, host) in enumerate(batches):
        seen = binaries(kernel)
        start = time.perf_counter()
        prepare(dev, host)
        host_us.append((time.perf_counter() - start) * 1e6)
        if binaries(kernel) != seen:
            compile_steps.append({"step": i, "host_ms": host_us[-1] / 1e3})
        if i % 100 == 99:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    ordered = sorted(host_us)
    return {
        "warm_up": warm_up,
        "steps": len(batches),
        "compiles_during_steps": binaries(kernel) - before,
        "compile_steps": compile_steps,
        "host_us_median": statistics.median(host_us),
        "host_us_p99": ordered[int(0.99 * len(ordered))],
        "host_us_worst": ordered[-1],
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_tokens,
    }


def main() -> None:
    report = {}
    for limit in LIMITS:
        for name in ("ours", "upstream"):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TRITON_CACHE_DIR": cache}
                result = subprocess.run(
                    [sys.executable, __file__, "--side", name, limit],
                    capture_output=True,
                    text=True,
                    env=env,
                )
            if result.returncode:
                sys.exit(result.stdout + result.stderr)
            row = json.loads(result.stdout.strip().splitlines()[-1])
            report[f"{limit} / {name}"] = row
            print(limit, name, json.dumps(row)[:400], flush=True)
    out = Path(os.environ.get("OUT", "/tmp")) / "compiles.json"
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    if "--side" in sys.argv:
        name, limit = sys.argv[sys.argv.index("--side") + 1 :][:2]
        print(json.dumps(side(name, limit)))
    else:
        main()
