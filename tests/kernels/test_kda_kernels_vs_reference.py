"""vLLM 0.27.1's vendored AMD KDA kernels (the patched tree's) run in the
Triton interpreter, checked against the float64 KDA reference
(src/k3rocm/smoke/kda_reference.py; its own tests are
tests/smoke/test_kda_reference.py), within the reference's derived
tolerance (src/k3rocm/smoke/kda_tolerance.py).

Stand-ins, for what cannot exist on a CPU, as in test_chunk_launch.py
(tests/support/kda_interpreter.py): autotuned kernels limited to their first
configuration, the fla aliases of Triton builtins looked up at call time,
the sub-chunk kernel's plain load in place of tl.gather. Memory the vendored
path allocates is poisoned with NaN bytes (torch.empty and friends), the
launched path's one allocation likewise. Inputs are float32 on the chunk
path: the interpreter has no bfloat16 arithmetic (bf16 values are uint16 bit
patterns to it; ``b_q * scale`` on a bf16 block fails), which a test below
pins; the recurrent kernels only load and store bf16 and run with it.
"""

import math

import pytest
import torch
import vllm.models.kimi_k3.amd.ops.third_party.kda.chunk as chunk
import vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent as recurrent
import vllm.models.kimi_k3.amd.ops.third_party.kda.kda_chunk_launch as launch
from support.kda_interpreter import (
    fresh,
    interpretable,
    interpretable_kernel,
    poison_allocations,
    poisoned,
)
from support.kda_reference_cases import (
    BOUNDS,
    HEAD_DIM,
    HEADS,
    chunk_args,
    chunk_expected,
    randn,
)
from triton.runtime.errors import InterpreterError
from vllm.models.kimi_k3.amd.ops.third_party.kda import (
    kda_chunk_forward,
    kda_chunk_plans,
)

from k3rocm.smoke import kda_reference as ref
from k3rocm.smoke import kda_tolerance
from k3rocm.smoke.chunk_reference import cu_seqlens_of, reference_chunk_metadata

pytestmark = [
    pytest.mark.filterwarnings("ignore:tl.make_block_ptr is deprecated"),
    # The safe-gate kernels' exp2 of gate differences overflows to inf in
    # NumPy for some lanes; the outputs are finite and checked below.
    pytest.mark.filterwarnings("ignore:overflow encountered in exp2"),
]


def vendored(args, monkeypatch):
    """vLLM 0.27.1's vendored chunk path in the interpreter, every
    torch.empty it makes full of NaN bytes."""
    with monkeypatch.context() as poisoning:
        poison_allocations(poisoning)
        return chunk.vendored_chunk_kda_with_fused_gate(*fresh(args))


def within(out, final, expected) -> dict:
    out_ref, final_ref, tol = expected
    return kda_tolerance.excess(out, out_ref, tol, final, final_ref)


def passes(excess: dict) -> bool:
    return all(value <= 1.0 for value in excess.values())


# ---------------------------------------- vendored chunk path vs reference


CHUNK_CASES = [
    pytest.param([1], -5.0, True, id="1-token-bound"),
    pytest.param([1], None, False, id="1-token-no-bound-zero-state"),
    pytest.param([63, 64, 65], -5.0, True, id="63-64-65-bound"),
    pytest.param([63, 64, 65], -5.0, False, id="63-64-65-bound-no-state"),
    pytest.param([3, 0, 65, 1, 0], -5.0, True, id="empty-mid-and-back-bound"),
    pytest.param([3, 0, 65, 1, 0], None, True, id="empty-mid-and-back-no-bound"),
    pytest.param([64, 0], None, False, id="64-no-bound-no-state"),
]


@pytest.fixture(scope="module")
def chunk_runs():
    """Vendored-path results by case, each computed once a module."""
    runs = {}

    def run(seq_lens, lower_bound, initial):
        key = (tuple(seq_lens), lower_bound, initial)
        if key not in runs:
            args = chunk_args(seq_lens, lower_bound, initial=initial)
            with pytest.MonkeyPatch.context() as mp:
                interpretable(mp, lower_bound)
                runs[key] = (args, vendored(args, mp))
        return runs[key]

    return run


@pytest.mark.parametrize(("seq_lens", "lower_bound", "initial"), CHUNK_CASES)
def test_vendored_chunk_path_matches_the_reference(
    chunk_runs, seq_lens, lower_bound, initial
):
    args, (out, final) = chunk_runs(seq_lens, lower_bound, initial)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    excess = within(out, final, chunk_expected(args))
    assert passes(excess), excess
    # The errors sit well inside the bound (a float32 kernel: ~1e-7).
    assert max(excess.values()) < 0.1, excess


def test_zero_state_is_the_no_state_call(chunk_runs):
    """initial_state None means zeros (the reference's reading)."""
    args, (out, final) = chunk_runs([63, 64, 65], -5.0, False)
    zeros = torch.zeros(3, HEADS, HEAD_DIM, HEAD_DIM)
    assert passes(within(out, final, chunk_expected(args, initial_state=zeros)))


def test_without_the_series_metadata_an_empty_sequence_mid_batch_goes_wrong(
    monkeypatch,
):
    """vLLM 0.27.1's own prepare_chunk_indices labels chunks by non-empty
    ordinal: with an empty sequence before the last, the last one's chunks
    run as the empty one's. The reference catches it (the builder only pads
    at the back, so vLLM never hands it such a batch)."""
    interpretable(monkeypatch, -5.0)
    args = (*chunk_args([3, 0, 2], -5.0)[:13], None, None)
    out, final = vendored(args, monkeypatch)
    assert not passes(within(out, final, chunk_expected(args)))


def test_the_launched_sequence_on_poisoned_memory_matches_the_reference(
    monkeypatch,
):
    """The series' launched path (patch 0005: its eight kernels run by
    _forward, here each in the interpreter) on an allocation full of NaN
    bytes."""
    lower_bound = -5.0
    interpretable(monkeypatch, lower_bound)
    args = chunk_args([1, 65, 0, 3], lower_bound)
    prepared = kda_chunk_forward.prepare(*fresh(args))
    consts = kda_chunk_plans._consts(
        kda_chunk_plans.chosen_configs(lower_bound),
        lower_bound,
        prepared[0],
        prepared[1],
    )
    monkeypatch.setattr(kda_chunk_forward, "_carve", poisoned(kda_chunk_forward._carve))

    def run(site, grid, *kernel_args):
        launch.unwrap(launch.site_kernel(site, lower_bound))[0][grid](*kernel_args)

    out, final = kda_chunk_forward._forward(run, consts, False, *prepared)
    assert passes(within(out, final, chunk_expected(args)))


def test_the_interpreter_has_no_bf16_arithmetic(monkeypatch):
    """Why the chunk path runs with float32 inputs here: the output kernel
    scales a bf16 block (``b_q * scale``), which this Triton's interpreter
    cannot build. Should a Triton version run it, this fails: then add bf16
    cases above (tolerance(torch.bfloat16, 'chunk', truncating=True))."""
    interpretable(monkeypatch, -5.0)
    args = chunk_args([2], -5.0)
    args = tuple(a.bfloat16() if i < 5 else a for i, a in enumerate(args))
    with pytest.raises(InterpreterError, match="get_bf16"):
        chunk.vendored_chunk_kda_with_fused_gate(*fresh(args))


# -------------------------------------------- each check can fail


def test_a_perturbed_reference_fails_the_kernel(chunk_runs):
    """The comparison against the same kernel results fails for a wrong
    gate, a wrong beta, a transposed state, a lost chunk carry, a NaN."""
    args, (out, final) = chunk_runs([63, 64, 65], -5.0, True)
    assert passes(within(out, final, chunk_expected(args)))
    h0 = args[8]
    wrong = {
        "gate without its bound": chunk_expected(args, lower_bound=None),
        "A twice as large": chunk_expected(args, A_log=args[5] + math.log(2)),
        "bias left out": chunk_expected(args, g_bias=None),
        "state as S[k, v]": chunk_expected(args, initial_state=h0.mT.contiguous()),
        "beta = raw_beta (clamped), no sigmoid": chunk_expected(
            args, raw_beta=torch.logit(args[4].clamp(0.01, 0.99))
        ),
        "scale left out": chunk_expected(args, scale=1.0),
    }
    for name, expected in wrong.items():
        assert not passes(within(out, final, expected)), name
    # A chunk's carry lost: 65 tokens run as 64 + 1 from zero.
    lost = list(chunk_args([63, 64, 64, 1], -5.0))
    lost[:8] = args[:8]
    lost[8] = torch.cat([h0, torch.zeros(1, *h0.shape[1:])])
    lost_out, _, _ = chunk_expected(tuple(lost))
    excess = kda_tolerance.excess(out, lost_out, chunk_expected(args)[2])
    assert excess["out"] > 1
    nan_out = out.clone()
    nan_out[0, 70, 1, 3] = math.nan
    assert within(nan_out, final, chunk_expected(args))["out"] == math.inf


# ------------------------------------------------- recurrent kernels


def recurrent_args(lower_bound, dtype, *, spec=False, seed=1, dim=32):
    """fused_recurrent_kda's arguments as the layer passes them: raw gate
    and beta, a float32 state pool [slots, H, V, K], per-sequence slots
    with vLLM's padding (slot 0 and -1 are never read or written)."""
    gen = torch.Generator().manual_seed(seed)
    if spec:  # two spec sequences of 3 tokens and a padded one
        lens, accepted = [3, 3, 3], torch.tensor([2, 1, 1], dtype=torch.int32)
        slots = torch.tensor([[4, 5, 6], [1, 2, 3], [-1, -1, -1]], dtype=torch.int32)
    else:  # plain decodes, one token each
        lens, accepted = [1] * 5, None
        slots = torch.tensor([3, 0, 5, -1, 1], dtype=torch.int32)
    T = sum(lens)
    shape = (1, T, HEADS, dim)
    q, k, v, raw_g = (randn(gen, *shape, dtype=dtype) for _ in range(4))
    return dict(
        q=q, k=k, v=v, raw_g=raw_g, raw_beta=randn(gen, 1, T, HEADS, dtype=dtype),
        A_log=randn(gen, HEADS), dt_bias=randn(gen, HEADS * dim),
        lower_bound=lower_bound, initial_state=randn(gen, 8, HEADS, dim, dim),
        cu_seqlens=cu_seqlens_of(lens), ssm_state_indices=slots,
        num_accepted_tokens=accepted,
    )  # fmt: skip


def recurrent_expected(kwargs, dtype):
    peak = []
    out, pool = ref.recurrent_kda_reference(**kwargs, peak=peak)
    lens = torch.diff(kwargs["cu_seqlens"]).tolist()
    tol = kda_tolerance.tolerance(
        dtype, "recurrent", scale=kwargs["q"].shape[-1] ** -0.5, peak=max(peak),
        max_len=max(lens), truncating=True,
    )  # fmt: skip
    return out, pool, tol


@pytest.fixture
def recurrent_interpretable(monkeypatch):
    for kernel in (
        recurrent.fused_recurrent_kda_fwd_kernel,
        recurrent.fused_recurrent_kda_packed_decode_kernel,
    ):
        interpretable_kernel(monkeypatch, kernel)
    poison_allocations(monkeypatch)


@BOUNDS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spec", [False, True], ids=["decode", "spec-decode"])
def test_recurrent_kernel_matches_the_reference(
    recurrent_interpretable, lower_bound, dtype, spec
):
    kwargs = recurrent_args(lower_bound, dtype, spec=spec)
    pool = kwargs["initial_state"].clone()
    out, returned = recurrent.fused_recurrent_kda(**(kwargs | {"initial_state": pool}))
    assert returned is pool  # updated in place
    expected = recurrent_expected(kwargs, dtype)
    excess = kda_tolerance.excess(out, expected[0], expected[2], pool, expected[1])
    assert passes(excess), excess
    written = ~torch.isnan(expected[0]).any(-1)
    assert torch.isfinite(out[written]).all()
    # Padded slots: their first output is 0 and slots <= 0 keep their bytes.
    assert torch.equal(pool[0], kwargs["initial_state"][0])
    assert torch.equal(pool[-1], kwargs["initial_state"][-1])
    if not spec:
        assert not out[0, [1, 3]].any()
    # Perturbed: the pool read as S[k, v] fails.
    transposed = kwargs | {"initial_state": kwargs["initial_state"].mT.contiguous()}
    t_out, t_pool, _ = recurrent_expected(transposed, dtype)
    assert not passes(kda_tolerance.excess(out, t_out, expected[2], pool, t_pool.mT))


@BOUNDS
def test_packed_decode_kernel_matches_the_reference(
    recurrent_interpretable, lower_bound
):
    """0.27.1's pure-decode kernel (fused_recurrent_kda_packed_decode, from
    the packed post-convolution q|k|v) against the same reference."""
    kwargs = recurrent_args(lower_bound, torch.bfloat16)
    q, k, v = (kwargs[n][0].flatten(1) for n in "qkv")
    pool = kwargs["initial_state"].clone()
    out, _ = recurrent.fused_recurrent_kda_packed_decode(
        mixed_qkv=torch.cat([q, k, v], -1), raw_g=kwargs["raw_g"],
        raw_beta=kwargs["raw_beta"], A_log=kwargs["A_log"],
        dt_bias=kwargs["dt_bias"], lower_bound=lower_bound, initial_state=pool,
        state_indices=kwargs["ssm_state_indices"],
    )  # fmt: skip
    expected = recurrent_expected(kwargs, torch.bfloat16)
    excess = kda_tolerance.excess(out, expected[0], expected[2], pool, expected[1])
    assert passes(excess), excess
    wrong = recurrent_expected(kwargs | {"lower_bound": -4.0}, torch.bfloat16)
    assert not passes(kda_tolerance.excess(out, wrong[0], expected[2], pool, wrong[1]))


# ---------------------------------- a mixed batch, decodes peeled (#50649)


def test_mixed_batch_through_both_kernels_matches_the_reference(
    recurrent_interpretable, monkeypatch
):
    """Decodes through fused_recurrent_kda on the pool, the prefill tail
    through the vendored chunk path with its own cu_seqlens, initial states
    gathered where has_initial_state, final states written back: the
    reference's mixed step."""
    interpretable(monkeypatch, -5.0)
    lens, decodes = [1, 1, 1, 5, 65], 3
    prefill_lens = lens[decodes:]
    gen = torch.Generator().manual_seed(5)
    T = sum(lens)
    q, k, v, raw_g = (randn(gen, 1, T, HEADS, HEAD_DIM) for _ in range(4))
    raw_beta, A_log = randn(gen, 1, T, HEADS), randn(gen, HEADS)
    bias, pool = randn(gen, HEADS * HEAD_DIM), randn(gen, 8, HEADS, HEAD_DIM, HEAD_DIM)
    slots = torch.tensor([3, 0, 5, 2, 6], dtype=torch.int32)
    has_initial = torch.tensor([True, True, True, False, True])
    expected_out, expected_pool = ref.mixed_batch_reference(
        q, k, v, raw_g, raw_beta, A_log, bias, -5.0, pool, slots, has_initial,
        cu_seqlens_of(lens), decodes,
    )  # fmt: skip
    state = pool.clone()
    decode_out, _ = recurrent.fused_recurrent_kda(
        q=q[:, :decodes], k=k[:, :decodes], v=v[:, :decodes],
        raw_g=raw_g[:, :decodes], raw_beta=raw_beta[:, :decodes], A_log=A_log,
        dt_bias=bias, lower_bound=-5.0, initial_state=state,
        cu_seqlens=cu_seqlens_of(lens[:decodes]),
        ssm_state_indices=slots[:decodes],
    )  # fmt: skip
    prefill_slots = slots[decodes:].long()
    initial = state[prefill_slots].clone()
    initial[~has_initial[decodes:]] = 0
    indices, offsets = reference_chunk_metadata(prefill_lens)
    prefill_out, final = chunk.vendored_chunk_kda_with_fused_gate(
        q[:, decodes:].contiguous(), k[:, decodes:].contiguous(),
        v[:, decodes:].contiguous(), raw_g[:, decodes:].contiguous(),
        raw_beta[:, decodes:], A_log, bias, None, initial, True, -5.0, True,
        cu_seqlens_of(prefill_lens), indices, offsets,
    )  # fmt: skip
    state[prefill_slots] = final
    out = torch.cat([decode_out, prefill_out], 1)
    peak = []
    ref.mixed_batch_reference(
        q, k, v, raw_g, raw_beta, A_log, bias, -5.0, pool, slots, has_initial,
        cu_seqlens_of(lens), decodes, peak=peak,
    )  # fmt: skip
    tol = kda_tolerance.tolerance(
        torch.float32, "chunk", scale=HEAD_DIM**-0.5, peak=max(peak),
        max_len=max(lens), truncating=True,
    )  # fmt: skip
    excess = kda_tolerance.excess(out, expected_out, tol, state, expected_pool)
    assert passes(excess), excess
    # Decodes in the wrong order (prefills first) is caught.
    swapped = torch.cat([prefill_out, decode_out], 1)
    assert not passes(kda_tolerance.excess(swapped, expected_out, tol))
