"""Stage 1's numerical check of the Kimi KDA ops under speculative decoding
(``K3_FEATURES`` with ``dspark``): one small spec step through the kernels
the patched Kimi KDA layer calls, as it calls them, against the float64
reference (``kda_spec_reference`` / ``kda_reference``).

With speculation a request's Mamba block-table row holds ``1 + K`` state
slots. The step has two calls on one state pool (disjoint slots):

- spec decodes through ``fused_recurrent_kda`` with the whole table row as
  ``ssm_state_indices`` and ``num_accepted_tokens`` from 1 to ``K + 1``
  (each request starts from the state in column ``accepted - 1`` and writes
  the state after its token ``i`` to column ``i``), one request with a
  shorter draft;
- plain decodes through ``fused_recurrent_kda_packed_decode`` with column 0
  of such a table: the strided view vLLM's GDN builder hands the layer's
  pure-decode path (vLLM #51682; 0.27.1's kernel refuses it).

Outputs and the pool after both calls are compared with the reference
within its tolerance. Device, dtype, head size and heads as in
``kda_numerics`` (on a GPU the profile's heads of one rank on a poisoned
allocator; in the interpreter 2 heads of size 32, about a second).
"""

from __future__ import annotations

from k3rocm.common.smoke_report import CheckName, Stage
from k3rocm.smoke import kda_reference as ref
from k3rocm.smoke import kda_tolerance
from k3rocm.smoke.chunk_reference import cu_seqlens_of
from k3rocm.smoke.kda_numerics import (
    INTERPRETER_HEADS,
    LOWER_BOUND,
    SHAPES,
    poison_allocator,
    report_numerics,
)

NUM_SPEC = 3  # K: block-table rows 1 + K wide
# Spec decodes: their query lengths (1 + K, and a request with a shorter
# draft) and accepted counts (1 .. 1 + K).
SPEC_LENS = (1 + NUM_SPEC, 1 + NUM_SPEC, 1 + NUM_SPEC, 2)
ACCEPTED = (1, 2, 1 + NUM_SPEC, 3)
PLAIN_DECODES = 3


def step_inputs(device: str, seed: int = 0, heads: int = INTERPRETER_HEADS) -> dict:
    """The step's inputs in the layout the layer hands the kernels: spec
    tokens first, then the plain decodes' tokens."""
    import torch

    shape = SHAPES[device]
    dtype = getattr(torch, shape.dtype_name)
    gen = torch.Generator().manual_seed(seed)
    width = 1 + NUM_SPEC
    spec, plain = len(SPEC_LENS), PLAIN_DECODES
    tokens, dim = sum(SPEC_LENS) + plain, shape.head_dim
    # Slot 0 is vLLM's null block; every table entry a distinct slot, the
    # plain decodes' other columns too (a kernel reading them fails).
    slots = torch.randperm((spec + plain) * width, generator=gen) + 1
    slots = slots.to(torch.int32).view(spec + plain, width)

    def randn(*size, scale=1.0, to=dtype):
        return (torch.randn(*size, generator=gen) * scale).to(to).to(device)

    return {
        "q": randn(1, tokens, heads, dim),
        "k": randn(1, tokens, heads, dim),
        "v": randn(1, tokens, heads, dim),
        "raw_g": randn(1, tokens, heads, dim),
        "raw_beta": randn(1, tokens, heads),
        "A_log": randn(heads, scale=0.5, to=torch.float32),
        "dt_bias": randn(heads * dim, scale=0.5, to=torch.float32),
        "pool": randn(1 + slots.numel(), heads, dim, dim, scale=0.1, to=torch.float32),
        "spec_table": slots[:spec].contiguous().to(device),
        "accepted": torch.tensor(ACCEPTED, dtype=torch.int32).to(device),
        "spec_cu": cu_seqlens_of(list(SPEC_LENS)).to(device),
        "plain_table": slots[spec:].contiguous().to(device),
    }


def _split(x: dict) -> tuple[dict, dict]:
    n = sum(SPEC_LENS)
    names = ("q", "k", "v", "raw_g", "raw_beta")
    return {m: x[m][:, :n] for m in names}, {m: x[m][:, n:] for m in names}


def run_step(x: dict) -> tuple:
    """(outputs [1, T, H, V], the pool after the step) through the kernels
    as the layer calls them."""
    import torch
    from vllm.models.kimi_k3.amd.ops.third_party.kda import (
        fused_recurrent_kda,
        fused_recurrent_kda_packed_decode,
    )

    spec, plain = _split(x)
    pool = x["pool"].clone()
    spec_out, _ = fused_recurrent_kda(
        **spec, A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND,
        initial_state=pool, cu_seqlens=x["spec_cu"],
        ssm_state_indices=x["spec_table"], num_accepted_tokens=x["accepted"],
    )  # fmt: skip
    column = x["plain_table"][:, 0]  # strided, as the builder hands it
    mixed_qkv = torch.cat([plain[m][0].flatten(1) for m in ("q", "k", "v")], -1)
    plain_out, _ = fused_recurrent_kda_packed_decode(
        mixed_qkv=mixed_qkv, raw_g=plain["raw_g"], raw_beta=plain["raw_beta"],
        A_log=x["A_log"], dt_bias=x["dt_bias"], lower_bound=LOWER_BOUND,
        initial_state=pool, state_indices=column,
    )  # fmt: skip
    return torch.cat([spec_out, plain_out], 1), pool


def expected_step(x: dict, device: str) -> tuple:
    """(reference outputs, reference pool, tolerance)."""
    import torch

    cpu = {n: t.cpu() for n, t in x.items()}
    spec, plain = _split(cpu)
    peak: list[float] = []
    common = dict(A_log=cpu["A_log"], dt_bias=cpu["dt_bias"], lower_bound=LOWER_BOUND)
    spec_out, pool = ref.recurrent_kda_reference(
        **spec, **common, initial_state=cpu["pool"], cu_seqlens=cpu["spec_cu"],
        ssm_state_indices=cpu["spec_table"], num_accepted_tokens=cpu["accepted"],
        peak=peak,
    )  # fmt: skip
    plain_out, pool = ref.recurrent_kda_reference(
        **plain, **common, initial_state=pool,
        cu_seqlens=cu_seqlens_of([1] * PLAIN_DECODES),
        ssm_state_indices=cpu["plain_table"][:, 0], peak=peak,
    )  # fmt: skip
    shape = SHAPES[device]
    tol = kda_tolerance.tolerance(
        getattr(torch, shape.dtype_name), "recurrent", scale=shape.head_dim**-0.5,
        peak=max(peak), max_len=max(SPEC_LENS), truncating=shape.truncating,
    )  # fmt: skip
    return torch.cat([spec_out, plain_out], 1), pool, tol


def measure(device: str, heads: int = INTERPRETER_HEADS) -> float:
    """Run the step on ``device`` ("cuda", or "cpu" in the interpreter) and
    return its worst excess over the tolerance (inf for NaN or inf)."""
    if device == "cuda":
        poison_allocator()
        x = step_inputs(device, heads=heads)
        out, pool = run_step(x)
    else:
        from k3rocm.smoke.interpreter import interpretable, kda_kernels

        x = step_inputs(device)
        with interpretable(kda_kernels()):
            out, pool = run_step(x)
    want_out, want_pool, tol = expected_step(x, device)
    return max(
        kda_tolerance.excess(out.cpu(), want_out, tol, pool.cpu(), want_pool).values()
    )


def check_kda_spec_numerics(
    stage: Stage, device: str | None, heads: int = INTERPRETER_HEADS
) -> bool:
    """``heads``: the KDA heads of one rank (the profile's), used on a GPU;
    the interpreter runs INTERPRETER_HEADS."""
    heads = heads if device == "cuda" else INTERPRETER_HEADS
    what = (
        f"a spec step ({len(SPEC_LENS)} spec decodes, block table {1 + NUM_SPEC} "
        f"columns, accepted {'/'.join(map(str, ACCEPTED))}; {PLAIN_DECODES} plain "
        f"decodes on its strided column 0; {heads} heads) through the recurrent "
        "KDA kernels"
    )
    return report_numerics(
        stage, CheckName.KDA_SPEC_NUMERICS, what, device, heads, measure
    )
