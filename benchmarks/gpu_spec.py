"""Speculative-decoding steps of the patched Kimi KDA layer's kernels on the
lent GPU (issue 37 items 2 and 3, H200 part), at Kimi-K3's per-rank head
count (kda_harness.HEADS_PER_RANK: 12 at TP8), with the kernel files of
.gpu/patched (gpu_bundle.py). It measures, in one process:

1. "reference": random steps as the layer splits them (K=7 draft tokens as
   DSpark uses: block table 1+K columns wide, num_accepted_tokens 1..K+1,
   spec requests of 1..K+1 tokens), time-boxed (K3_SPEC_SECONDS, default
   60 s): spec-only steps, spec decodes beside plain decodes, and beside
   plain decodes and prefills, and non-spec decode-only steps with
   column 0 of the block table as state indices (strided, patch 0011).
   Kernels as the layer calls them: the spec tokens through
   fused_recurrent_kda with the 2-D block table and num_accepted_tokens,
   the non-spec tokens of a mixed step through chunk_kda_with_fused_gate
   (plain decodes as 1-token sequences, states gathered from column 0, the
   series' device chunk metadata), decode-only steps through
   fused_recurrent_kda_packed_decode. The caching allocator is poisoned
   with NaN bytes before each step. Each step against the float64
   reference computed on the device (spec part: kda_recurrence's kda_step
   over the block table, vectorized over requests, checked against
   kda_spec_reference.spec_step_reference on the first small steps;
   non-spec chunk part: reference_chunked.batch_reference): outputs and
   every written state slot, in units of kda_tolerance.tolerance
   (recurrent tolerance for spec and decode rows, chunk tolerance for the
   chunk part); counts of steps over tolerance and not finite.
2. "compiles": Triton binaries (device_caches of every JIT function of the
   bundle) compiled after the first 50 steps of a realistic spec mix, over
   up to 3,000 steps (K3_SPEC_COMPILE_SECONDS, default 20 s).
3. "host time": median host microseconds per call (launch only, no sync)
   of the spec fused_recurrent_kda call vs the non-spec recurrent call
   (1-D state indices) and the packed decode, at 8 and 32 requests.
4. "launch costs" (GPU only): the same three calls, each against Triton's
   dispatcher and a direct launch of the same binary (benchmarks/
   launch_costs.py: what a precompiled launch would save), GPU time beside.

With K3_LINE=<version> it runs another release line's bundle (.gpu/line-
<version>): 0.32.0's kernels as series k4.0 ships them, its spec calls with
the uniform length its layer passes.

Partial JSON is written to $OUT/spec.json after each part.

    cd benchmarks && python3 gpu_spec.py          # needs .gpu/ (gpu_bundle.py)
    K3_SPEC_DEVICE=cpu TRITON_INTERPRET=1 python3 gpu_spec.py   # CPU dry run:
                                                  # 2 heads, a few tiny steps
"""

import inspect
import json
import os
import random
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

DEV = os.environ.get("K3_SPEC_DEVICE", "cuda")
DRY = DEV == "cpu"
if DRY:
    os.environ.setdefault("K3_HEADS", "2")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kda_harness  # noqa: E402
from kda_harness import HEAD_DIM, HEADS_PER_RANK, RunReport, load_tree  # noqa: E402

kda_ops = load_tree("patched")  # puts src/ (k3rocm) on the path too

from reference_chunked import batch_reference  # noqa: E402
from vllm.models.kimi_k3.amd.kda_metadata_launch import (  # noqa: E402
    prepare_chunk_metadata_device as chunk_metadata,
)
from vllm.models.kimi_k3.amd.ops.third_party.kda import (  # noqa: E402
    chunk,
    fused_recurrent,
)

from k3rocm.smoke import kda_recurrence, kda_tolerance  # noqa: E402
from k3rocm.smoke.kda_spec_reference import SpecStep, spec_step_reference  # noqa: E402

H = HEADS_PER_RANK
K = HEAD_DIM
NUM_SPEC = 7  # DSpark's draft tokens
W = NUM_SPEC + 1  # block table columns
LOWER_BOUND = -5.0
F64 = torch.float64
SCALE = K**-0.5
# 0.32.0's wrapper takes the spec requests' common length (its layer passes
# it when they are all alike); 0.27.1's has no such argument.
UNIFORM_ARGUMENT = (
    "uniform_sequence_length"
    in inspect.signature(fused_recurrent.fused_recurrent_kda).parameters
)
# bf16 inputs as served; the dry run's interpreter has no bf16 constants
DT = torch.float32 if DRY else torch.bfloat16


# ----------------------------------------------------------- poisoning


def poison() -> None:
    """NaN bytes into the caching allocator's large and small pools."""
    if DRY:
        return
    held = [torch.empty(2 << 30, dtype=torch.uint8, device=DEV)]
    held += [torch.empty(512 << 10, dtype=torch.uint8, device=DEV) for _ in range(256)]
    for t in held:
        t.fill_(0xFF)
    del held


def poison_works() -> bool | None:
    if DRY:
        return None
    poison()
    probe = torch.empty(1 << 20, dtype=torch.float32, device=DEV)
    small = torch.empty(1000, dtype=DT, device=DEV)
    return bool(probe.isnan().all()) and bool(small.isnan().all())


# ---------------------------------------------------------------- steps


KINDS = ("spec-only", "spec+decodes", "spec+prefills", "decodes")


def random_step(rng: random.Random, kind: str | None = None) -> dict:
    """A step's shape: spec request lengths and accepted counts, plain
    decodes, prefill lengths and their has_initial_state."""
    kind = kind or rng.choice(
        ["spec-only"] * 4 + ["spec+decodes"] * 2 + ["spec+prefills"] * 2 + ["decodes"]
    )
    big = 3 if DRY else 64
    n_spec = 0 if kind == "decodes" else rng.choice([1, 2, 4, 8, rng.randint(1, big)])
    spec = [W if rng.random() < 0.7 else rng.randint(1, W) for _ in range(n_spec)]
    accepted = [rng.randint(1, W) for _ in range(n_spec)]
    decodes = 0
    if kind in ("spec+decodes", "spec+prefills"):
        decodes = rng.choice([0, 1, 2, rng.randint(1, 3 if DRY else 32)])
    if kind == "decodes":
        decodes = rng.randint(1, 3 if DRY else 64)
    if kind == "spec+decodes":
        decodes = max(decodes, 1)
    prefills = []
    if kind == "spec+prefills":
        longest = 9 if DRY else 700
        prefills = [
            rng.choice([1, 2, 63, 64, 65, rng.randint(1, longest)])
            if not DRY
            else rng.randint(1, longest)
            for _ in range(rng.randint(1, 3))
        ]
    has_init = [rng.random() < 0.6 for _ in prefills]
    return {
        "kind": kind,
        "spec": spec,
        "accepted": accepted,
        "decodes": decodes,
        "prefills": prefills,
        "has_init": has_init,
    }


def make_inputs(seed: int, s: dict) -> dict:
    """Tensors of a step in vLLM's token order (spec tokens, plain decodes,
    prefills); a state pool with one slot per block-table entry and slot 0
    unused; the block table [requests, 1+K]."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    n_ns = s["decodes"] + len(s["prefills"])
    reqs = len(s["spec"]) + n_ns
    total = sum(s["spec"]) + s["decodes"] + sum(s["prefills"])

    def randn(*size, dtype=DT, std=1.0):
        return (torch.randn(*size, generator=g, device=DEV) * std).to(dtype)

    slots = reqs * W + 1
    perm = torch.randperm(slots - 1, generator=torch.Generator().manual_seed(seed)) + 1
    table = perm.reshape(reqs, W).to(torch.int32).to(DEV)
    return {
        "q": randn(1, total, H, K),
        "k": randn(1, total, H, K),
        "v": randn(1, total, H, K),
        "raw_g": randn(1, total, H, K),
        "raw_beta": randn(1, total, H),
        "A_log": randn(H, dtype=torch.float32),
        "dt_bias": randn(H * K, dtype=torch.float32),
        "pool": randn(slots, H, K, K, dtype=torch.float32, std=0.3),
        "table": table,
    }


def cu_of(lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens, dtype=torch.int64).cumsum(0)
    return cu.to(DEV), cu


# ----------------------------------------------------------- reference


def spec_reference(x, lens, accepted, table, pool, rows0=0):
    """The spec part in float64 on the device: request n starts from slot
    table[n, accepted[n]-1], writes its state after token i to table[n, i];
    vectorized over requests. Returns (out rows [T_spec, H, V], pool, peak)."""
    n = len(lens)
    total = sum(lens)
    sl = slice(rows0, rows0 + total)
    q = kda_recurrence.l2norm(x["q"][0, sl])
    k = kda_recurrence.l2norm(x["k"][0, sl])
    v = x["v"][0, sl].to(F64)
    gate = kda_recurrence.kda_gate(
        x["raw_g"][0, sl], x["A_log"], x["dt_bias"], LOWER_BOUND
    )
    beta = torch.sigmoid(x["raw_beta"][0, sl].to(F64))
    table = table.long()
    acc = torch.tensor(accepted, device=DEV).long()
    lens_t = torch.tensor(lens, device=DEV)
    starts = torch.tensor([0, *lens[:-1]], device=DEV).cumsum(0)
    ar = torch.arange(n, device=DEV)
    S = pool[table[ar, acc - 1]].clone()  # [n, H, V, K]
    peak = torch.linalg.vector_norm(S, dim=-1).max()
    out = torch.full((total, H, K), float("nan"), dtype=F64, device=DEV)
    for i in range(max(lens)):
        active = lens_t > i
        rows = starts + torch.clamp(lens_t - 1, max=i).clamp(min=0)
        rows = torch.where(active, starts + i, rows)
        o, new = kda_recurrence.kda_step(
            S.reshape(n * H, K, K),
            q[rows].reshape(n * H, K),
            k[rows].reshape(n * H, K),
            v[rows].reshape(n * H, K),
            gate[rows].reshape(n * H, K),
            beta[rows].reshape(n * H),
            SCALE,
        )
        new = new.reshape(n, H, K, K)
        S = torch.where(active[:, None, None, None], new, S)
        out[rows[active]] = o.reshape(n, H, K)[active]
        pool[table[active, i]] = S[active]
        peak = torch.maximum(peak, torch.linalg.vector_norm(S, dim=-1).max())
        peak = torch.maximum(peak, v[rows[active]].abs().max())
    return out, pool, float(peak)


def decode_reference(x, slots, pool):
    """Plain one-token decodes from pool[slots] (1-D, possibly strided)."""
    n = slots.numel()
    acc = [1] * n
    return spec_reference(x, [1] * n, acc, slots.reshape(n, 1), pool)


def step_reference(x, s) -> dict:
    pool = x["pool"].to(F64).clone()
    n_spec = len(s["spec"])
    t_spec = sum(s["spec"])
    total = x["q"].shape[1]
    out = torch.full((total, H, K), float("nan"), dtype=F64, device=DEV)
    res = {"peak_spec": 0.0, "peak_ns": 0.0, "longest": 1}
    if n_spec:
        o, pool, peak = spec_reference(
            x, s["spec"], s["accepted"], x["table"][:n_spec], pool
        )
        out[:t_spec] = o
        res["peak_spec"] = peak
    ns_lens = [1] * s["decodes"] + s["prefills"]
    if ns_lens and not n_spec:  # decode-only: the packed decode
        o, pool, peak = decode_reference(x, x["table"][:, 0], pool)
        out[:] = o
        res["peak_spec"] = peak
    elif ns_lens:
        ns = {
            n: (t[:, t_spec:] if n in ("q", "k", "v", "raw_g", "raw_beta") else t)
            for n, t in x.items()
        }
        has_init = torch.tensor([True] * s["decodes"] + s["has_init"], device=DEV)
        r = batch_reference(
            ns["q"], ns["k"], ns["v"], ns["raw_g"], ns["raw_beta"], x["A_log"],
            x["dt_bias"], LOWER_BOUND, pool, x["table"][n_spec:, 0], has_init,
            ns_lens, 0,
        )  # fmt: skip
        out[t_spec:] = r["out"][0]
        pool = r["pool"]
        res["peak_ns"] = r["peak"]
        res["longest"] = max(ns_lens)
    res["out"] = out
    res["pool"] = pool
    return res


def loop_reference(x, s):
    """kda_spec_reference.spec_step_reference (the token loop), to check
    step_reference on small steps."""
    n_spec = len(s["spec"])
    t_spec = sum(s["spec"])
    total = x["q"].shape[1]
    ns_lens = [1] * s["decodes"] + s["prefills"]
    cu, _ = cu_of(s["spec"])
    ns_cu, _ = cu_of(ns_lens)
    step = SpecStep(
        spec_token_indx=torch.arange(t_spec, device=DEV),
        spec_query_start_loc=cu,
        spec_state_indices=x["table"][:n_spec],
        num_accepted_tokens=torch.tensor(s["accepted"], device=DEV),
        non_spec_token_indx=torch.arange(t_spec, total, device=DEV),
        non_spec_query_start_loc=ns_cu,
        non_spec_state_indices=x["table"][n_spec:, 0],
        has_initial_state=torch.tensor(
            [True] * s["decodes"] + s["has_init"], device=DEV
        ),
        non_spec_decodes=0,
    )
    out, pool = spec_step_reference(
        x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["dt_bias"],
        LOWER_BOUND, x["pool"], step,
    )  # fmt: skip
    return out[0], pool


# ------------------------------------------------------------- kernels


def run_kernels(x, s):
    """The step through the kernels the patched layer calls for it; returns
    (out [T, H, V] bf16, pool after)."""
    pool = x["pool"].clone()
    n_spec = len(s["spec"])
    t_spec = sum(s["spec"])
    total = x["q"].shape[1]
    ns_lens = [1] * s["decodes"] + s["prefills"]
    table = x["table"]
    if not n_spec:  # decode-only non-spec step: packed decode, strided column
        mixed = torch.cat([x[n][0].reshape(total, H * K) for n in "qkv"], -1)
        o, _ = fused_recurrent.fused_recurrent_kda_packed_decode(
            mixed_qkv=mixed, raw_g=x["raw_g"], raw_beta=x["raw_beta"],
            A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND,
            initial_state=pool, state_indices=table[:, 0],
        )  # fmt: skip
        return o[0], pool
    cu, _ = cu_of(s["spec"])
    acc = torch.tensor(s["accepted"], dtype=torch.int32, device=DEV)
    sl = slice(0, t_spec)
    if not ns_lens:
        out = torch.empty(1, total, H, K, dtype=DT, device=DEV)
        fused_recurrent.fused_recurrent_kda(
            q=x["q"], k=x["k"], v=x["v"], raw_g=x["raw_g"], raw_beta=x["raw_beta"],
            A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND,
            initial_state=pool, cu_seqlens=cu, ssm_state_indices=table,
            num_accepted_tokens=acc, out=out, **uniform(s["spec"]),
        )  # fmt: skip
        return out[0], pool
    # mixed: index_select'ed spec tokens, kernel's own output, merged after
    idx = torch.arange(t_spec, device=DEV)
    spec_in = {n: x[n].index_select(1, idx) for n in ("q", "k", "v", "raw_g")}
    o_spec, _ = fused_recurrent.fused_recurrent_kda(
        q=spec_in["q"], k=spec_in["k"], v=spec_in["v"], raw_g=spec_in["raw_g"],
        raw_beta=x["raw_beta"][:, sl].contiguous(), A_log=x["A_log"],
        dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND, initial_state=pool,
        cu_seqlens=cu, ssm_state_indices=table[:n_spec],
        num_accepted_tokens=acc, **uniform(s["spec"]),
    )  # fmt: skip
    ns_cu, ns_cu_cpu = cu_of(ns_lens)
    ns_slots = table[n_spec:, 0]  # column 0: a strided view
    has_init = torch.tensor([True] * s["decodes"] + s["has_init"], device=DEV)
    initial = pool[ns_slots.long()]
    initial[~has_init] = 0.0
    indices, offsets = chunk_metadata(ns_cu, ns_cu_cpu)
    o_ns, final = chunk.chunk_kda_with_fused_gate(
        x["q"][:, t_spec:], x["k"][:, t_spec:], x["v"][:, t_spec:],
        x["raw_g"][:, t_spec:], x["raw_beta"][:, t_spec:], x["A_log"],
        x["dt_bias"], None, initial, True, LOWER_BOUND, True, ns_cu, indices,
        offsets,
    )  # fmt: skip
    pool[ns_slots.long()] = final
    out = torch.empty(1, total, H, K, dtype=DT, device=DEV)
    out[:, :t_spec] = o_spec
    out[:, t_spec:] = o_ns
    return out[0], pool


# --------------------------------------------------------------- judging


def judge(x, s, r, out, pool) -> dict:
    n_spec = len(s["spec"])
    t_spec = sum(s["spec"]) if n_spec else x["q"].shape[1]
    tol_rec = kda_tolerance.tolerance(
        DT, "recurrent", scale=SCALE, peak=max(r["peak_spec"], 1e-30),
        max_len=W,
    )  # fmt: skip
    table = x["table"].long()
    spec_slots = table[:n_spec].reshape(-1) if n_spec else table[:, 0]
    e = kda_tolerance.excess(
        out[:t_spec], r["out"][:t_spec], tol_rec, pool[spec_slots],
        r["pool"][spec_slots],
    )  # fmt: skip
    result = {
        "finite": bool(out.isfinite().all()) and bool(pool.isfinite().all()),
        "spec_out": e["out"],
        "spec_state": e["state"],
        "max_abs_out_error": float(
            (out.double() - r["out"]).abs().nan_to_num(0.0).max()
        ),
    }
    if n_spec and t_spec < out.shape[0]:
        tol_chunk = kda_tolerance.tolerance(
            DT, "chunk", scale=SCALE, peak=max(r["peak_ns"], 1e-30),
            max_len=r["longest"],
        )  # fmt: skip
        ns_slots = table[n_spec:, 0]
        e = kda_tolerance.excess(
            out[t_spec:], r["out"][t_spec:], tol_chunk, pool[ns_slots],
            r["pool"][ns_slots],
        )  # fmt: skip
        result["ns_out"], result["ns_state"] = e["out"], e["state"]
    # slots no request writes must be untouched
    written = torch.zeros(pool.shape[0], dtype=torch.bool, device=DEV)
    written[spec_slots] = True
    if n_spec:
        written[table[n_spec:, 0]] = True
    result["untouched_changed"] = int(
        (pool[~written] != x["pool"][~written]).flatten(1).any(-1).sum()
    )
    return result


def worst(result: dict) -> float:
    return max(v for k, v in result.items() if k.endswith(("_out", "_state")))


# ------------------------------------------------------------------ parts


def reference_part(seconds: float, limit: int, report: dict, save) -> dict:
    rng = random.Random(37)
    deadline = time.perf_counter() + seconds
    records, failing, loop_checks, planted = [], [], [], []
    seed = 0
    while time.perf_counter() < deadline and seed < limit:
        seed += 1
        # the dry run: every kind once at least
        s = random_step(rng, KINDS[seed % len(KINDS)] if DRY else None)
        x = make_inputs(seed, s)
        r = step_reference(x, s)
        small = sum(s["spec"]) + s["decodes"] + sum(s["prefills"]) <= 64
        if len(loop_checks) < (4 if DRY else 6) and small and s["spec"]:
            o, p = loop_reference(x, s)
            loop_checks.append(
                max(
                    float((o - r["out"]).abs().nan_to_num(0.0).max()),
                    float((p - r["pool"]).abs().max()),
                )
            )
        poison()
        out, pool = run_kernels(x, s)
        res = judge(x, s, r, out, pool)
        records.append((s["kind"], res))
        if len(planted) < 3 and any(a > 1 for a in s["accepted"]):
            # a planted error: the reference starting every request from
            # column 0 must fail the same check
            wrong = step_reference(x, {**s, "accepted": [1] * len(s["accepted"])})
            planted.append(worst(judge(x, s, wrong, out, pool)))
        if not res["finite"] or worst(res) > 1 or res["untouched_changed"]:
            failing.append({"seed": seed, **s, **res})
        if seed % 200 == 0:
            print(seed, "steps,", len(failing), "failing", flush=True)
            report["reference"] = summarize(records, failing, loop_checks)
            save()
    summary = summarize(records, failing, loop_checks)
    summary["planted error (accepted counts all 1), excess (must be > 1)"] = planted
    return summary


def summarize(records, failing, loop_checks) -> dict:
    kinds = {}
    for kind, res in records:
        k = kinds.setdefault(
            kind, {"steps": 0, "not finite": 0, "over tolerance": 0, "max excess": {}}
        )
        k["steps"] += 1
        k["not finite"] += not res["finite"]
        k["over tolerance"] += worst(res) > 1
        for name, v in res.items():
            if name.endswith(("_out", "_state")):
                k["max excess"][name] = max(k["max excess"].get(name, 0.0), v)
        k["max abs out error"] = max(
            k.get("max abs out error", 0.0), res["max_abs_out_error"]
        )
    return {
        "steps": len(records),
        "failing count": len(failing),
        "failing (first 20)": failing[:20],
        "vectorized vs token-loop reference, max |diff| (float64)": loop_checks,
        "by kind": kinds,
    }


JIT_MODULES = (
    "vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent",
    "vllm.models.kimi_k3.amd.ops.third_party.kda.chunk",
    "vllm.models.kimi_k3.amd.ops.third_party.kda.chunk_intra",
    "vllm.models.kimi_k3.amd.ops.third_party.kda.chunk_intra_token_parallel",
    "vllm.third_party.flash_linear_attention.ops.chunk_delta_h",
    "vllm.third_party.flash_linear_attention.ops.l2norm",
    "vllm.third_party.flash_linear_attention.ops.cumsum",
    "vllm.third_party.flash_linear_attention.ops.index",
    "vllm.models.kimi_k3.amd.kda_metadata_kernel",
)


def binaries() -> dict[str, int] | None:
    """Compiled binaries per JIT function of the bundle (None: interpreter)."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    counts = {}
    for name in JIT_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        for attr, obj in vars(module).items():
            fn = obj
            while isinstance(fn, Heuristics | Autotuner):
                fn = fn.fn
            held = kda_harness.binaries(fn)
            if held is not None:
                counts[f"{name.rsplit('.', 1)[1]}.{attr}"] = held
    return counts if counts and not DRY else None


def compiles_part(seconds: float, steps: int, warm: int = 50) -> dict:
    """A realistic spec mix: mostly spec-only steps of 1..64 requests, some
    with plain decodes and prefills beside, some decode-only steps."""
    rng = random.Random(7)
    before = None
    new_at = []
    deadline = None
    done = 0
    for i in range(steps):
        if i == warm:
            torch.cuda.synchronize() if not DRY else None
            before = binaries()
            deadline = time.perf_counter() + seconds
        if deadline is not None and time.perf_counter() > deadline:
            break
        s = random_step(rng)
        x = make_inputs(100_000 + i, s)
        run_kernels(x, s)
        done = i + 1
        if before is not None and i % 100 == 0:
            now = binaries()
            if now != before:
                new_at.append(i)
    after = binaries()
    new = (
        {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        if before is not None and after is not None
        else None
    )
    return {
        "steps": done,
        "warm-up steps": warm,
        "binaries after warm-up": before,
        "new binaries after warm-up": new,
        "checked at steps with new binaries (every 100th)": new_at,
    }


def host_part(calls: int) -> dict:
    """Median host microseconds per launch (no sync inside the timing)."""
    rng = random.Random(3)
    results = {}
    for n in (8, 32) if not DRY else (2,):
        host_round(n, rng, calls, results)
    return results


def launch_part(calls: int) -> dict:
    """Per call: the wrapper against Triton's dispatcher and a direct
    launch of the same binary (what a precompiled launch would save),
    GPU time beside (launch_costs). The vLLM wrapper's own: a series'
    direct recurrent launch (the 0.32.0 line's k4.2) is switched off
    here; gpu_recurrent_launch.py times it."""
    import launch_costs

    series = sys.modules.get("vllm.models.kimi_k3.amd.kda_recurrent_launch")
    rng = random.Random(3)
    switched = series is not None and series.DIRECT
    if switched:
        series.DIRECT = False
    try:
        return {
            f"{n} requests: {name}": launch_costs.compare(
                fused_recurrent, kernel, fn, outputs, reps=calls
            )
            for n in (8, 32)
            for name, (fn, kernel, outputs) in recurrent_calls(n, rng).items()
        }
    finally:
        if switched:
            series.DIRECT = True


def uniform(spec: list[int]) -> dict:
    """What 0.32.0's layer adds to a spec call whose requests all have the
    same length (its static-length kernel variants); releases whose
    wrapper has no such argument get nothing."""
    if UNIFORM_ARGUMENT and spec and len(set(spec)) == 1:
        return {"uniform_sequence_length": spec[0]}
    return {}


def recurrent_calls(n: int, rng) -> dict:
    """The three recurrent calls of n requests as the layer makes them:
    name -> (call, the kernel it launches, the tensors it writes)."""
    s_spec = {
        "spec": [W] * n, "accepted": [rng.randint(1, W) for _ in range(n)],
        "decodes": 0, "prefills": [], "has_init": [], "kind": "spec-only",
    }  # fmt: skip
    x = make_inputs(1, s_spec)
    cu, _ = cu_of(s_spec["spec"])
    acc = torch.tensor(s_spec["accepted"], dtype=torch.int32, device=DEV)
    out = torch.empty(1, n * W, H, K, dtype=DT, device=DEV)
    dcu, _ = cu_of([1] * n)
    col = x["table"][:, 0]
    dout = torch.empty(1, n, H, K, dtype=DT, device=DEV)
    d = {m: x[m][:, :n] for m in ("q", "k", "v", "raw_g", "raw_beta")}
    mixed = torch.cat([d[m][0].reshape(n, H * K) for m in "qkv"], -1)

    def spec():
        fused_recurrent.fused_recurrent_kda(
            q=x["q"], k=x["k"], v=x["v"], raw_g=x["raw_g"],
            raw_beta=x["raw_beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
            lower_bound=LOWER_BOUND, initial_state=x["pool"], cu_seqlens=cu,
            ssm_state_indices=x["table"], num_accepted_tokens=acc, out=out,
            **uniform(s_spec["spec"]),
        )  # fmt: skip

    def non_spec():
        fused_recurrent.fused_recurrent_kda(
            q=d["q"], k=d["k"], v=d["v"], raw_g=d["raw_g"],
            raw_beta=d["raw_beta"], A_log=x["A_log"], dt_bias=x["dt_bias"],
            lower_bound=LOWER_BOUND, initial_state=x["pool"], cu_seqlens=dcu,
            ssm_state_indices=col, out=dout,
        )  # fmt: skip

    def packed():
        fused_recurrent.fused_recurrent_kda_packed_decode(
            mixed_qkv=mixed, raw_g=d["raw_g"], raw_beta=d["raw_beta"],
            A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND,
            initial_state=x["pool"], state_indices=col,
        )  # fmt: skip

    recurrent = "fused_recurrent_kda_fwd_kernel"
    return {
        "spec fused_recurrent_kda (2-D table, accepted)": (
            spec,
            recurrent,
            lambda: [out, x["pool"]],
        ),
        "non-spec fused_recurrent_kda (1-D strided indices)": (
            non_spec,
            recurrent,
            lambda: [dout, x["pool"]],
        ),
        "packed decode (strided column)": (
            packed,
            "fused_recurrent_kda_packed_decode_kernel",
            lambda: [x["pool"]],
        ),
    }


def host_round(n: int, rng, calls: int, results: dict) -> None:
    """One request count's timings into ``results``."""
    for name, (fn, _, _) in recurrent_calls(n, rng).items():
        for _ in range(1 if DRY else 20):  # warm-up (compiles)
            fn()
        if not DRY:
            torch.cuda.synchronize()
        times = []
        for i in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if i % 50 == 49 and not DRY:
                torch.cuda.synchronize()
        results[f"{n} requests: {name}"] = {
            "median us": statistics.median(times) * 1e6,
            "p90 us": sorted(times)[int(len(times) * 0.9)] * 1e6,
            "calls": calls,
        }


def main():
    report = RunReport(
        "spec.json",
        device=DEV if DRY else None,
        heads=H,
        head_dim=K,
        num_speculative_tokens=NUM_SPEC,
        lower_bound=LOWER_BOUND,
    )
    save = report.save

    start = time.perf_counter()
    parts = [
        (
            "reference",
            lambda: reference_part(
                float(os.environ.get("K3_SPEC_SECONDS", 55)),
                6 if DRY else int(os.environ.get("K3_SPEC_STEPS", 10**9)),
                report,
                save,
            ),
        ),
        (
            "compiles",
            lambda: compiles_part(
                float(os.environ.get("K3_SPEC_COMPILE_SECONDS", 20)),
                4 if DRY else 3000,
                warm=2 if DRY else 50,
            ),
        ),
        ("host time", lambda: host_part(2 if DRY else 400)),
    ]
    if not DRY:
        parts.append(("launch costs", lambda: launch_part(400)))
    report["poison works"] = poison_works()
    status = 0
    if DRY:  # what the interpreter needs of the kernels (the smoke test's)
        import contextlib

        from k3rocm.smoke.interpreter import interpretable, kda_kernels

        stack = contextlib.ExitStack()
        # as on the suite's CPU platform: no CUDA device capability to ask
        platform = sys.modules["vllm.platforms"].current_platform
        stack.callback(setattr, type(platform), "is_cuda", type(platform).is_cuda)
        type(platform).is_cuda = staticmethod(lambda: False)
        stack.enter_context(interpretable(kda_kernels()))
    for name, part in parts:
        t0 = time.perf_counter()
        try:
            report[name] = part()
        except Exception:  # record it and go on with the next part
            report[name] = {"error": traceback.format_exc()[-3000:]}
            status = 1
        report[f"{name} seconds"] = time.perf_counter() - t0
        save()
        print(f"== {name}:", json.dumps(report[name], default=str)[:1500], flush=True)
    report["seconds"] = time.perf_counter() - start
    save()
    print("spec.json in", report.path, flush=True)
    failing = report.get("reference", {}).get("failing count")
    if failing:
        status = 1
    sys.exit(status)


if __name__ == "__main__":
    main()
