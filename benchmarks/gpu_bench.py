"""Benchmarks of the chunk-metadata step (host time, its breakdown, kernel
time, host time behind queued GPU work) and of a step model closer to
serving (real KDA layers, other layers' GPU time as a calibrated wait), side
by side in one run on the lent GPU (results feed docs/benchmarks-log.md).

    python3 benchmarks/gpu_bench.py           # needs .gpu/ (gpu_bundle.py)

Every comparison runs in interleaved rounds, one discarded warm-up round
then ROUNDS rounds, and reports the median of the round values, their
min-max, and the rounds the patched side won. What one round's value is:
  host time     the median of HOST_STEPS metadata steps per side, each side
                running its steps back to back in turn (host_rounds());
                two more views: ours and upstream alternating step by step
                (a slow period of the host hits both alike), and all four
                paths alternating step by step (each step follows another
                path's, so it runs with caches and allocator state that
                path left: "after each path");
  kernel time   the median of STEPS_PER_ROUND CUDA-graph replays of 50 calls;
  step model    the median of MODEL_STEPS per-step intervals on the GPU's
                timeline (an event recorded as each step starts), in two
                arrangements: each side's steps back to back, sides taking
                turns by round (interleaved()), and the sides alternating
                step by step within each round (model_rounds_alternating()),
                which also gives each round the paired statistic: the median
                over adjacent pairs of (0.27.1 step - patched step).
The process's main thread is pinned to one CPU (kda_harness.pin_to_quiet_cpu),
re-picked before every round (repin_to_quiet_cpu: the vCPUs' speeds drift),
and Python's garbage collector is off while a round is timed.

Paths compared for the metadata step:
  host-0.27.1  0.27.1's builder: CPU prepare_chunk_indices/offsets on the host
               cu_seqlens, then async_tensor_h2d of both;
  legacy       prepare_chunk_indices/offsets on the device cu_seqlens (the
               .tolist() the ROCm Kimi-K3 path hits in 0.27.1);
  upstream     vLLM 0.28.0's one-program-per-sequence kernel and wrapper;
  ours         the series' chunk-block kernel and wrapper.
"""

import functools
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from kda_harness import (  # noqa: E402
    REPINS,
    cpu_steal_ticks,
    cu_seqlens,
    kda_inputs,
    load_tree,
    load_upstream_metadata,
    pin_to_quiet_cpu,
    repin_to_quiet_cpu,
)

kda_ops = load_tree("patched")
from vllm.models.kimi_k3.amd.kda_metadata_launch import (  # noqa: E402
    prepare_chunk_metadata_device as ours,
)
from vllm.third_party.flash_linear_attention.ops.index import (  # noqa: E402
    prepare_chunk_indices,
    prepare_chunk_offsets,
)

upstream_metadata = load_upstream_metadata()


def upstream(dev, host):
    return upstream_metadata.prepare_chunk_metadata_device(dev, host, 64)


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


ROUNDS = int(os.environ.get("K3_BENCH_ROUNDS", 8))  # after a warm-up round
STEPS_PER_ROUND = 30  # kernel time: graph replays per round
HOST_STEPS = 60  # host time: metadata steps per side per round
MODEL_STEPS = 40  # step model: steps per side per round


def interleaved(sides: dict, rounds: int = ROUNDS) -> dict:
    """A/B(/C...) rounds: every side measured once per round, the order
    reversed every other round, the first round thrown away (compiles,
    caches, clocks). Each side's measure() returns one round's value."""
    names = list(sides)
    values = {name: [] for name in names}
    for r in range(rounds + 1):
        repin_to_quiet_cpu()
        for name in names if r % 2 else names[::-1]:
            value = sides[name]()
            if r:
                values[name].append(value)
    return values


def summarize(values: dict, ours: str, against: list[str]) -> dict:
    """Median of the round values with min-max, and rounds `ours` won
    (lower is better) against each other side."""
    out = {}
    for name, series in values.items():
        out[name] = {
            "median": statistics.median(series),
            "min": min(series),
            "max": max(series),
            "rounds": series,
        }
    for other in against:
        won = sum(a < b for a, b in zip(values[ours], values[other], strict=True))
        out[ours][f"rounds won vs {other}"] = f"{won}/{len(values[ours])}"
    return out


def host_rounds(
    paths: dict,
    seq_lens,
    steps=HOST_STEPS,
    queued_cycles=0,
    rounds=ROUNDS,
    per_step=False,
) -> dict:
    """Host wall time of one metadata step, per side and round: the median
    of the side's `steps` steps in the round, each issued with the GPU queue
    empty or behind `queued_cycles` of torch.cuda._sleep, on fresh tensors
    (which defeats FLA's tensor_cache). Behind queued work the host does not
    wait for the queue between steps (a wait there leaves the vCPU slow for
    the next tens of microseconds, measured): each step queues its sleep
    behind whatever is still queued, so a side that does not sync runs
    ahead of a growing queue, and one that syncs waits for it inside its
    step. The order of the sides is reversed
    every other round; the first round is thrown away. By default each side
    runs its steps back to back (a block) in turn; with `per_step` the sides
    alternate step by step (the side that goes first rotating), so every
    step of a side follows another side's step."""
    names = list(paths)
    values = {name: [] for name in names}
    for r in range(rounds + 1):
        repin_to_quiet_cpu()
        order = names if r % 2 else names[::-1]
        batches = {name: [cu_seqlens(seq_lens) for _ in range(steps)] for name in names}
        samples = {name: [] for name in names}
        if per_step:
            schedule = [
                (order[(i + k) % len(order)], i)
                for i in range(steps)
                for k in range(len(order))
            ]
        else:
            schedule = [(name, i) for name in order for i in range(steps)]
        torch.cuda.synchronize()
        gc.collect()
        gc.disable()
        try:
            for name, i in schedule:
                dev, host = batches[name][i]
                if queued_cycles:
                    torch.cuda._sleep(queued_cycles)
                else:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                paths[name](dev, host)
                samples[name].append(time.perf_counter() - start)
        finally:
            gc.enable()
        torch.cuda.synchronize()
        if r:
            for name in names:
                values[name].append(statistics.median(samples[name]) * 1e6)
    return values


def kernel_round(fn, seq_lens, per_graph=50, replays=STEPS_PER_ROUND):
    """Device time per call over a round: CUDA-graph replays of `per_graph`
    calls (median of `replays`)."""
    dev, host = cu_seqlens(seq_lens)
    fn(dev, host)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn(dev, host)
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / per_graph)
    return statistics.median(samples)


def launch_floor():
    """Graph replay of the smallest possible kernel (one tiny elementwise op)."""
    x = torch.zeros(1, device="cuda")
    return kernel_round(lambda dev, host: x.add_(1), [1])


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


def host_breakdown(seq_lens, reps=400) -> dict:
    """Where ours spends its host time (medians of `reps`, queue empty, GC
    off): the sizing from the host lengths (plain integers up to
    _PLAIN_INT_MAX_SEQS sequences, else NumPy), the two output allocations
    (and, for comparison, one allocation cut into both with three views),
    the launch through the cached binary, the whole step. Each part
    includes freeing what it made."""
    import vllm.models.kimi_k3.amd.kda_metadata_launch as kernel

    repin_to_quiet_cpu()
    dev, host = cu_seqlens(seq_lens)
    ours(dev, host)
    num_seqs, total, most = kernel._chunk_counts(host)
    tile, width = kernel.select_variant(num_seqs, most)
    launch = kernel._LAUNCHES[(dev.get_device(), tile, width)]
    indices, offsets = kernel._outputs(dev, num_seqs, total)

    def one_allocation():  # the alternative, not used: both outputs in one
        rows = total + (total & 1)  # chunk_offsets 16-byte aligned
        both = dev.new_empty(rows + num_seqs + 1, dtype=torch.int64)
        return (
            both.view(torch.int32).as_strided((total, 2), (2, 1)),
            both.as_strided((num_seqs + 1,), (1,), rows),
        )

    parts = {
        "sizing": lambda: kernel._chunk_counts(host),
        "outputs (two allocations)": lambda: kernel._outputs(dev, num_seqs, total),
        "outputs, not used: one allocation and three views": one_allocation,
        "launch": lambda: launch(1, 1, dev, indices, offsets, num_seqs),
        "whole step": lambda: ours(dev, host),
    }
    samples = {name: [] for name in parts}
    gc.collect()
    gc.disable()
    try:
        for _ in range(reps):  # the parts interleaved, like the sides
            for name, part in parts.items():
                torch.cuda.synchronize()
                start = time.perf_counter()
                part()
                samples[name].append(time.perf_counter() - start)
    finally:
        gc.enable()
    torch.cuda.synchronize()
    out = {name: statistics.median(s) * 1e6 for name, s in samples.items()}
    out["sizing path"] = (
        "plain integers" if num_seqs <= kernel._PLAIN_INT_MAX_SEQS else "NumPy"
    )
    return out


# The step model (assumptions; docs/benchmarks-log.md discusses them): a
# Kimi-K3 step on one rank at TP8 is LAYERS decoder layers, KDA in three of
# every four (Kimi Linear's hybrid ratio) with the vendored AMD KDA kernels
# run for real at the per-rank head count; everything else a layer does on
# the GPU (MoE, MLA, norms, collectives) is a calibrated GPU wait, one
# launch per layer, summing to OTHER_GPU_MS per step.
LAYERS = 64
OTHER_GPU_MS = 20.0
MODEL_BATCHES = {
    "concurrency 8: 7 decodes + 1 x 1k prefill": [1] * 7 + [1024],
    "concurrency 16: 15 decodes + 1 x 1k prefill": [1] * 15 + [1024],
}


def model_step(patched, dev, host, inputs, wait_cycles, layer_host_us=None):
    """Issue one step of the model. 0.27.1: the builder's CPU metadata plus
    async copy (unused by the Kimi layer), then the layer's own device
    rebuild with .tolist() in the first KDA layer; patched: the series'
    device build handed to every KDA layer. With `layer_host_us` (a list),
    the host time of each KDA call after the first is appended to it."""
    if patched:
        indices, offsets = ours(dev, host)
        metadata = {"chunk_indices": indices, "chunk_offsets": offsets}
    else:
        host_0271(dev, host)
        metadata = {}
    for layer in range(LAYERS):
        if layer % 4 != 3:
            start = time.perf_counter()
            kda_ops.chunk_kda_with_fused_gate(**inputs, cu_seqlens=dev, **metadata)
            if layer_host_us is not None and layer:
                layer_host_us.append((time.perf_counter() - start) * 1e6)
        torch.cuda._sleep(wait_cycles)


def model_steps(seq_lens, sides, inputs, wait_cycles) -> dict:
    """Run one pipelined step per entry of `sides` (True: patched), back to
    back. Returns each step's interval on the GPU's timeline (from the
    event recorded as the host starts issuing it to the next step's), in
    ms, and the wall time per step. The host prepares step n+1 while the
    GPU runs step n, so an interval holds the step's GPU work and any time
    the GPU waited for the host to issue it; the 0.27.1 step's .tolist()
    waits for the queue, which leaves the GPU idle inside that step. Inputs
    are reused (chunk KDA overwrites v: values drift, timing does not)."""
    batches = iter([cu_seqlens(seq_lens) for _ in sides])
    start = time.perf_counter()
    gpu_ms = step_intervals(
        sides,
        lambda patched: model_step(patched, *next(batches), inputs, wait_cycles),
    )
    wall_ms = (time.perf_counter() - start) / len(sides) * 1e3
    return {"gpu_ms": gpu_ms, "wall_ms": wall_ms}


def step_intervals(sides, issue) -> list[float]:
    """Issue one step per entry of ``sides`` (``issue(side)``), back to back,
    the garbage collector off; each step's interval on the GPU's timeline,
    in ms: from the event recorded as the host starts issuing it to the
    next step's."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(len(sides) + 1)]
    torch.cuda.synchronize()
    gc.collect()
    gc.disable()
    try:
        for event, side in zip(events, sides, strict=False):
            event.record()
            issue(side)
        events[-1].record()
        torch.cuda.synchronize()
    finally:
        gc.enable()
    return [events[i].elapsed_time(events[i + 1]) for i in range(len(sides))]


def model_round(seq_lens, patched, inputs, wait_cycles, steps=MODEL_STEPS):
    """One round of the step model, one side's `steps` steps back to back
    (as a serving engine runs steps of one kind): the median of their
    intervals. The round's mean (wall time over steps) is kept in MEANS."""
    run = model_steps(seq_lens, [patched] * steps, inputs, wait_cycles)
    MEANS[patched].append(run["wall_ms"])
    return statistics.median(run["gpu_ms"])


def model_rounds_alternating(
    seq_lens, inputs, wait_cycles, gpu_work_ms, steps=MODEL_STEPS
):
    """The step model with the sides alternating step by step (each side
    `steps` steps a round, the side that starts swapping every round, the
    first round thrown away): a slow period of the host then falls on both
    sides alike instead of on whichever side's block it hits. Per round:
    each side's median interval; the paired statistic, the median over the
    round's adjacent pairs of (0.27.1 interval - patched interval), which a
    slow period covering part of the round cannot tip the way it can tip two
    separate medians; and the share of each side's steps whose interval
    exceeded the step's GPU work (`gpu_work_ms`) by more than 5%, i.e. in
    which the GPU waited for the host."""
    values = {"0.27.1": [], "patched": []}
    paired, gpu_waited = [], {"0.27.1": [], "patched": []}
    for r in range(ROUNDS + 1):
        repin_to_quiet_cpu()
        first = bool(r % 2)
        sides = [first, not first] * steps
        intervals = model_steps(seq_lens, sides, inputs, wait_cycles)["gpu_ms"]
        if not r:
            continue
        by_side = {True: [], False: []}
        for interval, patched in zip(intervals, sides, strict=True):
            by_side[patched].append(interval)
        for name, patched in (("0.27.1", False), ("patched", True)):
            values[name].append(statistics.median(by_side[patched]))
            waited = sum(t > 1.05 * gpu_work_ms for t in by_side[patched])
            gpu_waited[name].append(waited / steps)
        paired.append(
            statistics.median(
                old - new
                for old, new in zip(by_side[False], by_side[True], strict=True)
            )
        )
    return values, {
        "what": "per round, the median over adjacent step pairs of (0.27.1 "
        "interval - patched interval), ms; positive: patched faster",
        "median": statistics.median(paired),
        "min": min(paired),
        "max": max(paired),
        "rounds": paired,
        "rounds won by patched": f"{sum(d > 0 for d in paired)}/{len(paired)}",
        "share of steps the GPU waited for the host": gpu_waited,
    }


def model_step_costs(seq_lens, inputs, wait_cycles, reps=5) -> dict:
    """What one patched step costs each processor when neither waits for the
    other: the step issued behind 200 ms of queued GPU work (so the host
    never waits), its GPU interval (its GPU work) and its host issue time,
    and the host time of one vendored KDA call (the median over the step's
    KDA layers after the first, over `reps` steps)."""
    queued = sleep_cycles_for(200.0)
    dev, host = cu_seqlens(seq_lens)
    gpu_ms, host_ms, layer_host_us = [], [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(queued)
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        gc.disable()
        try:
            issue = time.perf_counter()
            start.record()
            model_step(True, dev, host, inputs, wait_cycles, layer_host_us)
            end.record()
            host_ms.append((time.perf_counter() - issue) * 1e3)
        finally:
            gc.enable()
        end.synchronize()
        gpu_ms.append(start.elapsed_time(end))
    return {
        "gpu_work_ms_per_step": statistics.median(gpu_ms),
        "host_issue_ms_per_step": statistics.median(host_ms),
        "host_us_per_kda_call": statistics.median(layer_host_us),
    }


MEANS: dict[bool, list[float]] = {False: [], True: []}


def main():
    import triton

    host_cpu = pin_to_quiet_cpu()
    steal_before = cpu_steal_ticks()
    report = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "rounds": ROUNDS,
        "host_steps_per_round": HOST_STEPS,
        "kernel_replays_per_round": STEPS_PER_ROUND,
        "model_steps_per_round": MODEL_STEPS,
        "host_cpu": host_cpu,
        "launch_floor_us": launch_floor(),
        "host_us": {},
        "host_us_alternating_with_upstream": {},
        "host_us_after_each_path": {},
        "kernel_us": {},
    }
    others = ["upstream", "host-0.27.1", "legacy"]
    for name, seq_lens in SHAPES.items():
        report["host_us"][name] = summarize(
            host_rounds(PATHS, seq_lens), "ours", others
        )
        report["host_us_alternating_with_upstream"][name] = summarize(
            host_rounds(
                {p: PATHS[p] for p in ("upstream", "ours")}, seq_lens, per_step=True
            ),
            "ours",
            ["upstream"],
        )
        report["host_us_after_each_path"][name] = summarize(
            host_rounds(PATHS, seq_lens, per_step=True), "ours", others
        )
        report["kernel_us"][name] = summarize(
            interleaved(
                {
                    path: functools.partial(kernel_round, PATHS[path], seq_lens)
                    for path in ("upstream", "ours")
                }
            ),
            "ours",
            ["upstream"],
        )
        print(name, flush=True)

    report["host_breakdown_us"] = {
        name: host_breakdown(SHAPES[name]) for name in SHAPES
    }
    print(json.dumps(report["host_breakdown_us"]), flush=True)

    cycles = sleep_cycles_for(5.0)
    report["queued_work_ms"] = queued_ms(cycles)
    report["blocked_behind_5ms_us"] = {
        name: summarize(
            host_rounds(
                {path: PATHS[path] for path in ("legacy", "ours")},
                SHAPES[name],
                queued_cycles=cycles,
            ),
            "ours",
            ["legacy"],
        )
        for name in ("8x8k", "256 mixed")
    }

    wait_cycles = sleep_cycles_for(OTHER_GPU_MS / LAYERS)
    report["step_model"] = {
        "layers": LAYERS,
        "kda_layers": sum(layer % 4 != 3 for layer in range(LAYERS)),
        "other_gpu_ms_per_step": OTHER_GPU_MS,
        "wait_per_layer_ms": queued_ms(wait_cycles),
        "ms_per_step": {},
        "ms_per_step_alternating": {},
        "patched_step_costs": {},
    }
    report["step_model"]["round_value"] = (
        "median over the round's steps of one step's interval on the GPU "
        "timeline (ms); mean_ms_per_step_rounds: wall time over steps"
    )
    for name, seq_lens in MODEL_BATCHES.items():
        inputs = kda_inputs(seq_lens, seed=0)
        MEANS[False].clear()
        MEANS[True].clear()
        report["step_model"]["ms_per_step"][name] = row = summarize(
            interleaved(
                {
                    side: functools.partial(
                        model_round, seq_lens, side == "patched", inputs, wait_cycles
                    )
                    for side in ("0.27.1", "patched")
                }
            ),
            "patched",
            ["0.27.1"],
        )
        # interleaved() runs a discarded warm-up round first.
        for side, patched in (("0.27.1", False), ("patched", True)):
            row[side]["mean_ms_per_step_rounds"] = MEANS[patched][1:]
        costs = model_step_costs(seq_lens, inputs, wait_cycles)
        report["step_model"]["patched_step_costs"][name] = costs
        values, paired = model_rounds_alternating(
            seq_lens, inputs, wait_cycles, costs["gpu_work_ms_per_step"]
        )
        row = summarize(values, "patched", ["0.27.1"])
        row["paired"] = paired
        report["step_model"]["ms_per_step_alternating"][name] = row
        print(name, flush=True)
    report["cpu_steal_ticks_during_run"] = cpu_steal_ticks() - steal_before
    report["repins"] = {
        "what": "before every round (and each breakdown): [pinned CPU, its "
        "workload us, median us over CPUs], in the order the run took them",
        "rounds": REPINS,
    }

    out = Path(os.environ.get("OUT", "/tmp")) / "bench.json"
    out.write_text(json.dumps(report, indent=2))
    print_tables(report)


def print_tables(report):
    def cell(entry):
        return f"{entry['median']:.1f} ({entry['min']:.1f}-{entry['max']:.1f})"

    print("shape | host us: 0.27.1 | legacy | upstream | ours (won vs upstream)")
    for name, row in report["host_us"].items():
        print(
            name,
            *(cell(row[p]) for p in ("host-0.27.1", "legacy", "upstream", "ours")),
            row["ours"]["rounds won vs upstream"],
            sep=" | ",
        )
    for view in ("host_us_alternating_with_upstream", "host_us_after_each_path"):
        print(f"shape | {view}: upstream | ours (won vs upstream)")
        for name, row in report[view].items():
            won = row["ours"]["rounds won vs upstream"]
            print(name, cell(row["upstream"]), cell(row["ours"]), won, sep=" | ")
    print("shape | kernel us: upstream | ours (won)")
    for name, row in report["kernel_us"].items():
        print(
            name,
            cell(row["upstream"]),
            cell(row["ours"]),
            row["ours"]["rounds won vs upstream"],
            sep=" | ",
        )
    for name, row in report["blocked_behind_5ms_us"].items():
        print("blocked", name, cell(row["legacy"]), cell(row["ours"]), sep=" | ")
    for view in ("ms_per_step", "ms_per_step_alternating"):
        for name, row in report["step_model"][view].items():
            before, after = row["0.27.1"]["median"], row["patched"]["median"]
            print(
                f"model {view}",
                name,
                cell(row["0.27.1"]),
                cell(row["patched"]),
                f"{(before - after) / before:.1%}",
                row["patched"]["rounds won vs 0.27.1"],
                sep=" | ",
            )
    for name, row in report["step_model"]["ms_per_step_alternating"].items():
        paired = row["paired"]
        print(
            "model paired (0.27.1 - patched, ms)",
            name,
            cell(paired),
            paired["rounds won by patched"],
            json.dumps(report["step_model"]["patched_step_costs"][name]),
            sep=" | ",
        )


if __name__ == "__main__":
    main()
