"""Benchmarks of the chunk-metadata step and of a pipelined KDA prefill step,
side by side in one run on the lent GPU (results feed docs/benchmarks.md).

    python3 benchmarks/gpu_bench.py           # needs .gpu/ (gpu_bundle.py)

Paths compared for the metadata step:
  host-0.27.1  0.27.1's builder: CPU prepare_chunk_indices/offsets on the host
               cu_seqlens, then async_tensor_h2d of both;
  legacy       prepare_chunk_indices/offsets on the device cu_seqlens (the
               .tolist() the ROCm Kimi-K3 path hits in 0.27.1);
  upstream     vLLM 0.28.0's one-program-per-sequence kernel and wrapper;
  ours         the series' chunk-block kernel and wrapper.
"""

import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kda_harness import BUNDLE, cu_seqlens, kda_inputs, load_tree  # noqa: E402

kda_ops = load_tree("patched")
from vllm.models.kimi_k3.amd.kda_metadata import (  # noqa: E402
    prepare_chunk_metadata_device as ours,
)
from vllm.third_party.flash_linear_attention.ops.index import (  # noqa: E402
    prepare_chunk_indices,
    prepare_chunk_offsets,
)


def load_upstream():
    path = BUNDLE / "upstream/vllm/models/kimi_k3/amd/kda_metadata.py"
    spec = importlib.util.spec_from_file_location("upstream_kda_metadata", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    prepare = module.prepare_chunk_metadata_device
    return lambda dev, host: prepare(dev, host, 64)


upstream = load_upstream()


def host_0271(dev, host):
    return (
        prepare_chunk_indices(host, 64).pin_memory().to(dev.device, non_blocking=True),
        prepare_chunk_offsets(host, 64).pin_memory().to(dev.device, non_blocking=True),
    )


def legacy(dev, host):
    return prepare_chunk_indices(dev, 64), prepare_chunk_offsets(dev, 64)


PATHS = {"host-0.27.1": host_0271, "legacy": legacy, "upstream": upstream, "ours": ours}
SHAPES = {
    "1x1M": [1 << 20],
    "1x256k": [256 * 1024],
    "8x8k": [8192] * 8,
    "64x2k": [2048] * 64,
    "2000x100": [100] * 2000,
    "256 mixed": [1] * 240 + [1024] * 16,
}


def median_us(samples):
    return statistics.median(samples) * 1e6


def host_time(fn, seq_lens, reps=300, queued_cycles=0):
    """Wall time on the host of one metadata step, issued with the GPU queue
    empty, or behind `queued_cycles` of torch.cuda._sleep."""
    samples = []
    for _ in range(reps):
        dev, host = cu_seqlens(seq_lens)  # fresh: defeats FLA's tensor_cache
        torch.cuda.synchronize()
        if queued_cycles:
            torch.cuda._sleep(queued_cycles)
        start = time.perf_counter()
        fn(dev, host)
        samples.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return median_us(samples)


def graph_time(fn, seq_lens, per_graph=50, reps=30):
    """Device time per call: CUDA-graph replay of `per_graph` calls."""
    dev, host = cu_seqlens(seq_lens)
    fn(dev, host)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn(dev, host)
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / per_graph)
    return median_us(samples)


def launch_floor():
    """Graph replay of the smallest possible kernel (one tiny elementwise op)."""
    x = torch.zeros(1, device="cuda")
    return graph_time(lambda dev, host: x.add_(1), [1])


def sleep_cycles_for(ms):
    """Cycles of torch.cuda._sleep that take `ms`, measured at working clocks
    (the last of several calibrations, after the clocks ramped up)."""
    cycles = 10_000_000
    for _ in range(5):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        cycles = int(cycles * ms / start.elapsed_time(end))
    return cycles


def queued_ms(cycles):
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def pipelined_steps(seq_lens, patched, layers=8, steps=12):
    """Steps of `layers` KDA layers; the host prepares step n+1 while the GPU
    runs step n. Returns (ms per step, GPU idle us per step). Inputs are
    reused (chunk KDA overwrites v: values drift, timing does not)."""
    inputs = kda_inputs(seq_lens, seed=0)
    batches = [cu_seqlens(seq_lens) for _ in range(steps + 2)]
    events = []

    def step(dev, host):
        if patched:
            indices, offsets = ours(dev, host)
            metadata = {"chunk_indices": indices, "chunk_offsets": offsets}
        else:
            host_0271(dev, host)  # 0.27.1's builder still makes these (unused)
            metadata = {}
        begin, end = torch.cuda.Event(True), torch.cuda.Event(True)
        begin.record()
        for _ in range(layers):
            kda_ops.chunk_kda_with_fused_gate(**inputs, cu_seqlens=dev, **metadata)
        end.record()
        events.append((begin, end))

    step(*batches[0])  # warm-up
    torch.cuda.synchronize()
    events.clear()
    start = time.perf_counter()
    for dev, host in batches[2:]:
        step(dev, host)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / steps
    # GPU-clock gap from the end of step n's last layer to the start of step
    # n+1's first: time the GPU had no layer work.
    gaps = [events[i][1].elapsed_time(events[i + 1][0]) for i in range(steps - 1)]
    return wall * 1e3, statistics.median(gaps) * 1e3


def main():
    import triton

    report = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "launch_floor_us": launch_floor(),
        "metadata": {},
    }
    for name, seq_lens in SHAPES.items():
        row = {}
        for path, fn in PATHS.items():
            row[f"{path} host us"] = host_time(fn, seq_lens)
            if path in ("upstream", "ours"):
                row[f"{path} kernel us"] = graph_time(fn, seq_lens)
        report["metadata"][name] = row
        print(name, json.dumps(row), flush=True)

    cycles = sleep_cycles_for(5.0)
    report["blocked_behind_5ms"] = {
        name: {
            path: host_time(PATHS[path], seq_lens, reps=40, queued_cycles=cycles)
            for path in ("legacy", "ours")
        }
        for name, seq_lens in (
            ("8x8k", SHAPES["8x8k"]),
            ("256 mixed", SHAPES["256 mixed"]),
        )
    }
    report["queued_work_ms"] = queued_ms(cycles)
    print(json.dumps(report["blocked_behind_5ms"]), flush=True)

    report["pipelined"] = {}
    for name, seq_lens in {
        "small: 4x1k + 12 decodes": [1] * 12 + [1024] * 4,
        "large: 8x8k": [8192] * 8,
    }.items():
        before = pipelined_steps(seq_lens, patched=False)
        after = pipelined_steps(seq_lens, patched=True)
        report["pipelined"][name] = {
            "0.27.1 ms/step": before[0],
            "0.27.1 GPU idle us/step": before[1],
            "patched ms/step": after[0],
            "patched GPU idle us/step": after[1],
        }
        print(name, json.dumps(report["pipelined"][name]), flush=True)

    out = Path(os.environ.get("OUT", "/tmp")) / "bench.json"
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
