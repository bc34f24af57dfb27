"""Issue 28 item 5 on the lent GPU: what the decode peel costs, side by side
in one process, paired, three revisions of the non-spec mixed step:

- k3.5: one chunk KDA call over the whole non-spec batch (decodes as 1-token
  sequences) through the launched path, with the k3.5 device metadata for
  that batch (built once per step);
- k3.6: fused_recurrent_kda for the decodes (state pool and state indices,
  ``out=`` rows of the output) through series k3.6's recurrent launch
  (kda_chunk_launch_k36, bundled from git: the full layout check, argument
  list and plan key at every call, on views of the decodes' rows) plus the
  launched chunk KDA call over the prefill slice, with the device metadata
  for prefill_query_start_loc (built once per step, as the builder does);
- the series as it stands (named by its revision; k3.7 and on): the same
  with its recurrent launch (handed the whole batch's tensors as patch
  0004 hands them, matched to its plan by a layout signature).

All three leave out what the layer does around the ops on every side alike
(gather_initial_states, the state write-back). Measured:

1. compiles and vendored calls over 3,000 serving-like steps after the
   warm-up (gpu_compiles.serving_mix, each step peeled as the layer peels
   it), the chunk kernels' and the recurrent kernel's apart: the chunk
   warm-up the builder makes when built, then the recurrent warm-up it
   makes at its first build (kda_chunk_launch.warm_up_recurrent_kda, for
   the stand-in layers' state pools and state indices); the warm-up's
   plans checked bitwise against the wrapper;
2. the recurrent launch of k3.6 and of the series checked bitwise against the
   wrapper at the mixed shapes (plans made by a first call);
3. GPU and host time per layer call of each side at the bench's shapes
   (7 and 15 decodes + 1 x 1k, 31 decodes + 512, 1 x 4096), rotating
   blocks; the recurrent calls and the chunk slice apart too;
4. the recurrent call's host cost: the wrapper, k3.6's and the series' launch,
   Triton's dispatcher, and a direct launch of the same binary (checked
   bitwise against the dispatcher's output);
5. gpu_bench.py's step model (64 layers, KDA in 48, a calibrated GPU wait)
   with k3.5 and the series alternating step by step: per-round medians, the
   paired statistic, the share of steps the GPU waited for the host.

    python3 benchmarks/gpu_peel.py      # needs .gpu/ (gpu_bundle.py)
    K3_PEEL_ONLY=step_model python3 benchmarks/gpu_peel.py  # the warm-up, 5
"""

import functools
import gc
import json
import os
import random
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_bench as gb  # noqa: E402  (loads the patched tree)
import gpu_kda_launch as gkl  # noqa: E402
import kda_harness  # noqa: E402
from kda_harness import (  # noqa: E402
    REPO,
    RunReport,
    cu_seqlens,
    kda_inputs,
    pin_to_quiet_cpu,
    repin_to_quiet_cpu,
)
from launch_costs import host_us  # noqa: E402
from vllm.models.kimi_k3.amd.ops.third_party.kda import (  # noqa: E402
    fused_recurrent,
    kda_chunk_launch,
    kda_chunk_launch_k36,
    kda_chunk_plans,
    kda_direct_launch,
)

from k3rocm.patchtool.lines import default_line_dir  # noqa: E402
from k3rocm.patchtool.series import Series  # noqa: E402

metadata = gkl.metadata
ROUNDS = gb.ROUNDS
# k3.5 (no peel) and k3.6 (its launch module read from git by gpu_bundle.py)
# against the series as it stands, named by its revision.
BEFORE, PREVIOUS = "k3.5", "k3.6"
AFTER = Series(default_line_dir(REPO / "patches")).revision
# The step model's other side: k3.5, or with K3_PEEL_BEFORE=0.27.1 vLLM
# 0.27.1's layer (the builder's host metadata and its copy, then each KDA
# call building its own metadata with a device sync, as gpu_bench.py's).
STEP_BEFORE = os.environ.get("K3_PEEL_BEFORE", BEFORE)
SHAPES = {
    "7 decodes + 1 x 1k prefill": [1] * 7 + [1024],
    "15 decodes + 1 x 1k prefill": [1] * 15 + [1024],
    "31 decodes + 1 x 512 prefill": [1] * 31 + [512],
    "1 x 4096 prefill": [4096],
}
SLOTS = 256
RECURRENT_JIT = kda_chunk_launch.unwrap(fused_recurrent.fused_recurrent_kda_fwd_kernel)[
    0
]


def recurrent_binaries() -> int:
    return kda_harness.binaries(RECURRENT_JIT)


class Batch:
    """One non-spec step's tensors, as the layer has them: inputs of the
    whole batch, a state pool, state indices, the output buffer."""

    def __init__(self, lens, seed=0):
        self.lens = lens
        self.decodes = next((i for i, n in enumerate(lens) if n != 1), len(lens))
        self.inputs = kda_inputs(lens, seed=seed)
        total = sum(lens)
        self.total = total
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        self.pool = torch.randn(
            SLOTS,
            gkl.HEADS_PER_RANK,
            gkl.HEAD_DIM,
            gkl.HEAD_DIM,
            device="cuda",
            generator=g,
        )
        self.slots = (
            torch.randperm(SLOTS - 1, device="cuda", generator=g)[: len(lens)] + 1
        ).to(torch.int32)
        self.out = torch.empty(
            1,
            total,
            gkl.HEADS_PER_RANK,
            gkl.HEAD_DIM,
            dtype=torch.bfloat16,
            device="cuda",
        )
        self.dev, self.host = cu_seqlens(lens)
        d = self.decodes
        self.split = int(self.host[d])
        x = self.inputs
        self.prefill = {
            name: (
                x[name][:, self.split :]
                if name in ("q", "k", "v", "raw_g", "raw_beta")
                else x[name]
            )
            for name in x
        }
        self.prefill["initial_state"] = x["initial_state"][d:]

    def metadata_before(self):
        return metadata(self.dev, self.host)

    def metadata_after(self):
        d = self.decodes
        dev = self.dev[d:] - self.dev[d]  # prefill_query_start_loc (builder)
        host = self.host[d:] - self.host[d]
        return dev, host, metadata(dev, host)

    def before_args(self, meta):
        return gkl.call_args(self.inputs, self.dev, *meta)

    def after_args(self, meta):
        dev, _, (indices, offsets) = meta
        return gkl.call_args(self.prefill, dev, indices, offsets)

    def recurrent(self, version=AFTER):
        """The decodes' call as patch 0004 makes it in ``version`` (its
        recurrent launch), or the wrapper itself (``"wrapper"``)."""
        x, s, d = self.inputs, self.split, self.decodes
        wrapper = fused_recurrent.fused_recurrent_kda
        if version == AFTER:
            kda_chunk_launch.recurrent_kda_launched(
                wrapper,
                d,
                s,
                q=x["q"],
                k=x["k"],
                v=x["v"],
                raw_g=x["raw_g"],
                raw_beta=x["raw_beta"],
                A_log=x["A_log"],
                dt_bias=x["g_bias"],
                lower_bound=x["lower_bound"],
                initial_state=self.pool,
                cu_seqlens=self.dev,
                ssm_state_indices=self.slots,
                out=self.out,
            )
            return
        call = wrapper
        if version == PREVIOUS:
            call = functools.partial(kda_chunk_launch_k36.recurrent_kda_launched, call)
        call(
            q=x["q"][:, :s],
            k=x["k"][:, :s],
            v=x["v"][:, :s],
            raw_g=x["raw_g"][:, :s],
            raw_beta=x["raw_beta"][:, :s],
            A_log=x["A_log"],
            dt_bias=x["g_bias"],
            lower_bound=x["lower_bound"],
            initial_state=self.pool,
            cu_seqlens=self.dev[: d + 1],
            ssm_state_indices=self.slots[:d],
            out=self.out[:, :s],
        )

    def layer_before(self, args):
        return gkl.launched(args)

    def layer_after(self, args, version=AFTER):
        if self.decodes:
            self.recurrent(version)
        return gkl.launched(args)


# ------------------------------------------------------------- compiles


def compiles_after_warm_up(steps=3000) -> dict:
    """gpu_kda_launch.compiles_after_warm_up with each step peeled as patch
    0004 peels it (one step in eight stands for a step with speculative
    decodes: gathered, not peeled): the decodes through
    recurrent_kda_launched (the whole batch's tensors, a state pool per
    layer, a column of a block table as state indices), the prefill slice
    (after the decodes, so its pointers move) through the launched path
    with its device metadata; zero-length
    padding stays in the slice. Before the steps, what the ROCm builder
    does: the chunk warm-up (gkl.warm_up, run by the caller) and, at its
    first build, warm_up_recurrent_kda for the layers' pools and the block
    table. Chunk and recurrent compiles are counted apart."""
    from gpu_compiles import serving_mix

    rng = random.Random(11)
    padded_max = gkl.MAX_TOKENS + 16
    buffers = {}
    for layer in gkl.LAYERS:
        width = layer.in_proj_qkvgfab.output_size_per_partition
        base = kda_inputs([padded_max], seed=5)
        buffers[layer.prefix] = {
            "projected": torch.randn(padded_max, width, device="cuda").bfloat16(),
            **base,
            "initial_state": base["initial_state"]
            .expand(gkl.MAX_SEQS, -1, -1, -1)
            .clone(),
            # The state pool as vLLM binds it: a view into padded pages.
            "pool": torch.randn(
                gkl.MAX_SEQS + 1,
                2,
                gkl.HEADS_PER_RANK,
                gkl.HEAD_DIM,
                gkl.HEAD_DIM,
                device="cuda",
            )[:, 1],
            "out": torch.empty(
                1,
                padded_max,
                gkl.HEADS_PER_RANK,
                gkl.HEAD_DIM,
                dtype=torch.bfloat16,
                device="cuda",
            ),
        }
    # A block table of 4 blocks per request; the state block is column 0.
    table = torch.zeros(gkl.MAX_SEQS, 4, dtype=torch.int32, device="cuda")
    table[:, 0] = torch.arange(1, gkl.MAX_SEQS + 1, device="cuda")
    slots = table[:, 0]
    rec_start = recurrent_binaries()
    warm = kda_chunk_launch.warm_up_recurrent_kda(
        gkl.LAYERS, [buffers[x.prefix]["pool"] for x in gkl.LAYERS], slots
    )
    warm_up = {
        "seconds": warm.seconds,
        "layers": warm.layers,
        "kinds": warm.kinds,
        "plans": warm.plans,
        "made": warm.made,
        "binaries compiled": recurrent_binaries() - rec_start,
    }
    before, vendored_before = gkl.binaries(), kda_chunk_launch.STATS["vendored_calls"]
    refused_before = kda_chunk_launch.STATS["plans_refused"]
    rec_stats_before = dict(kda_chunk_launch.RECURRENT_STATS)
    rec_before = recurrent_binaries()
    rec_by_step = []
    host_us, kinds, mixed = [], set(), 0
    checked = None
    for step, lens in enumerate(
        serving_mix(steps, gkl.MAX_SEQS, gkl.MAX_TOKENS, seed=3)
    ):
        if step % 50 == 0:
            torch.cuda.synchronize()
        layer = gkl.LAYERS[step % 2]
        b = buffers[layer.prefix]
        decodes = next((i for i, n in enumerate(lens) if n != 1), len(lens))
        if step % 8 == 4:
            # A step with speculative decodes: the layer gathers the other
            # tokens (dense copies) and peels nothing (patch 0004).
            decodes = 0
        total = sum(lens)
        padded = total + rng.randint(0, 15)
        beta = layer.split_projection(b["projected"][:padded])[3].unsqueeze(0)[
            :, :total
        ]
        raw_g = b["raw_g"][:, :padded][:, :total]
        if step % 8 == 4:
            index = torch.arange(total, device="cuda")
            beta, raw_g = beta.index_select(1, index), raw_g.index_select(1, index)
        dev, host = cu_seqlens(lens)
        recurrent = {
            "q": b["q"][:, :total],
            "k": b["k"][:, :total],
            "v": b["v"][:, :total],
            "raw_g": raw_g,
            "raw_beta": beta,
            "A_log": layer.A_log,
            "dt_bias": layer.dt_bias,
            "lower_bound": layer.gate_lower_bound,
            "initial_state": b["pool"],
            "cu_seqlens": dev,
            "ssm_state_indices": slots,
            "out": b["out"],
        }
        if checked is None and decodes >= 4:
            checked = recurrent_plan_bitwise(decodes, recurrent)
        start = time.perf_counter()
        if decodes:
            mixed += 1
            kda_chunk_launch.recurrent_kda_launched(
                fused_recurrent.fused_recurrent_kda, decodes, decodes, **recurrent
            )
        pdev, phost = dev[decodes:] - dev[decodes], host[decodes:] - host[decodes]
        indices, offsets = metadata(pdev, phost)
        inputs = {
            "q": b["q"][:, decodes:total],
            "k": b["k"][:, decodes:total],
            "v": b["v"][:, decodes:total],
            "raw_g": raw_g[:, decodes:],
            "raw_beta": beta[:, decodes:],
            "A_log": layer.A_log,
            "g_bias": layer.dt_bias,
            "initial_state": b["initial_state"][: len(lens) - decodes],
            "lower_bound": layer.gate_lower_bound,
            "output_final_state": True,
            "use_qk_l2norm_in_kernel": True,
        }
        args = gkl.call_args(inputs, pdev, indices, offsets)
        kinds.add(kda_chunk_plans.call_kind(args))
        gkl.launched(args)
        host_us.append((time.perf_counter() - start) * 1e6)
        rec_by_step.append(recurrent_binaries() - rec_before)
    torch.cuda.synchronize()
    ordered = sorted(host_us)
    first_compiles = [i for i in range(1, steps) if rec_by_step[i] > rec_by_step[i - 1]]
    if rec_by_step and rec_by_step[0]:
        first_compiles.insert(0, 0)
    return {
        "steps": steps,
        "recurrent warm-up (the builder's first build)": warm_up,
        "warm-up plan bitwise equal to the wrapper (a mixed step)": checked,
        "mixed steps (decodes peeled)": mixed,
        "chunk kinds of call met": len(kinds),
        "chunk binaries compiled during the steps": gkl.binaries() - before,
        "chunk vendored calls during the steps": kda_chunk_launch.STATS[
            "vendored_calls"
        ]
        - vendored_before,
        "chunk plans refused during the steps": kda_chunk_launch.STATS["plans_refused"]
        - refused_before,
        "recurrent binaries compiled during the steps": rec_by_step[-1],
        "recurrent launch STATS during the steps": {
            k: v - rec_stats_before[k]
            for k, v in kda_chunk_launch.RECURRENT_STATS.items()
        },
        "steps at which the recurrent kernel compiled": first_compiles,
        "host us per step's layer call (recurrent + chunk): median / p99 / worst": [
            statistics.median(host_us),
            ordered[int(0.99 * steps)],
            ordered[-1],
        ],
    }


def recurrent_plan_bitwise(decodes: int, call: dict) -> dict:
    """One step's decodes through recurrent_kda_launched (the warm-up's plan)
    and through the wrapper, from the same pool: outputs and pool bitwise."""
    pool, out = call["initial_state"], call["out"]
    start = pool.clone()
    results = {}
    for side in ("wrapper", "launched"):
        pool.copy_(start)
        out.fill_(float("nan"))
        if side == "launched":
            kda_chunk_launch.recurrent_kda_launched(
                fused_recurrent.fused_recurrent_kda, decodes, decodes, **call
            )
        else:
            n = decodes
            fused_recurrent.fused_recurrent_kda(
                **{
                    name: value[:, :n]
                    if name in ("q", "k", "v", "raw_g", "raw_beta", "out")
                    else value
                    for name, value in call.items()
                    if name not in ("cu_seqlens", "ssm_state_indices")
                },
                cu_seqlens=call["cu_seqlens"][: n + 1],
                ssm_state_indices=call["ssm_state_indices"][:n],
            )
        torch.cuda.synchronize()
        results[side] = (out[:, :decodes].clone(), pool.clone())
    pool.copy_(start)
    return {
        "decodes": decodes,
        "bitwise": all(
            torch.equal(x, y)
            for x, y in zip(results["wrapper"], results["launched"], strict=True)
        ),
        "stats": dict(kda_chunk_launch.RECURRENT_STATS),
    }


# ------------------------------------------------------- per-call rounds


def per_call_rounds(lens, calls=20, rounds=2 * ROUNDS) -> dict:
    """GPU and host time per layer call, sides rotating (gpu_kda_launch.
    variant_rounds' method): k3.5, k3.6, the series, and the peeled sides'
    recurrent calls and chunk-slice call alone."""
    b = Batch(lens, seed=2)
    mb, ma = b.metadata_before(), b.metadata_after()
    ab, aa = b.before_args(mb), b.after_args(ma)
    sides = {
        BEFORE: lambda: b.layer_before(ab),
        PREVIOUS: lambda: b.layer_after(aa, PREVIOUS),
        AFTER: lambda: b.layer_after(aa, AFTER),
    }
    if b.decodes:
        sides[f"{PREVIOUS}: recurrent alone"] = functools.partial(b.recurrent, PREVIOUS)
        sides[f"{AFTER}: recurrent alone"] = functools.partial(b.recurrent, AFTER)
        sides["chunk slice alone"] = lambda: gkl.launched(aa)
    for call in sides.values():
        call(), call()
    ahead = gb.sleep_cycles_for(30.0)
    names = list(sides)
    gpu_us = {n: [] for n in names}
    host_us = {n: [] for n in names}
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
                call()
            end.record()
            end.synchronize()
            host = statistics.median(gkl.timed_calls(call, calls))
            if r:
                gpu_us[name].append(start.elapsed_time(end) * 1e3 / calls)
                host_us[name].append(host * 1e6)

    def paired(samples, side, base):
        diffs = [a - c for a, c in zip(samples[side], samples[base], strict=True)]
        return [statistics.median(diffs), min(diffs), max(diffs)]

    return {
        "gpu us per call": {n: statistics.median(v) for n, v in gpu_us.items()},
        "host us per call, queue empty": {
            n: statistics.median(v) for n, v in host_us.items()
        },
        "gpu us per round": gpu_us,
        "host us per round": host_us,
        **{
            f"paired {kind} us ({AFTER} - {base}), median / min / max": paired(
                samples, AFTER, base
            )
            for kind, samples in (("gpu", gpu_us), ("host", host_us))
            for base in (PREVIOUS, BEFORE)
        },
    }


# ------------------------------------------ recurrent launch, bitwise


def recurrent_launch_bitwise() -> dict:
    """Per mixed shape and revision (k3.6, the series): outputs and state pool of
    patch 0005's launch of the recurrent kernel (its plan made by a first
    call) against the wrapper's, from the same pool, bitwise."""
    result = {}
    for name, lens in SHAPES.items():
        if lens[0] != 1:
            continue
        b = Batch(lens, seed=5)
        start = b.pool.clone()
        row = {}
        for version in (PREVIOUS, AFTER):
            b.recurrent(version)  # a kind's first call: the wrapper, a plan
            outs = {}
            for side in ("wrapper", version):
                b.pool.copy_(start)
                b.out.fill_(float("nan"))
                b.recurrent(side)
                torch.cuda.synchronize()
                s = b.split
                outs[side] = (b.out[:, :s].clone(), b.pool.clone())
            row[version] = all(
                torch.equal(x, y)
                for x, y in zip(outs["wrapper"], outs[version], strict=True)
            )
        row["stats after (k3.6)"] = dict(kda_chunk_launch_k36.RECURRENT_STATS)
        row[f"stats after ({AFTER})"] = dict(kda_chunk_launch.RECURRENT_STATS)
        result[name] = row
    return result


# ------------------------------------------------ recurrent host cost


def recurrent_host_cost(lens, reps=400) -> dict:
    """Host time of the recurrent call: the wrapper fused_recurrent_kda
    (Triton's dispatcher inside), and the same binary launched directly with
    kda_chunk_launch's launcher (no dispatcher: no argument binding,
    specialization key or cache lookup); the direct launch's output and
    states checked bitwise against the dispatcher's."""
    b = Batch(lens, seed=3)
    b.recurrent(PREVIOUS)
    b.recurrent(AFTER)
    torch.cuda.synchronize()
    x, s, d = b.inputs, b.split, b.decodes
    q, k, v = x["q"][:, :s], x["k"][:, :s], x["v"][:, :s]
    g, beta, out = x["raw_g"][:, :s], x["raw_beta"][:, :s], b.out[:, :s]
    cu, idx = b.dev[: d + 1], b.slots[:d]
    H, K = q.shape[2], q.shape[3]
    values = {
        "q": q,
        "k": k,
        "v": v,
        "g": g,
        "beta": beta,
        "A_log": x["A_log"],
        "dt_bias": x["g_bias"],
        "out": out,
        "state": b.pool,
        "cu_seqlens": cu,
        "state_indices": idx,
        "num_accepted_tokens": None,
        "lower_bound": x["lower_bound"],
        "scale": K**-0.5,
        "N": d,
        "T": s,
        "H": H,
        "K": K,
        "V": K,
        "BK": K,
        "BV": 32,
        "stride_qkv_token": q.stride(1),
        "stride_g_token": g.stride(1),
        "stride_beta_token": beta.stride(1),
        "stride_out_token": out.stride(1),
        "stride_state_token": b.pool.stride(0),
        "stride_indices_seq": idx.stride(0),
        "IS_SPEC_DECODING": False,
        "USE_QK_L2NORM_IN_KERNEL": True,
        "USE_GATE_IN_KERNEL": True,
        "APPLY_BETA_SIGMOID": True,
        # the kernel's heuristics (fused_recurrent.py)
        "HAS_DT_BIAS": True,
        "USE_LOWER_BOUND": True,
        "num_stages": 2,  # a constexpr of the kernel and its launch option
    }
    args = [values[name] for name in RECURRENT_JIT.arg_names]
    grid = (-(-K // 32) * d * H, 1, 1)
    kwargs = dict(zip(RECURRENT_JIT.arg_names, args, strict=True))
    binary = fused_recurrent.fused_recurrent_kda_fwd_kernel[grid[:1]](
        **kwargs, num_warps=4
    )
    direct = kda_direct_launch._direct(binary)
    if direct is None:
        return {"direct launch": "not available in this Triton"}
    run, function, packed = direct

    def launch_direct():
        stream = torch.cuda.current_stream().cuda_stream
        run(
            grid[0], grid[1], grid[2], stream, function, packed, None, None, None, *args
        )

    kwargs = dict(zip(RECURRENT_JIT.arg_names, args, strict=True))

    def dispatcher():
        return fused_recurrent.fused_recurrent_kda_fwd_kernel[grid[:1]](
            **kwargs, num_warps=4
        )

    pool0 = b.pool.clone()
    b.pool.copy_(pool0)
    b.recurrent("wrapper")
    out_ref, pool_ref = b.out[:, :s].clone(), b.pool.clone()
    b.pool.copy_(pool0)
    b.out.fill_(float("nan"))
    launch_direct()
    torch.cuda.synchronize()
    bitwise = bool(torch.equal(b.out[:, :s], out_ref)) and bool(
        torch.equal(b.pool, pool_ref)
    )
    parts = {
        "wrapper fused_recurrent_kda": functools.partial(b.recurrent, "wrapper"),
        "k3.6 recurrent_kda_launched": functools.partial(b.recurrent, PREVIOUS),
        f"{AFTER} recurrent_kda_launched": functools.partial(b.recurrent, AFTER),
        "kernel[grid](...)": dispatcher,
        "direct launch": launch_direct,
    }
    repin_to_quiet_cpu()
    gc.collect()
    gc.disable()
    try:
        medians = host_us(parts, reps)
    finally:
        gc.enable()
    return {
        "host us (median)": medians,
        "direct launch bitwise equal to the wrapper's result": bitwise,
        "binaries of the recurrent kernel": recurrent_binaries(),
    }


# ------------------------------------------------------------ step model


def model_step(b: Batch, after: bool, wait_cycles, layer_host_us=None):
    if after:
        args = b.after_args(b.metadata_after())
        call = b.layer_after
    elif STEP_BEFORE == "0.27.1":
        gb.host_0271(b.dev, b.host)
        args = None

        def call(_args):
            gb.kda_ops.chunk_kda_with_fused_gate(**b.inputs, cu_seqlens=b.dev)

    else:
        args = b.before_args(b.metadata_before())
        call = b.layer_before
    for layer in range(gb.LAYERS):
        if layer % 4 != 3:
            start = time.perf_counter()
            call(args)
            if layer_host_us is not None and layer:
                layer_host_us.append((time.perf_counter() - start) * 1e6)
        torch.cuda._sleep(wait_cycles)


def step_costs(b, after, wait_cycles, reps=5) -> dict:
    queued = gb.sleep_cycles_for(200.0)
    gpu_ms, host_ms, layer_us = [], [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(queued)
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        gc.disable()
        try:
            issue = time.perf_counter()
            start.record()
            model_step(b, after, wait_cycles, layer_us)
            end.record()
            host_ms.append((time.perf_counter() - issue) * 1e3)
        finally:
            gc.enable()
        end.synchronize()
        gpu_ms.append(start.elapsed_time(end))
    return {
        "gpu_work_ms_per_step": statistics.median(gpu_ms),
        "host_issue_ms_per_step": statistics.median(host_ms),
        "host_us_per_kda_layer_call_behind_queue": statistics.median(layer_us),
    }


def model_rounds(b, wait_cycles, gpu_work, steps=gb.MODEL_STEPS) -> dict:
    values = {STEP_BEFORE: [], AFTER: []}
    waited = {STEP_BEFORE: [], AFTER: []}
    paired = []
    for r in range(ROUNDS + 1):
        repin_to_quiet_cpu()
        first = bool(r % 2)
        order = [first, not first] * steps
        intervals = gb.step_intervals(
            order, lambda side: model_step(b, side, wait_cycles)
        )
        if not r:
            continue
        by = {True: [], False: []}
        for t, side in zip(intervals, order, strict=True):
            by[side].append(t)
        for name, side in ((STEP_BEFORE, False), (AFTER, True)):
            values[name].append(statistics.median(by[side]))
            waited[name].append(
                sum(t > 1.05 * gpu_work[name] for t in by[side]) / steps
            )
        paired.append(
            statistics.median(a - c for a, c in zip(by[True], by[False], strict=True))
        )
    return {
        "step ms (median over rounds of the round medians)": {
            n: statistics.median(v) for n, v in values.items()
        },
        "step ms per round": values,
        f"paired ({AFTER} - {STEP_BEFORE}, ms): median / min / max": [
            statistics.median(paired),
            min(paired),
            max(paired),
        ],
        "paired per round": paired,
        f"rounds {AFTER} not slower": f"{sum(d <= 0 for d in paired)}/{len(paired)}",
        "share of steps the GPU waited for the host (per round)": waited,
        "share of steps the GPU waited for the host (all rounds)": {
            n: statistics.mean(v) for n, v in waited.items()
        },
    }


def step_model() -> dict:
    wait_cycles = gb.sleep_cycles_for(gb.OTHER_GPU_MS / gb.LAYERS)
    out = {}
    for name, lens in SHAPES.items():
        b = Batch(lens, seed=0)
        for side in (False, True):  # plans for the step's calls
            model_step(b, side, wait_cycles)
        costs = {
            STEP_BEFORE: step_costs(b, False, wait_cycles),
            AFTER: step_costs(b, True, wait_cycles),
        }
        row = model_rounds(
            b, wait_cycles, {n: c["gpu_work_ms_per_step"] for n, c in costs.items()}
        )
        row["costs"] = costs
        out[name] = row
        print(
            name,
            json.dumps(costs),
            row[f"paired ({AFTER} - {STEP_BEFORE}, ms): median / min / max"],
            row["share of steps the GPU waited for the host (all rounds)"],
            flush=True,
        )
    return out


def main():
    report = RunReport(
        "peel.json", **{"direct launches available": kda_chunk_launch.DIRECT}
    )
    save = report.save

    report["host_cpu"] = pin_to_quiet_cpu()
    if os.environ.get("K3_PEEL_ONLY") == "per_call":  # parts 3 and 4 alone
        for name, lens in SHAPES.items():
            row = per_call_rounds(lens)
            report[f"per_call: {name}"] = row
            print(name, json.dumps({k: v for k, v in row.items() if "round" not in k}))
        report["recurrent_host_cost"] = {
            name: recurrent_host_cost(lens)
            for name, lens in SHAPES.items()
            if lens[0] == 1
        }
        print("recurrent", json.dumps(report["recurrent_host_cost"]), flush=True)
        report.path = report.path.with_name("peel-per-call.json")
        report.save()
        return
    if os.environ.get("K3_PEEL_ONLY") == "recurrent":  # part 4 alone
        report["recurrent_host_cost"] = {
            name: recurrent_host_cost(lens)
            for name, lens in SHAPES.items()
            if lens[0] == 1
        }
        print("recurrent", json.dumps(report["recurrent_host_cost"]), flush=True)
        report.path = report.path.with_name("peel-recurrent.json")
        report.save()
        return

    def part(name, run):
        """One part of the report; a part that fails is reported as such
        and the others still run."""
        try:
            report[name] = run()
        except Exception:
            report[name] = "failed: " + traceback.format_exc()
        print(name, json.dumps(report[name], default=str)[:2000], flush=True)
        save()

    # The builder's warm-ups first: no other call has planned anything yet.
    part("warm_up", gkl.warm_up)
    if os.environ.get("K3_PEEL_ONLY") == "step_model":  # part 5 alone
        part("step_model", step_model)
        return
    part("compiles_after_warm_up", compiles_after_warm_up)
    part("recurrent_launch_bitwise", recurrent_launch_bitwise)
    for name, lens in SHAPES.items():
        part(f"per_call: {name}", functools.partial(per_call_rounds, lens))
    part(
        "recurrent_host_cost",
        lambda: {
            name: recurrent_host_cost(lens)
            for name, lens in SHAPES.items()
            if lens[0] == 1
        },
    )
    part("step_model", step_model)
    report["launch STATS"] = dict(kda_chunk_launch.STATS)
    report[f"recurrent launch STATS ({AFTER} / k3.6)"] = [
        dict(kda_chunk_launch.RECURRENT_STATS),
        dict(kda_chunk_launch_k36.RECURRENT_STATS),
    ]
    save()


if __name__ == "__main__":
    main()
