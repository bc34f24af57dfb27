"""The chunk KDA call's host cost (issue 22), on the lent GPU, in one process:

1. where the host time of one vendored call goes (each of its eight Triton
   launches through the dispatcher, and the Python and tensor work around
   them), at the step model's shapes and a 4,096-token prefill;
2. the warm-up of the precompiled launches (kda_chunk_launch.py) as the
   ROCm builder runs it, for two stand-in Kimi KDA layers (low-rank and
   full-rank output gate; their raw_beta cut by the layer's own
   split_projection): seconds, plans, binaries compiled;
3. outputs and final states of the launched path against the vendored path
   (vLLM 0.27.1's code, same process, so the same autotuned configurations)
   on random batches, bitwise, and for every batch that the plan's binaries
   and configurations are the ones Triton's dispatcher chose for it;
4. 0 compiles and 0 calls through the vendored path over serving-like
   steps after the warm-up, every call laid out as the layer lays it out
   (padded forwards, raw_beta a strided view of the projection, gathered
   batches);
5. host time per call in interleaved rounds: 0.27.1 (no metadata), k3.3
   (the vendored path with the series' metadata) and k3.5 (launched; k3.5
   is k3.4 with Akk's upper zeros written by the inter + solve kernel in
   place of a zero-fill, patch 0007);
6. GPU and host time per call of k3.3 and k3.5 in rotating blocks, and
   each kernel's GPU time (the fill k3.3 issues included);
7. the step model of gpu_bench.py with k3.3 against k3.5, alternating step
   by step, with the paired statistic and the share of k3.5 steps in which
   the GPU waited for the host.

    python3 benchmarks/gpu_kda_launch.py        # needs .gpu/ (gpu_bundle.py)
    K3_KDA_ONLY=variants python3 benchmarks/gpu_kda_launch.py   # 2, 3 on 200
               # batches, 5, 6 with coarser pieces and each kernel's GPU
               # time, and 7
    K3_KDA_ONLY=step_model python3 benchmarks/gpu_kda_launch.py  # 1 and 7
"""

import ast
import gc
import json
import math
import os
import random
import statistics
import sys
import time
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_bench as gb  # noqa: E402  (loads the patched tree)
import kda_harness  # noqa: E402
from kda_harness import (  # noqa: E402
    HEAD_DIM,
    HEADS_PER_RANK,
    RunReport,
    cu_seqlens,
    kda_inputs,
    pin_to_quiet_cpu,
    repin_to_quiet_cpu,
)
from vllm.models.kimi_k3.amd.kda_metadata_launch import (  # noqa: E402
    prepare_chunk_metadata_device as metadata,
)
from vllm.models.kimi_k3.amd.ops.third_party.kda import (  # noqa: E402
    chunk,
    chunk_intra,
    kda_chunk_forward,
    kda_chunk_launch,
    kda_chunk_plans,
    kda_launch_entry,
)

ROUNDS = gb.ROUNDS
OURS = "k3.5"  # the launched path, as the series revision names it
SHAPES = {
    "concurrency 8: 7 decodes + 1 x 1k prefill": [1] * 7 + [1024],
    "concurrency 16: 15 decodes + 1 x 1k prefill": [1] * 15 + [1024],
    "1 x 4096 prefill": [4096],
}
LOWER_BOUND = -5.0
CALL_ORDER = (
    "q",
    "k",
    "v",
    "raw_g",
    "raw_beta",
    "A_log",
    "g_bias",
    "scale",
    "initial_state",
    "output_final_state",
    "lower_bound",
    "use_qk_l2norm_in_kernel",
    "cu_seqlens",
    "chunk_indices",
    "chunk_offsets",
)


def call_args(inputs, dev, indices, offsets) -> tuple:
    values = {**inputs, "scale": None, "cu_seqlens": dev}
    values.update(chunk_indices=indices, chunk_offsets=offsets)
    return tuple(values[name] for name in CALL_ORDER)


def batch_args(lens, seed: int) -> tuple:
    """A call's arguments for one batch: random inputs, the series'
    metadata."""
    dev, host = cu_seqlens(lens)
    indices, offsets = metadata(dev, host)
    return call_args(kda_inputs(lens, seed=seed), dev, indices, offsets)


def vendored(args):
    return chunk.vendored_chunk_kda_with_fused_gate(*args)


def launched(args):
    return chunk.chunk_kda_with_fused_gate(*args)


def legacy(args):  # 0.27.1's call: no metadata, the kernel rebuilds it
    return chunk.vendored_chunk_kda_with_fused_gate(*args[:13], None, None)


def jit_kernels() -> list:
    kernels = []
    for site in kda_chunk_launch.SITES:
        for bound in (LOWER_BOUND, None):
            jit, _ = kda_chunk_launch.unwrap(kda_chunk_launch.site_kernel(site, bound))
            if jit not in kernels:
                kernels.append(jit)
    return kernels


def binaries() -> int:
    return sum(kda_harness.binaries(jit) for jit in jit_kernels())


MAX_TOKENS, MAX_SEQS = 4096, 128  # the recipe's scheduler limits
LAYER_FILE = "vllm/model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py"


def layer_split_projection():
    """KimiGatedDeltaNetAttention.split_projection as patch 0004 writes it,
    compiled from the patched file (the layer's module cannot be imported
    here: no vLLM install)."""
    path = HERE.parent / ".gpu" / "patched" / LAYER_FILE
    tree = ast.parse(path.read_text())
    (layer,) = (
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name == "KimiGatedDeltaNetAttention"
    )
    (method,) = (
        node
        for node in layer.body
        if isinstance(node, ast.FunctionDef) and node.name == "split_projection"
    )
    namespace = {"torch": torch}
    exec(compile(ast.Module([method], []), str(path), "exec"), namespace)
    return namespace["split_projection"]


class StandInLayer:
    """What the warm-up reads of a Kimi KDA layer, one rank of TP8 (12 heads
    of 128), bf16, the layer's own split_projection; the fused projection's
    width as the layer sizes it."""

    split_projection = layer_split_projection()

    def __init__(self, full_rank_gate: bool):
        heads, dim = HEADS_PER_RANK, HEAD_DIM
        self.prefix = "full-rank gate" if full_rank_gate else "low-rank gate"
        self.local_num_heads, self.head_dim = heads, dim
        self.local_projection_size = local = heads * dim
        self.use_full_rank_gate = full_rank_gate
        width = (4 if full_rank_gate else 3) * local + dim + heads
        self.in_proj_padding = -width % 16 if full_rank_gate else 0
        self.in_proj_qkvgfab = types.SimpleNamespace(
            params_dtype=torch.bfloat16,
            output_size_per_partition=width + self.in_proj_padding,
        )
        g = torch.Generator(device="cuda").manual_seed(7)
        self.A_log = torch.randn(heads, device="cuda", generator=g)
        self.dt_bias = torch.randn(local, device="cuda", generator=g)
        self.gate_lower_bound = LOWER_BOUND


LAYERS = [StandInLayer(False), StandInLayer(True)]


def warm_up() -> dict:
    before, start = binaries(), time.perf_counter()
    result = kda_chunk_launch.warm_up_chunk_kda(LAYERS, MAX_TOKENS, "cuda")
    return {
        "seconds": time.perf_counter() - start,
        "layers": result.layers,
        "kinds of call": result.kinds,
        "plans": result.plans,
        "plans_made": result.made,
        "binaries_compiled": binaries() - before,
        "configs": {
            str(key[-8:]): plan.configs
            for key, plan in list(kda_launch_entry._PLANS.items())[:1]
        },
    }


def timed_kernels():
    """Wrap each kernel's outermost dispatcher entry with a timer: returns
    (samples per site name, undo)."""
    samples: dict[str, list[float]] = {}
    undo = []
    seen = {}
    for site in kda_chunk_launch.SITES:
        kernel = kda_chunk_launch.site_kernel(site, LOWER_BOUND)
        name = "l2norm (q and k)" if site.startswith("l2norm") else site
        if id(kernel) in seen:
            continue
        seen[id(kernel)] = name
        run = kernel.run

        def timed(*args, _run=run, _name=name, **kwargs):
            start = time.perf_counter()
            out = _run(*args, **kwargs)
            samples.setdefault(_name, []).append(time.perf_counter() - start)
            return out

        kernel.run = timed
        undo.append(kernel)
    return samples, lambda: [k.__dict__.pop("run") for k in undo]


def timed_calls(call, reps: int) -> list[float]:
    """Host seconds of each of ``reps`` calls of ``call()``, the queue empty
    before each; GC off."""
    seconds = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(reps):
            torch.cuda.synchronize()
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return seconds


def breakdown(lens, reps=200) -> dict:
    """Host time of one call and of each launch in it (medians, us; the
    queue empty before each call; GC off)."""
    args = batch_args(lens, seed=0)
    vendored(args), launched(args), launched(args)
    repin_to_quiet_cpu()
    out = {}
    samples, undo = timed_kernels()
    try:
        whole = timed_calls(lambda: vendored(args), reps)
    finally:
        undo()
    launches = {name: statistics.median(s) * 1e6 for name, s in samples.items()}
    launches["l2norm (q and k)"] *= 2  # two launches a call
    total = statistics.median(whole) * 1e6
    out["vendored (k3.3)"] = {
        "whole call": total,
        "launches through Triton's dispatcher": launches,
        "sum of launches": sum(launches.values()),
        "Python and tensor work around them": total - sum(launches.values()),
    }
    # The launched path: its direct launches timed the same way.
    key = kda_chunk_plans._call_key(*kda_chunk_forward.prepare(*args))
    plan = kda_launch_entry._PLANS[key]
    direct = {}
    original = dict(plan.launches)

    def wrap(site, entry):
        run, function, packed_metadata = entry

        def timed(*launcher_args):
            start = time.perf_counter()
            run(*launcher_args)
            direct.setdefault(site, []).append(time.perf_counter() - start)

        return timed, function, packed_metadata

    plan.launches.update({s: wrap(s, f) for s, f in original.items()})
    try:
        prepared_us = timed_calls(
            lambda: kda_chunk_plans._call_key(*kda_chunk_forward.prepare(*args)), reps
        )
        whole = timed_calls(lambda: launched(args), reps)
    finally:
        plan.launches.update(original)
    launches = {s: statistics.median(v) * 1e6 for s, v in direct.items()}
    total = statistics.median(whole) * 1e6
    out[f"launched ({OURS})"] = {
        "whole call": total,
        "direct launches": launches,
        "sum of launches": sum(launches.values()),
        "argument preparation and plan key": statistics.median(prepared_us) * 1e6,
        "Python and tensor work around them": total - sum(launches.values()),
    }
    return out


def random_batch(rng: random.Random, kind: str) -> list[int]:
    if kind == "empty sequences":
        lens = [
            rng.choice([0, 0, 1, rng.randint(1, 300)])
            for _ in range(rng.randint(1, 40))
        ]
    elif kind == "more than 128 sequences":
        lens = [
            rng.choice([1, 1, 1, 0, rng.randint(1, 200)])
            for _ in range(rng.randint(129, 300))
        ]
    elif kind == "long prompt":
        lens = [1] * rng.randint(0, 16) + [rng.randint(4096, 20_000)]
    else:  # mixed: decodes, prefills, padding at the back
        lens = (
            [1] * rng.randint(0, 60)
            + [
                int(math.exp(rng.uniform(0, math.log(3000))))
                for _ in range(rng.randint(1, 4))
            ]
            + [0] * rng.choice([0, 0, rng.randint(1, 8)])
        )
    rng.shuffle(lens) if kind != "mixed" else None
    return lens


def fresh(args) -> tuple:
    return tuple(a.clone() if torch.is_tensor(a) else a for a in args)


def bitwise(batches=2000) -> dict:
    """Launched vs vendored on random batches, bitwise; and per batch, the
    plan's binaries and configurations against Triton's choice for it."""
    rng = random.Random(22)
    kinds = ["empty sequences", "more than 128 sequences", "mixed", "long prompt"]
    counts = {kind: 0 for kind in kinds}
    counts["offset cu_seqlens view"] = 0
    mismatches, plan_mismatches, through_plan = [], [], 0
    for i in range(batches):
        kind = kinds[i % 4] if i % 20 else "long prompt"
        lens = random_batch(rng, kind)
        counts[kind] += 1
        inputs = kda_inputs(lens, seed=i)
        host = torch.zeros(len(lens) + 1, dtype=torch.int32)
        host[1:] = torch.tensor(lens, dtype=torch.int64).cumsum(0)
        if i % 3 == 0:  # cu_seqlens as a view one element into a buffer
            counts["offset cu_seqlens view"] += 1
            buffer = torch.zeros(len(lens) + 2, dtype=torch.int32, device="cuda")
            buffer[1:] = host.cuda()
            dev = buffer[1:]
        else:
            dev = host.cuda()
        indices, offsets = metadata(dev, host)
        args = call_args(inputs, dev, indices, offsets)
        reference = vendored(fresh(args))
        configs = kda_chunk_plans.chosen_configs(LOWER_BOUND)
        made = kda_chunk_launch.STATS["vendored_calls"]
        ours = launched(fresh(args))
        if kda_chunk_launch.STATS["vendored_calls"] == made:
            through_plan += 1
            prepared = kda_chunk_forward.prepare(*fresh(args))
            plan = kda_launch_entry._PLANS[kda_chunk_plans._call_key(*prepared)]
            chosen, _ = kda_chunk_plans.resolve_binaries(prepared, configs)
            if any(
                chosen[s] is not plan.binaries[s] for s in kda_chunk_launch.SITES
            ) or any(configs[s].all_kwargs() != plan.configs[s] for s in configs):
                plan_mismatches.append(i)
        if not all(torch.equal(a, b) for a, b in zip(reference, ours, strict=True)):
            mismatches.append({"batch": i, "kind": kind, "lens": lens[:20]})
    return {
        "batches": batches,
        "by kind": counts,
        "through a plan": through_plan,
        "bitwise mismatches": mismatches,
        "batches whose plan differs from Triton's choice": plan_mismatches,
    }


def compiles_after_warm_up(steps=3000) -> dict:
    """Serving-like prefill steps (gpu_compiles.serving_mix, the recipe's
    4,096 tokens and 128 sequences) through the launched path, each call laid
    out as a Kimi KDA layer lays it out: a forward padded by 0-15 tokens,
    raw_beta cut from the fused projection by the layer's split_projection,
    raw_g the first tokens of the gate projection, one step in eight
    gathered (speculative decodes in the batch); the two stand-in layers in
    turn. Counts compiles, calls through the vendored path, host time."""
    from gpu_compiles import serving_mix

    rng = random.Random(11)
    padded_max = MAX_TOKENS + 16
    buffers = {}
    for layer in LAYERS:
        width = layer.in_proj_qkvgfab.output_size_per_partition
        base = kda_inputs([padded_max], seed=5)
        buffers[layer.prefix] = {
            "projected": torch.randn(padded_max, width, device="cuda").bfloat16(),
            **base,
            "initial_state": base["initial_state"].expand(MAX_SEQS, -1, -1, -1).clone(),
        }
    before, vendored_before = binaries(), kda_chunk_launch.STATS["vendored_calls"]
    host_us, kinds = [], set()
    mix = serving_mix(steps, MAX_SEQS, MAX_TOKENS, seed=3)
    for step, lens in enumerate(mix):
        if step % 50 == 0:
            torch.cuda.synchronize()
        layer = LAYERS[step % 2]
        b = buffers[layer.prefix]
        total = sum(lens)
        padded = total + rng.randint(0, 15)
        beta = layer.split_projection(b["projected"][:padded])[3]
        beta = beta.unsqueeze(0)[:, :total]
        raw_g = b["raw_g"][:, :padded][:, :total]
        if step % 8 == 4:
            index = torch.arange(total, device="cuda")
            beta, raw_g = beta.index_select(1, index), raw_g.index_select(1, index)
        inputs = {
            "q": b["q"][:, :total],
            "k": b["k"][:, :total],
            "v": b["v"][:, :total],
            "raw_g": raw_g,
            "raw_beta": beta,
            "A_log": layer.A_log,
            "g_bias": layer.dt_bias,
            "initial_state": b["initial_state"][: len(lens)],
            "lower_bound": layer.gate_lower_bound,
            "output_final_state": True,
            "use_qk_l2norm_in_kernel": True,
        }
        dev, host = cu_seqlens(lens)
        indices, offsets = metadata(dev, host)
        args = call_args(inputs, dev, indices, offsets)
        kinds.add(kda_chunk_plans.call_kind(args))
        start = time.perf_counter()
        launched(args)
        host_us.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    ordered = sorted(host_us)
    return {
        "steps": steps,
        "kinds of call met": len(kinds),
        "binaries compiled during the steps": binaries() - before,
        "vendored calls during the steps": kda_chunk_launch.STATS["vendored_calls"]
        - vendored_before,
        "host us per call: median / p99 / worst": [
            statistics.median(host_us),
            ordered[int(0.99 * steps)],
            ordered[-1],
        ],
    }


def host_rounds(lens, calls=40) -> dict:
    """Host time per call, the three sides alternating call by call (the side
    that starts rotating), queue empty before each call; per round each
    side's median."""
    args = batch_args(lens, seed=1)
    sides = {"0.27.1": legacy, "k3.3": vendored, OURS: launched}
    values = {name: [] for name in sides}
    names = list(sides)
    for r in range(ROUNDS + 1):
        repin_to_quiet_cpu()
        samples = {name: [] for name in sides}
        gc.collect()
        gc.disable()
        try:
            for i in range(calls):
                for j in range(len(names)):
                    name = names[(i + j + r) % len(names)]
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    sides[name](args)
                    samples[name].append(time.perf_counter() - start)
        finally:
            gc.enable()
        torch.cuda.synchronize()
        if r:
            for name in sides:
                values[name].append(statistics.median(samples[name]) * 1e6)
    return gb.summarize(values, OURS, ["0.27.1", "k3.3"])


def model_step(call, dev, host, inputs, wait_cycles):
    indices, offsets = metadata(dev, host)
    args = call_args(inputs, dev, indices, offsets)
    for layer in range(gb.LAYERS):
        if layer % 4 != 3:
            call(args)
        torch.cuda._sleep(wait_cycles)


def model_rounds(lens, inputs, wait_cycles, gpu_work_ms, sides, steps=gb.MODEL_STEPS):
    """gpu_bench.model_rounds_alternating with two sides ``{name: call}``,
    the first the baseline: the paired statistic is baseline minus the
    second side."""
    (base, base_call), (ours, our_call) = sides.items()
    values = {base: [], ours: []}
    paired, waited = [], {base: [], ours: []}
    for r in range(ROUNDS + 1):
        repin_to_quiet_cpu()
        first = bool(r % 2)
        order = [first, not first] * steps
        batches = iter([cu_seqlens(lens) for _ in order])
        intervals = gb.step_intervals(
            order,
            lambda side, batches=batches: model_step(
                our_call if side else base_call, *next(batches), inputs, wait_cycles
            ),
        )
        if not r:
            continue
        by_side = {True: [], False: []}
        for interval, side in zip(intervals, order, strict=True):
            by_side[side].append(interval)
        for name, side in ((base, False), (ours, True)):
            values[name].append(statistics.median(by_side[side]))
            waited[name].append(
                sum(t > 1.05 * gpu_work_ms for t in by_side[side]) / steps
            )
        paired.append(
            statistics.median(
                a - b for a, b in zip(by_side[False], by_side[True], strict=True)
            )
        )
    row = gb.summarize(values, ours, [base])
    row[f"paired ({base} - {ours}, ms)"] = {
        "median": statistics.median(paired),
        "min": min(paired),
        "max": max(paired),
        "rounds": paired,
        f"rounds won by {ours}": f"{sum(d > 0 for d in paired)}/{len(paired)}",
    }
    row["share of steps the GPU waited for the host"] = waited
    return row


def step_costs(lens, inputs, wait_cycles, call, reps=5) -> dict:
    """One step behind 200 ms of queued GPU work: its GPU work, host issue
    time, and host time per KDA call (gpu_bench.model_step_costs)."""
    queued = gb.sleep_cycles_for(200.0)
    dev, host = cu_seqlens(lens)
    gpu_ms, host_ms = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(queued)
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        gc.disable()
        try:
            issue = time.perf_counter()
            start.record()
            model_step(call, dev, host, inputs, wait_cycles)
            end.record()
            host_ms.append((time.perf_counter() - issue) * 1e3)
        finally:
            gc.enable()
        end.synchronize()
        gpu_ms.append(start.elapsed_time(end))
    return {
        "gpu_work_ms_per_step": statistics.median(gpu_ms),
        "host_issue_ms_per_step": statistics.median(host_ms),
    }


def variant_sides(layouts: bool = False) -> dict:
    """k3.3 (the vendored call) and k3.5 (launched); with ``layouts`` also
    k3.5 with its intermediates on coarser boundaries of the one allocation
    (the caching allocator's 512 bytes, 4 KiB), to see whether where they
    lie moves the GPU time."""
    sides = {"k3.3": vendored, OURS: launched}
    if layouts:
        for piece in (512, 4096):
            sides[f"{OURS}, {piece}-byte pieces"] = with_piece_bytes(piece)
    return sides


def with_piece_bytes(piece: int):
    def call(args):
        kept = kda_chunk_forward._PIECE_BYTES
        kda_chunk_forward._PIECE_BYTES = piece
        try:
            return launched(args)
        finally:
            kda_chunk_forward._PIECE_BYTES = kept

    return call


def kernel_gpu_us(lens, calls=20, rounds=ROUNDS) -> dict:
    """GPU time of each kernel of one call, k3.3 against k3.5 (us; median
    over rounds of the mean over ``calls`` calls issued behind 30 ms of
    queued work): events recorded around every launch, through Triton's
    dispatcher (k3.3) or the direct launch (k3.5), and around k3.3's
    torch.zeros of Akk (the fill k3.5 no longer issues); the two l2norm
    launches summed."""
    args = batch_args(lens, seed=2)
    vendored(args), launched(args)
    plan = kda_launch_entry._PLANS[kda_chunk_plans.call_kind(args)]
    kernels = {}
    for site in kda_chunk_launch.SITES:
        kernel = kda_chunk_launch.site_kernel(site, LOWER_BOUND)
        kernels.setdefault(id(kernel), (site, kernel))
    events = []

    def timed(site, run):
        name = "l2norm (q and k)" if site.startswith("l2norm") else site

        def wrapper(*a, **kw):
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            out = run(*a, **kw)
            end.record()
            events.append((name, start, end))
            return out

        return wrapper

    ahead = gb.sleep_cycles_for(30.0)
    values = {"k3.3": {}, OURS: {}}
    for r in range(rounds + 1):
        for side in ("k3.3", OURS) if r % 2 else (OURS, "k3.3"):
            events.clear()
            original = dict(plan.launches)
            if side == "k3.3":
                for site, kernel in kernels.values():
                    kernel.run = timed(site, kernel.run)
                chunk_intra.torch = types.SimpleNamespace(
                    **{**vars(torch), "zeros": timed("Akk fill", torch.zeros)}
                )
            else:
                plan.launches.update(
                    {s: (timed(s, run), f, m) for s, (run, f, m) in original.items()}
                )
            try:
                torch.cuda.synchronize()
                torch.cuda._sleep(ahead)
                for _ in range(calls):
                    (vendored if side == "k3.3" else launched)(args)
                torch.cuda.synchronize()
            finally:
                for _, kernel in kernels.values():
                    kernel.__dict__.pop("run", None)
                chunk_intra.torch = torch
                plan.launches.update(original)
            if r:
                per: dict[str, float] = {}
                for name, start, end in events:
                    per[name] = per.get(name, 0.0) + start.elapsed_time(end) * 1e3
                for name, us in per.items():
                    values[side].setdefault(name, []).append(us / calls)
    return {
        side: {name: statistics.median(v) for name, v in sites.items()}
        for side, sites in values.items()
    }


def variant_rounds(sides, lens, calls=20, rounds=2 * ROUNDS) -> dict:
    """GPU and host time per call of each side, the sides in rotating order,
    a block of ``calls`` calls each per round (us; per side the median over
    rounds of the block's value). GPU: each block issued behind 30 ms of
    queued work, so the host is ahead and the calls run back to back on the
    GPU, timed with events (the mean of the block). Host: a block with the
    queue empty before each call (timed_calls; the median of the block)."""
    args = batch_args(lens, seed=2)
    for call in sides.values():  # plans
        call(args), call(args)
    ahead = gb.sleep_cycles_for(30.0)
    names = list(sides)
    gpu_us = {name: [] for name in names}
    host_us = {name: [] for name in names}
    for r in range(rounds + 1):
        repin_to_quiet_cpu()
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            call = sides[name]
            torch.cuda.synchronize()
            torch.cuda._sleep(ahead)
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            for _ in range(calls):
                call(args)
            end.record()
            end.synchronize()
            host = statistics.median(timed_calls(lambda c=call: c(args), calls))
            if r:
                gpu_us[name].append(start.elapsed_time(end) * 1e3 / calls)
                host_us[name].append(host * 1e6)
    others = [name for name in names if name != OURS]
    return {
        "gpu us per call": gb.summarize(gpu_us, OURS, others),
        "host us per call, back to back": gb.summarize(host_us, OURS, others),
    }


def variants(model_sides: tuple[str, ...] = (), layouts: bool = False) -> dict:
    """variant_rounds at the step model's shapes and a 4,096-token prefill
    (with ``layouts``, also the sides of coarser pieces), each kernel's GPU
    time there; then the step model with k3.3 against each side in
    ``model_sides``."""
    sides = variant_sides(layouts)
    out = {name: variant_rounds(sides, lens) for name, lens in SHAPES.items()}
    for name, lens in SHAPES.items():
        out[f"GPU us per kernel: {name}"] = kernel_gpu_us(lens)
    for side in model_sides:
        if side in sides:
            out[f"step model, k3.3 vs {side}"] = step_model_vs_k33(side, sides[side])
    return out


def step_model_vs_k33(name: str, call) -> dict:
    """The step model of gpu_bench.py with k3.3 against ``call`` (model_rounds),
    per batch, with each side's step costs (GPU work, host issue time)."""
    wait_cycles = gb.sleep_cycles_for(gb.OTHER_GPU_MS / gb.LAYERS)
    out = {}
    for batch, lens in gb.MODEL_BATCHES.items():
        inputs = kda_inputs(lens, seed=0)
        sides = {"k3.3": vendored, name: call}
        costs = {
            side: step_costs(lens, inputs, wait_cycles, c) for side, c in sides.items()
        }
        row = model_rounds(
            lens, inputs, wait_cycles, costs[name]["gpu_work_ms_per_step"], sides
        )
        row["costs"] = costs
        out[batch] = row
        paired = row[f"paired (k3.3 - {name}, ms)"][f"rounds won by {name}"]
        waited = row["share of steps the GPU waited for the host"]
        print(batch, json.dumps(costs), paired, waited, flush=True)
    return out


def main():
    report = RunReport(
        "kda_launch.json", **{"direct launches available": kda_chunk_launch.DIRECT}
    )
    save = report.save

    report["host_cpu"] = pin_to_quiet_cpu()
    report["warm_up"] = warm_up()
    print("warm-up", json.dumps(report["warm_up"])[:600], flush=True)
    save()
    if os.environ.get("K3_KDA_ONLY") == "variants":  # this part alone
        report["bitwise"] = bitwise(200)
        print("bitwise", json.dumps(report["bitwise"])[:600], flush=True)
        report["host_us_per_call"] = {n: host_rounds(x) for n, x in SHAPES.items()}
        report["variants"] = variants((OURS,), layouts=True)
        print(json.dumps(report["variants"], indent=1, default=str), flush=True)
        save()
        return
    if os.environ.get("K3_KDA_ONLY") == "step_model":  # this part alone
        report[f"step_model_k3.3_vs_{OURS}"] = step_model_vs_k33(OURS, launched)
        save()
        return
    # Straight after the warm-up, before any other call can make a plan.
    report["compiles_after_warm_up"] = compiles_after_warm_up()
    print("compiles", json.dumps(report["compiles_after_warm_up"]), flush=True)
    save()
    report["breakdown_us"] = {name: breakdown(lens) for name, lens in SHAPES.items()}
    print(json.dumps(report["breakdown_us"], indent=1), flush=True)
    save()
    report["bitwise"] = bitwise(int(os.environ.get("K3_BITWISE_BATCHES", 2000)))
    print("bitwise", json.dumps(report["bitwise"])[:600], flush=True)
    save()
    report["host_us_per_call"] = {}
    for name, lens in SHAPES.items():
        row = host_rounds(lens)
        report["host_us_per_call"][name] = row
        print(name, {s: round(row[s]["median"], 1) for s in row}, row[OURS], flush=True)
        save()
    report["variants"] = variants()
    print("variants", json.dumps(report["variants"], default=str)[:2000], flush=True)
    save()
    report[f"step_model_k3.3_vs_{OURS}"] = step_model_vs_k33(OURS, launched)
    save()
    failures = [
        claim
        for claim, holds in {
            "direct launches": kda_chunk_launch.DIRECT,
            "bitwise equal": not report["bitwise"]["bitwise mismatches"],
            "plans are Triton's choice": not report["bitwise"][
                "batches whose plan differs from Triton's choice"
            ],
            "no compile after warm-up": report["compiles_after_warm_up"][
                "binaries compiled during the steps"
            ]
            == 0,
            "no vendored call after warm-up": report["compiles_after_warm_up"][
                "vendored calls during the steps"
            ]
            == 0,
        }.items()
        if not holds
    ]
    report["failures"] = failures
    save()
    sys.exit(f"FAILED: {failures}" if failures else 0)


if __name__ == "__main__":
    main()
