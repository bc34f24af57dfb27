"""Issue 28 item 3 on the lent GPU: what stage 1's "kda numerics" check
(k3rocm.smoke.kda_numerics) costs, in a fresh process as stage 1 runs it,
on the bundled patched kernels. One process per mode, the Triton cache
directory (TRITON_CACHE_DIR) shared between them:

    python3 gpu_smoke_time.py cold           # empty cache: compiles, autotunes
    python3 gpu_smoke_time.py warm-uncached  # compiled kernels cached, the
                                             # autotuners time again (k3.6)
    python3 gpu_smoke_time.py warm [LABEL]   # kernels and choices cached (k3.7)

Each runs, untimed, what stage 1 runs right before the check (its kernel
battery: the series' metadata kernel on the device, so Triton is set up in
the process), then times the check's measurement (measure("cuda")) twice:
the first is what stage 1 pays, the second the kernels' run with every
cache in memory. Prints one JSON line; writes it under $OUT. With
K3_SMOKE_PROFILE=1 the first measurement runs under cProfile (the 25
costliest calls by cumulative time go into the JSON).
"""

import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kda_harness import load_tree  # noqa: E402

load_tree("patched")

from k3rocm.smoke import kda_numerics  # noqa: E402


def timed(cache_autotuning: bool, profile=None) -> tuple[float, float]:
    torch.cuda.synchronize()
    if profile is not None:
        profile.enable()
    start = time.perf_counter()
    worst = kda_numerics.measure("cuda", cache_autotuning=cache_autotuning)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if profile is not None:
        profile.disable()
    return seconds, worst


def battery() -> list:
    """Stage 1's kernel battery (check_kernel_battery's comparison)."""
    from vllm.models.kimi_k3.amd.kda_metadata_launch import (
        prepare_chunk_metadata_device,
    )

    from k3rocm.smoke.kernel_checks import compare_with_reference

    return compare_with_reference(prepare_chunk_metadata_device, "cuda")


def main() -> None:
    mode = sys.argv[1]
    label = "-".join(sys.argv[1:])  # names the result file
    cache = mode != "warm-uncached"
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context, which stage 1 makes first too
    start = time.perf_counter()
    mismatches = battery()
    battery_s = time.perf_counter() - start
    profile = cProfile.Profile() if os.environ.get("K3_SMOKE_PROFILE") else None
    first, worst = timed(cache, profile)
    again, worst_again = timed(cache)
    cache_dir = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton/cache"))
    result = {
        "mode": label,
        "autotune results cached": cache,
        "first measure s": first,
        "again in-process s": again,
        "worst excess": [worst, worst_again],
        "autotune files in the cache": len(list(cache_dir.rglob("*.autotune.json"))),
        "kernel battery before (untimed in the above) s": battery_s,
        "kernel battery mismatches": mismatches,
    }
    if profile is not None:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(25)
        result["profile"] = text.getvalue().splitlines()
    print(json.dumps(result), flush=True)
    out = Path(os.environ.get("OUT", "/tmp"))
    (out / f"smoke-{label}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
