"""The 0.32.0 line's direct recurrent launch (series k4.2, patches
0008-0009) against vLLM 0.32.0's own wrapper, on the lent GPU, at
K3_HEADS heads a rank (default 12), in one process.

The calls are gpu_spec.py's recurrent calls as the layer makes them (a
dspark step's spec requests with the 2-D block table and the common length;
plain decodes with a block-table column), at 1, 8 and 32 requests. For each:
the wrapper's outputs and states (the series' launch off:
``kda_recurrent_launch.DIRECT = False``), then the series' first call (the
wrapper, and the plan read back after it, unless an earlier call of the
signature made it) and second call (the direct launch) from the same
inputs, which must write bitwise what the wrapper wrote; then host
microseconds per call of both, interleaved (launch_costs.host_us), GPU
microseconds per call, and the Triton binaries compiled while timing (none
may be).

    cd benchmarks && K3_LINE=0.32.0 K3_HEADS=12 python3 gpu_recurrent_launch.py

needs .gpu/line-0.32.0 (gpu_bundle.py); JSON to $OUT/recurrent-launch.json.
"""

import random
import sys

import gpu_spec
import launch_costs
import torch
from kda_harness import RunReport
from vllm.models.kimi_k3.amd import kda_recurrent_launch as series

RECURRENT = "fused_recurrent_kda_fwd_kernel"


def through(direct: bool, call):
    """``call`` with the series' launch on or off (the same work either way)."""

    def run():
        series.DIRECT = direct
        call()

    return run


def compared(call, outputs, reps: int) -> dict:
    """One call's row: bitwise, host and GPU time, compiles while timing."""
    saved = [t.clone() for t in outputs()]

    def restore():
        for tensor, before in zip(outputs(), saved, strict=True):
            tensor.copy_(before)

    wrapper, launched = through(False, call), through(True, call)
    wrapper()
    torch.cuda.synchronize()
    by_wrapper = [t.clone() for t in outputs()]
    restore()
    made = series.STATS["plans_made"]
    launched()  # the first of its signature: the wrapper, then the plan
    restore()
    wrapper_calls = series.STATS["wrapper_calls"]
    launched()
    torch.cuda.synchronize()
    row = {
        # A call whose counts pick an earlier call's configuration has that
        # call's signature, and its plan already.
        "plan made by this call": series.STATS["plans_made"] == made + 1,
        "launched directly": series.STATS["wrapper_calls"] == wrapper_calls,
        "bitwise equal to the wrapper": all(
            torch.equal(a, b) for a, b in zip(outputs(), by_wrapper, strict=True)
        ),
    }
    before = gpu_spec.binaries()
    row["host us (median)"] = launch_costs.host_us(
        {"0.32.0's wrapper": wrapper, "series k4.2": launched}, reps
    )
    row["gpu us per call"] = {
        "0.32.0's wrapper": launch_costs.gpu_us(wrapper),
        "series k4.2": launch_costs.gpu_us(launched),
    }
    row["binaries compiled while timing"] = sum(gpu_spec.binaries().values()) - sum(
        before.values()
    )
    series.DIRECT = True
    return row


def main() -> int:
    report = RunReport("recurrent-launch.json", heads=gpu_spec.H)
    rng = random.Random(5)
    failed = 0
    for n in (1, 8, 32):
        for name, (call, kernel, outputs) in gpu_spec.recurrent_calls(n, rng).items():
            if kernel != RECURRENT:
                continue  # the packed decode has no direct launch
            row = compared(call, outputs, reps=400)
            report[f"{n} requests: {name}"] = row
            report.save()
            print(f"{n} requests: {name}: {row}", flush=True)
            failed += not (
                row["launched directly"]
                and row["bitwise equal to the wrapper"]
                and row["binaries compiled while timing"] == 0
            )
    report["failed rows"] = failed
    report.save()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
