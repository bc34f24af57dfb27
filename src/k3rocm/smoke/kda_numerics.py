"""Stage 1's numerical check of the Kimi KDA ops on this machine's device.

One small mixed step runs through the kernels the patched Kimi KDA layer
calls, as it calls them: the decodes through ``fused_recurrent_kda`` on a
state pool (their states updated in place), the prefill slice (a prompt
across a chunk boundary, a short one, a zero-length padding sequence)
through ``chunk_kda_with_fused_gate`` with the series' device-built chunk
metadata, twice (on a GPU the first call runs vLLM's own path and plans the
kind, the second the precompiled launches). Outputs and states are compared
with the float64 reference (``kda_reference``) within its stated tolerance.
vLLM PR #50649 saw chunk KDA return NaN on MI355X; a device or kernel that
does anything like it fails the smoke test, so the server never turns
healthy.

On a GPU: bf16 inputs, the model's head size (128), the caching allocator
poisoned with NaN bytes first. Its first chunk KDA call autotunes and
compiles the chunk kernels, which on a cold Triton cache takes over a
minute (measured on an H200, docs/benchmarks.md; stage 1 allows 900 s).
Triton keeps compiled kernels in its cache (the cache volume) but not,
by default, what autotuning chose, and timing every configuration again
takes seconds at each start: the check has the autotuners of the kernels it
runs keep their results in Triton's cache too (their own option
``cache_results``; vLLM's process is left as it is). With both cached the
check is a cache load (its GPU time: docs/benchmarks.md). In the Triton
interpreter (the CPU development profile): float32 (it has no bf16
arithmetic) and head size 32, about 5-10 s on two cores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from k3rocm.common.smoke_report import CheckName, Stage
from k3rocm.common.states import Verdict
from k3rocm.smoke import kda_reference as ref
from k3rocm.smoke import kda_tolerance
from k3rocm.smoke.chunk_reference import cu_seqlens_of

DECODES = 3
PREFILLS = (65, 5, 0)  # across a chunk boundary, a short one, padding
# Heads in the interpreter (its cost grows with them); on a GPU the step
# runs at the KDA heads of one rank of the profile (``check_kda_numerics``).
INTERPRETER_HEADS = 2
LOWER_BOUND = -5.0  # Kimi-K3's gate lower bound
POISON_BYTES = 256 << 20


@dataclass(frozen=True)
class Shape:
    dtype_name: str
    head_dim: int
    truncating: bool  # the interpreter's casts truncate (the tolerance's)


SHAPES = {"cuda": Shape("bfloat16", 128, False), "cpu": Shape("float32", 32, True)}


def step_inputs(device: str, seed: int = 0, heads: int = INTERPRETER_HEADS) -> dict:
    """A mixed step's inputs in the layout the layer hands the kernels."""
    import torch

    shape = SHAPES[device]
    dtype = getattr(torch, shape.dtype_name)
    gen = torch.Generator().manual_seed(seed)
    lens = [1] * DECODES + list(PREFILLS)
    tokens, dim = sum(lens), shape.head_dim
    slots = len(lens) + 1  # slot 0 is vLLM's null block

    def randn(*size, scale=1.0, to=dtype):
        return (torch.randn(*size, generator=gen) * scale).to(to).to(device)

    return {
        "lens": lens,
        "q": randn(1, tokens, heads, dim),
        "k": randn(1, tokens, heads, dim),
        "v": randn(1, tokens, heads, dim),
        "raw_g": randn(1, tokens, heads, dim),
        "raw_beta": randn(1, tokens, heads),
        "A_log": randn(heads, scale=0.5, to=torch.float32),
        "dt_bias": randn(heads * dim, scale=0.5, to=torch.float32),
        "pool": randn(slots, heads, dim, dim, scale=0.1, to=torch.float32),
        # Decodes and the first prefill continue their sequences.
        "slots": torch.arange(1, len(lens) + 1, dtype=torch.int32).to(device),
        "has_initial": torch.tensor(
            [True] * (DECODES + 1) + [False] * (len(PREFILLS) - 1)
        ).to(device),
        "cu": cu_seqlens_of(lens).to(device),
    }


def poison_allocator() -> None:
    """Fill and free a large block, so that the caching allocator hands out
    NaN bytes to what the kernels allocate next."""
    import torch

    block = torch.empty(POISON_BYTES, dtype=torch.uint8, device="cuda")
    block.fill_(0xFF)
    del block


def run_step(x: dict, chunk_calls: int = 2) -> list[tuple]:
    """(outputs [1, T, H, V], pool after the step) of each chunk call's
    version of the step, through the kernels as the layer calls them."""
    import torch
    from vllm.models.kimi_k3.amd.kda_metadata_launch import (
        prepare_chunk_metadata_device,
    )
    from vllm.models.kimi_k3.amd.ops.third_party.kda import (
        chunk_kda_with_fused_gate,
        fused_recurrent_kda,
    )

    d = DECODES
    head = {n: x[n][:, :d] for n in ("q", "k", "v", "raw_g", "raw_beta")}
    tail = {n: x[n][:, d:] for n in ("q", "k", "v", "raw_g", "raw_beta")}
    prefill_cu = x["cu"][d:] - x["cu"][d]
    indices, offsets = prepare_chunk_metadata_device(prefill_cu, prefill_cu.cpu())
    prefill_slots = x["slots"][d:].long()
    results = []
    for _ in range(chunk_calls):
        pool = x["pool"].clone()
        out = torch.empty_like(x["v"])
        fused_recurrent_kda(
            **head, A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND,
            initial_state=pool, cu_seqlens=x["cu"][: d + 1],
            ssm_state_indices=x["slots"][:d], out=out[:, :d],
        )  # fmt: skip
        initial = pool[prefill_slots].clone()
        initial[~x["has_initial"][d:]] = 0
        prefill_out, final = chunk_kda_with_fused_gate(
            q=tail["q"].contiguous(), k=tail["k"].contiguous(),
            v=tail["v"].clone(), raw_g=tail["raw_g"], raw_beta=tail["raw_beta"],
            A_log=x["A_log"], g_bias=x["dt_bias"], lower_bound=LOWER_BOUND,
            initial_state=initial, output_final_state=True,
            use_qk_l2norm_in_kernel=True, cu_seqlens=prefill_cu,
            chunk_indices=indices, chunk_offsets=offsets,
        )  # fmt: skip
        pool[prefill_slots] = final
        out[:, d:] = prefill_out
        results.append((out, pool))
    return results


def expected_step(x: dict, device: str) -> tuple:
    """(reference outputs, reference pool, tolerance)."""
    import torch

    peak: list[float] = []
    cpu = {n: t.cpu() if isinstance(t, torch.Tensor) else t for n, t in x.items()}
    out, pool = ref.mixed_batch_reference(
        cpu["q"], cpu["k"], cpu["v"], cpu["raw_g"], cpu["raw_beta"], cpu["A_log"],
        cpu["dt_bias"], LOWER_BOUND, cpu["pool"], cpu["slots"],
        cpu["has_initial"], cpu["cu"], DECODES, peak=peak,
    )  # fmt: skip
    shape = SHAPES[device]
    tol = kda_tolerance.tolerance(
        getattr(torch, shape.dtype_name), "chunk", scale=shape.head_dim**-0.5,
        peak=max(peak), max_len=max(x["lens"]), truncating=shape.truncating,
    )  # fmt: skip
    return out, pool, tol


def worst_excess(x: dict, results: list[tuple], device: str) -> float:
    """The largest error of any call's outputs or states, in units of the
    tolerance (<= 1 passes; inf for NaN or inf)."""
    want_out, want_pool, tol = expected_step(x, device)
    worst = 0.0
    for out, pool in results:
        excess = kda_tolerance.excess(out.cpu(), want_out, tol, pool.cpu(), want_pool)
        worst = max(worst, *excess.values())
    return worst


@contextmanager
def autotuning_cached(kernels) -> Iterator[None]:
    """Inside the block, the autotuned ``kernels`` read and write their
    choice in Triton's cache (as Triton's ``cache_results=True`` makes
    them: keyed by the kernel's source, the device, the tuning key and the
    configurations), so a start with a warm cache times no configuration
    again. Restored after; a Triton without the option is left alone."""
    from k3rocm.smoke.interpreter import jit_and_tuner

    changed = []
    try:
        for kernel in kernels:
            _, tuner = jit_and_tuner(kernel)
            if tuner is not None and getattr(tuner, "cache_results", None) is False:
                changed.append(tuner)
                tuner.cache_results = True
        yield
    finally:
        for tuner in changed:
            tuner.cache_results = False


def measure(
    device: str, cache_autotuning: bool = True, heads: int = INTERPRETER_HEADS
) -> float:
    """Run the step on ``device`` ("cuda", or "cpu" in the interpreter) and
    return its worst excess. ``cache_autotuning``: on a GPU, keep the
    autotuners' choices in Triton's cache (``autotuning_cached``)."""
    if device == "cuda":
        from k3rocm.smoke.interpreter import kda_kernels

        kernels = kda_kernels() if cache_autotuning else []
        with autotuning_cached(kernels):
            poison_allocator()
            x = step_inputs(device, heads=heads)
            return worst_excess(x, run_step(x), device)
    from k3rocm.smoke.interpreter import interpretable, kda_kernels

    x = step_inputs(device)
    with interpretable(kda_kernels()):
        # Both calls would run the same vendored path here: one is enough.
        results = run_step(x, chunk_calls=1)
    return worst_excess(x, results, device)


def check_kda_numerics(
    stage: Stage, device: str | None, heads: int = INTERPRETER_HEADS
) -> bool:
    """``heads``: the KDA heads of one rank (the profile's), used on a GPU;
    the interpreter runs INTERPRETER_HEADS."""
    heads = heads if device == "cuda" else INTERPRETER_HEADS
    what = (
        f"a mixed step ({DECODES} decodes, prefills of {'/'.join(map(str, PREFILLS))}"
        f" tokens, {heads} heads) through the recurrent and chunk KDA kernels"
    )
    return report_numerics(stage, CheckName.KDA_NUMERICS, what, device, heads, measure)


def report_numerics(
    stage: Stage,
    check: str,
    what: str,
    device: str | None,
    heads: int,
    measure_on: Callable[..., float],
) -> bool:
    """Add `check` to the stage from ``measure_on(device, heads=...)``, the
    step's worst error as a multiple of its tolerance: skipped without a
    device, failed when the kernels raise or the error passes 1."""
    if device is None:
        return stage.add(
            check,
            Verdict.SKIP,
            "no GPU, and TRITON_INTERPRET is not 1: nowhere to run the KDA kernels",
        )
    try:
        worst = measure_on(device, heads=heads)
    except Exception as err:  # a kernel that cannot run fails the check
        return stage.add(
            check,
            Verdict.FAIL,
            f"{what} failed on {device}: {type(err).__name__}: {str(err)[:200]}",
        )
    if worst <= 1.0:
        return stage.add(
            check,
            Verdict.PASS,
            f"{what} match the float64 reference on {device} (largest error "
            f"{worst:.2g} of the tolerance)",
        )
    return stage.add(
        check,
        Verdict.FAIL,
        f"{what} differ from the float64 reference on {device}: largest error "
        f"{worst:.3g} times the tolerance (inf: NaN or inf in outputs or states)",
    )
