"""The series' precompiled chunk KDA launches (patch 0005,
src/k3rocm/kernels/kda_chunk_launch.py) in the real patched vLLM 0.27.1
tree, on the CPU. The launches themselves need a GPU (docs/benchmarks.md,
benchmarks/gpu_kda_launch.py: bitwise equality with the vendored path and
Triton's own choice of binaries, per batch); here: the integer
specialization classes against Triton's own specializer, every launch's
arguments against its kernel's parameters, and the fallback to the vendored
path where nothing is compiled (the Triton interpreter)."""

import itertools

import pytest
import torch
import vllm.models.kimi_k3.amd.ops.third_party.kda.chunk as chunk
import vllm.models.kimi_k3.amd.ops.third_party.kda.kda_chunk_launch as launch
from support.kda_interpreter import fresh, interpretable, poisoned
from triton._C.libtriton import native_specialize_impl
from triton.backends.amd.compiler import HIPBackend
from triton.backends.compiler import BaseBackend
from vllm.models.kimi_k3.amd.ops.third_party.kda import (
    kda_chunk_forward,
    kda_chunk_plans,
    kda_direct_launch,
    kda_launch_entry,
    kda_recurrent_plans,
)

from k3rocm.smoke.chunk_reference import cu_seqlens_of, reference_chunk_metadata

HEADS, HEAD_DIM = 2, 32


def triton_view(value: int, specialized: bool) -> tuple:
    """What Triton's own specializer makes of an integer argument."""
    return tuple(native_specialize_impl(BaseBackend, value, False, specialized, True))


@pytest.mark.parametrize("specialized", [True, False])
def test_integer_classes_are_those_triton_specializes_on(specialized):
    values = [0, 1, 2, 7, 15, 16, 17, 32, 48, 4096, 4097, 2**31 - 16, 2**31, 2**40]
    values += [-1, -16, -(2**31), -(2**31) - 1]
    by_class: dict[int, set] = {}
    for value in values:
        by_class.setdefault(kda_direct_launch.int_class(value, specialized), set()).add(
            triton_view(value, specialized)
        )
    # One Triton view per class, and different classes, different views.
    assert all(len(views) == 1 for views in by_class.values())
    views = [next(iter(v)) for v in by_class.values()]
    assert len(set(views)) == len(views)


def batch(seq_lens, lower_bound, dtype=torch.bfloat16):
    total = sum(seq_lens)
    g = torch.Generator().manual_seed(len(seq_lens))

    def randn(*size, dtype=dtype):
        return torch.randn(*size, generator=g, dtype=dtype)

    cu = cu_seqlens_of(seq_lens)
    indices, offsets = reference_chunk_metadata(seq_lens)
    shape = (1, total, HEADS, HEAD_DIM)
    return (
        randn(*shape), randn(*shape), randn(*shape), randn(*shape),
        randn(1, total, HEADS), randn(HEADS, dtype=torch.float32),
        randn(HEADS * HEAD_DIM, dtype=torch.float32), None,
        randn(len(seq_lens), HEADS, HEAD_DIM, HEAD_DIM, dtype=torch.float32),
        True, lower_bound, True, cu, indices, offsets,
    )  # fmt: skip


def stand_in_consts() -> dict:
    """Configuration values for _forward in place of a plan's."""
    consts = {
        f"{s}_{n}": 64
        for s, names in kda_chunk_plans._CONFIG_VALUES.items()
        for n in names
    }
    consts.update(
        kda_chunk_forward._platform_constants(), l2norm_q_BD=32, l2norm_k_BD=32
    )
    consts.update(intra_BK=32, intra_BH=1)
    return consts


@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["safe-gate", "no-bound"])
def test_every_launch_passes_its_kernels_parameters(lower_bound):
    """_forward's arguments, site by site, line up with the vendored
    kernels' parameter lists: the count, and the tensors the vendored code
    passes by name in the places those names have."""
    args = batch([1, 70, 0, 3], lower_bound)
    prepared = kda_chunk_forward.prepare(*args)
    consts = stand_in_consts()
    seen = {}

    def record(site, grid, *kernel_args):
        jit, _ = launch.unwrap(launch.site_kernel(site, lower_bound))
        assert len(kernel_args) == len(jit.arg_names), site
        named = dict(zip(jit.arg_names, kernel_args, strict=True))
        assert all(n >= 0 for n in grid) and len(grid) == 3
        seen[site] = named

    out, state = kda_chunk_forward._forward(record, consts, False, *prepared)
    assert list(seen) == list(launch.SITES)
    cu, indices, offsets = args[12:]
    for site, named in seen.items():
        if "cu_seqlens" in named:
            assert named["cu_seqlens"] is cu, site
        if "chunk_indices" in named:
            assert named["chunk_indices"] is indices, site
        if "T" in named:
            assert named["T"] == sum([1, 70, 0, 3]), site
    assert seen["delta_h"]["chunk_offsets"] is offsets
    assert seen["delta_h"]["h0"] is prepared[8]
    assert seen["output"]["o"] is prepared[2] is out  # written over v
    assert seen["delta_h"]["ht"] is state
    assert seen["gate"]["USE_LOWER_BOUND"] is (lower_bound is not None)
    assert seen["inter_solve"]["USE_SAFE_GATE"] is (lower_bound is not None)
    # The l2norm outputs are what every later kernel reads as q and k.
    assert seen["output"]["q"] is seen["l2norm_q"]["Y"]
    assert seen["recompute_w_u"]["k"] is seen["l2norm_k"]["Y"]


def test_interpreter_runs_the_vendored_path_with_the_same_arguments(monkeypatch):
    """Where nothing is compiled (TRITON_INTERPRET=1, as here) every call
    with metadata goes to the vendored function, arguments unchanged."""
    assert launch.DIRECT is False
    calls = []

    def vendored(*call_args):
        calls.append(call_args)
        return "vendored"

    monkeypatch.setattr(chunk, "vendored_chunk_kda_with_fused_gate", vendored)
    args = batch([5, 64], -5.0)
    before = dict(launch.STATS)
    assert chunk.chunk_kda_with_fused_gate(*args) == "vendored"
    (call,) = calls
    assert all(a is b for a, b in zip(call, args, strict=True))
    assert launch.STATS["vendored_calls"] == before["vendored_calls"] + 1
    assert launch.STATS["plans_made"] == before["plans_made"]
    # Without metadata the vendored function is called directly.
    no_metadata = (*args[:13], None, None)
    assert chunk.chunk_kda_with_fused_gate(*no_metadata) == "vendored"
    assert launch.STATS["vendored_calls"] == before["vendored_calls"] + 1


PIECES = [
    ((1, 77, 2, 32), torch.float32),
    ((1, 77, 2), torch.float32),
    ((1, 77, 2, 64), torch.bfloat16),
    ((1, 3, 2, 32, 32), torch.bfloat16),
    ((1, 1, 2, 16), torch.float32),
]


def test_intermediates_are_cut_from_one_allocation_like_fresh_tensors():
    """The launched path's intermediates: each with the shape, dtype and
    strides torch.empty gives, 256-byte aligned (the binaries assume
    16-byte-aligned pointers), none overlapping another, inside the one
    allocation; as pointers, the same addresses."""
    memory, carved = kda_chunk_forward._carve(torch.device("cpu"), PIECES, False)
    base = memory.data_ptr()
    spans = []
    for tensor, (shape, dtype) in zip(carved, PIECES, strict=True):
        fresh = torch.empty(shape, dtype=dtype)
        assert (tensor.shape, tensor.dtype) == (fresh.shape, fresh.dtype)
        assert tensor.stride() == fresh.stride() and tensor.is_contiguous()
        start = tensor.data_ptr() - base
        assert start % kda_chunk_forward._PIECE_BYTES == 0
        spans.append((start, start + tensor.numel() * tensor.element_size()))
        assert tensor.untyped_storage().data_ptr() == base
    spans.sort()
    assert spans[0][0] == 0 and spans[-1][1] <= memory.numel()
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    memory, pointers = kda_chunk_forward._carve(torch.device("cpu"), PIECES, True)
    assert [p - memory.data_ptr() for p in pointers] == [s for s, _ in spans]


@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["safe-gate", "no-bound"])
def test_pointers_are_the_addresses_of_the_tensors(lower_bound, monkeypatch):
    """The launched path hands the binaries device addresses: launch by
    launch the same arguments as with tensors (the inputs' own addresses;
    the intermediates' at the same places in their allocation)."""
    args = batch([1, 70, 0, 3], lower_bound)
    consts = stand_in_consts()
    seen = {True: [], False: []}

    def recorder(pointers):
        def record(site, grid, *kernel_args):
            seen[pointers].append((site, grid, kernel_args))

        return record

    memories = []
    carve = kda_chunk_forward._carve

    def keep(device, pieces, pointers):
        memory, carved = carve(device, pieces, pointers)
        memories.append(memory)
        return memory, carved

    monkeypatch.setattr(kda_chunk_forward, "_carve", keep)
    out, state = kda_chunk_forward._forward(
        recorder(True), consts, True, *kda_chunk_forward.prepare(*args)
    )
    prepared = kda_chunk_forward.prepare(*args)
    kda_chunk_forward._forward(recorder(False), consts, False, *prepared)
    assert out is args[2] and state.shape == args[8].shape
    bases = [m.data_ptr() for m in memories]
    inputs = {t.data_ptr() for t in prepared if torch.is_tensor(t)}
    for (site, grid, ours), (site_t, grid_t, theirs) in zip(
        seen[True], seen[False], strict=True
    ):
        assert (site, grid) == (site_t, grid_t)
        for a, b in zip(ours, theirs, strict=True):
            if not torch.is_tensor(b):
                assert a == b or (a is None and b is None), site
            elif b.data_ptr() in inputs or b is prepared[2]:
                assert a == b.data_ptr(), site
            else:  # an intermediate, or the final state (its own tensor)
                if b.shape == state.shape and b.dtype == torch.float32:
                    assert a != bases[0], site
                    continue
                assert a - bases[0] == b.data_ptr() - bases[1], site


def interpreted(lower_bound, upper_zeros_off: bool = False):
    """A launch for _forward that runs each site's kernel in the Triton
    interpreter, with the arguments _forward passes; with
    ``upper_zeros_off``, the fused inter + solve kernel is told not to write
    Akk's zeros above the diagonal (what patch 0007 adds)."""

    def run(site, grid, *kernel_args):
        jit, _ = launch.unwrap(launch.site_kernel(site, lower_bound))
        if site == "inter_solve" and upper_zeros_off:
            kernel_args = (*kernel_args[:-1], False)
        jit[grid](*kernel_args)

    return run


# vLLM's kernels use tl.make_block_ptr, which this Triton calls deprecated.
@pytest.mark.filterwarnings("ignore:tl.make_block_ptr is deprecated")
@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["safe-gate", "no-bound"])
def test_launched_sequence_is_bitwise_the_vendored_path(lower_bound, monkeypatch):
    """_forward's eight kernels, each run in the Triton interpreter with the
    configurations the vendored path's autotuners chose, on an allocation
    full of NaNs and with no zero-fill of Akk: outputs and final states
    bitwise those of vLLM 0.27.1's vendored path. The control run, without
    the zeros patch 0007 lets the inter + solve kernel write, differs: so
    the poison reaches the outputs wherever a read comes before a write,
    a full chunk and a partial one (70 = 64 + 6 tokens) among them."""
    interpretable(monkeypatch, lower_bound)
    args = batch([1, 70, 0, 3], lower_bound, torch.float32)
    expected = chunk.vendored_chunk_kda_with_fused_gate(*fresh(args))
    prepared = kda_chunk_forward.prepare(*fresh(args))
    consts = kda_chunk_plans._consts(
        kda_chunk_plans.chosen_configs(lower_bound),
        lower_bound,
        prepared[0],
        prepared[1],
    )
    monkeypatch.setattr(kda_chunk_forward, "_carve", poisoned(kda_chunk_forward._carve))
    ours = kda_chunk_forward._forward(
        interpreted(lower_bound), consts, False, *prepared
    )
    for a, b in zip(ours, expected, strict=True):
        assert torch.equal(a, b)
    control = kda_chunk_forward.prepare(*fresh(args))
    unzeroed = kda_chunk_forward._forward(
        interpreted(lower_bound, upper_zeros_off=True), consts, False, *control
    )
    assert not torch.equal(unzeroed[0], expected[0])


# ---------------------------------------- the recurrent launch (peeled decodes)


def decode_call(decodes=3, heads=HEADS, dim=HEAD_DIM, slots=8):
    """fused_recurrent_kda's keyword arguments as patch 0004 passes them for
    a mixed batch's decodes: views of the layer's buffers, the state pool,
    a column of the block table as state indices."""
    g = torch.Generator().manual_seed(7)
    tokens = decodes + 5  # the prefill slice follows

    def randn(*size):
        return torch.randn(*size, generator=g)

    projected = randn(tokens, 3 * heads * dim + heads + dim)
    beta = projected[:, 3 * heads * dim : 3 * heads * dim + heads].unsqueeze(0)
    block_table = torch.arange(1, 1 + 2 * (decodes + 1), dtype=torch.int32)
    return {
        **{n: randn(1, tokens, heads, dim)[:, :decodes] for n in "qkv"},
        "raw_g": randn(1, tokens, heads, dim)[:, :decodes],
        "raw_beta": beta[:, :decodes],
        "A_log": randn(heads), "dt_bias": randn(heads * dim), "lower_bound": -5.0,
        "initial_state": randn(slots, heads, dim, dim),
        "cu_seqlens": torch.arange(decodes + 1, dtype=torch.int32),
        "ssm_state_indices": block_table.reshape(-1, 2)[:decodes, 0],
        "out": torch.empty(1, tokens, heads, dim)[:, :decodes],
    }  # fmt: skip


class KernelRecorder:
    """Stands in for fused_recurrent_kda_fwd_kernel under the wrapper:
    records ``kernel[grid](**kwargs)``."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def launch(**kwargs):
            self.calls.append((grid, kwargs))

        return launch


@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["safe-gate", "no-bound"])
@pytest.mark.parametrize("dt_bias", [True, False], ids=["bias", "no-bias"])
def test_the_recurrent_launch_passes_what_the_wrapper_passes(
    lower_bound, dt_bias, monkeypatch
):
    """The direct launch's arguments are, name by name, those vLLM's
    wrapper hands Triton for the same call, plus the values the kernel's
    heuristics add; its grid is the wrapper's."""
    from vllm.models.kimi_k3.amd.ops.third_party.kda import fused_recurrent

    kwargs = decode_call() | {"lower_bound": lower_bound}
    if not dt_bias:
        kwargs["dt_bias"] = None
    kernel = fused_recurrent.fused_recurrent_kda_fwd_kernel
    jit, _ = launch.unwrap(kernel)
    recorder = KernelRecorder()
    monkeypatch.setattr(fused_recurrent, "fused_recurrent_kda_fwd_kernel", recorder)
    fused_recurrent.fused_recurrent_kda(**kwargs)
    ((grid, theirs),) = recorder.calls
    ours = dict(
        zip(
            jit.arg_names,
            kda_recurrent_plans._recurrent_arguments(*kwargs.values()),
            strict=True,
        )
    )
    heuristics = {
        name: rule(theirs) for name, rule in kernel.values.items()
    }  # the decorator's
    assert heuristics.keys() == {"IS_SPEC_DECODING", "HAS_DT_BIAS", "USE_LOWER_BOUND"}
    for name, value in ours.items():
        expected = heuristics[name] if name in heuristics else theirs[name]
        if torch.is_tensor(value) or value is None:
            assert value is expected, name
        else:
            assert value == expected and type(value) is type(expected), name
    assert (kda_recurrent_plans._recurrent_grid(tuple(ours.values())),) == tuple(grid)
    assert kda_recurrent_plans._recurrent_layout(*kwargs.values())


def test_the_recurrent_kinds_follow_what_the_binary_depends_on():
    def kind(call):
        return kda_recurrent_plans._recurrent_key(
            kda_recurrent_plans._recurrent_arguments(*call.values())
        )

    base = decode_call()
    # More decodes: N and T are not specialized.
    assert kind(decode_call(decodes=5)) == kind(base)
    # A pool whose blocks are padded (vLLM's hybrid page layout): handled,
    # and another kind (its row stride is a constexpr); so is a wider
    # block table's column of state indices.
    blocks = torch.zeros(8, 3, HEADS, HEAD_DIM, HEAD_DIM)[:, 0]
    padded = base | {"initial_state": blocks}
    assert kda_recurrent_plans._recurrent_layout(*padded.values())
    assert kind(padded) != kind(base)
    table = torch.arange(1, 13, dtype=torch.int32).reshape(-1, 4)
    assert kind(base | {"ssm_state_indices": table[:3, 0]}) != kind(base)
    transposed = base | {"initial_state": base["initial_state"].mT}
    assert not kda_recurrent_plans._recurrent_layout(*transposed.values())


def batch_call(decodes=3, prefill=5, heads=HEADS, dim=HEAD_DIM, slots=8, width=2):
    """recurrent_kda_launched's arguments (after ``vendored``) as patch 0004
    passes them: the whole mixed batch's tensors (decodes first), the
    state pool, a column of a block table ``width`` blocks wide."""
    g = torch.Generator().manual_seed(11)
    tokens = decodes + prefill

    def randn(*size):
        return torch.randn(*size, generator=g)

    projected = randn(tokens, 3 * heads * dim + heads + dim)
    beta = projected[:, 3 * heads * dim : 3 * heads * dim + heads].unsqueeze(0)
    table = torch.arange(1, 1 + width * (decodes + 1), dtype=torch.int32)
    return [
        decodes, decodes,
        *(randn(1, tokens, heads, dim) for _ in "qkv"),
        randn(1, tokens, heads, dim), beta, randn(heads), randn(heads * dim),
        -5.0, randn(slots, heads, dim, dim),
        torch.arange(decodes + 2, dtype=torch.int32),
        table.reshape(-1, width)[:, 0], torch.empty(1, tokens + 3, heads, dim),
    ]  # fmt: skip


CALL_NAMES = (
    "q", "k", "v", "raw_g", "raw_beta", "A_log", "dt_bias", "lower_bound",
    "initial_state", "cu_seqlens", "ssm_state_indices", "out",
)  # fmt: skip


def test_the_interpreter_runs_the_recurrent_wrapper_on_the_decodes_rows():
    """Handed the whole batch, the launch gives the wrapper the decodes'
    rows: views of the same memory, the sizes the wrapper checks."""
    assert launch.DIRECT is False
    seen = []
    call = batch_call()
    before = dict(launch.RECURRENT_STATS)
    launch.recurrent_kda_launched(lambda **kw: seen.append(kw), *call)
    (got,) = seen
    assert tuple(got) == CALL_NAMES
    decodes = call[0]
    for name, given in zip(CALL_NAMES, call[2:], strict=True):
        if not torch.is_tensor(given) or name in ("A_log", "dt_bias", "initial_state"):
            assert got[name] is given, name
            continue
        assert got[name].data_ptr() == given.data_ptr(), name
        assert got[name].stride() == given.stride(), name
        rows = got[name].shape[0 if given.ndim == 1 else 1]
        expected = {"cu_seqlens": decodes + 1}.get(name, decodes)
        assert rows == expected, name
    assert launch.RECURRENT_STATS["vendored_calls"] == before["vendored_calls"] + 1
    assert launch.RECURRENT_STATS["plans_made"] == before["plans_made"]


def _signature(call) -> tuple:
    """recurrent_kda_launched's plan lookup key for ``call``, its pointers'
    alignment taken in the order the launch takes it."""
    q, k, v, raw_g, raw_beta, A_log, dt_bias, _, state, cu, idx, out = call[2:]
    misaligned = kda_direct_launch._misaligned(
        q, k, v, raw_g, raw_beta, A_log, dt_bias, out, state, cu, idx
    )
    return kda_recurrent_plans._recurrent_signature(*call[2:], misaligned)


def _decision(call) -> tuple:
    """What the full check decides for ``call``: covered or not, its kind."""
    rows = kda_recurrent_plans._decode_rows(*call)
    if not kda_recurrent_plans._recurrent_layout(*rows):
        return (False,)
    return True, kda_recurrent_plans._recurrent_key(
        kda_recurrent_plans._recurrent_arguments(*rows)
    )


def _moved(tensor: torch.Tensor, elements: int = 1) -> torch.Tensor:
    """``tensor``'s values at the same strides, ``elements`` further on."""
    span = 1 + sum(
        (n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True)
    )
    base = torch.zeros(span + elements, dtype=tensor.dtype)
    moved = torch.as_strided(base, tensor.shape, tensor.stride(), elements)
    moved.copy_(tensor)
    return moved


def over_2gib(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor of ``tensor``'s shape, strides and dtype in a storage past
    2 GiB (reserved by the allocator, never touched: only sizes matter):
    AMD's Triton compiles its pointer apart (test_kda_launch_pointer_range)."""
    storage = torch.empty(
        2**31 // tensor.element_size() + tensor.numel(), dtype=tensor.dtype
    )
    view = storage[: tensor.numel()].view(tensor.shape)
    return view.as_strided(tensor.shape, tensor.stride())


def _with(call: list, index: int, *values) -> list:
    return call[:index] + list(values) + call[index + len(values) :]


def _variants():
    """Calls that differ in one way each from batch_call's: layouts the
    plans cover and layouts they do not, in every argument."""
    base = batch_call()
    Q, BETA, POOL, CU, IDX, OUT = 2, 6, 10, 11, 12, 13
    yield "base", base
    yield "more decodes", batch_call(decodes=5)
    yield "more rows", batch_call(prefill=40)
    yield "one decode", batch_call(decodes=1)
    yield "wider table", batch_call(width=4)
    yield "contiguous indices", _with(base, IDX, torch.arange(1, 5, dtype=torch.int32))
    padded_pool = torch.zeros(8, 3, HEADS, HEAD_DIM, HEAD_DIM)[:, 1]
    yield "padded pool", _with(base, POOL, padded_pool)
    yield "transposed pool", _with(base, POOL, base[POOL].mT)
    yield (
        "strided cu_seqlens",
        _with(base, CU, torch.arange(12, dtype=torch.int32)[::2]),
    )
    yield "no bias", _with(base, 8, None)
    yield "no bound", _with(base, 9, None)
    yield "int bound", _with(base, 9, -5)
    for i, name in enumerate(CALL_NAMES):
        value = base[2 + i]
        if not torch.is_tensor(value):
            continue
        yield f"{name} in float16", _with(base, 2 + i, value.to(torch.float16))
        yield f"{name} misaligned", _with(base, 2 + i, _moved(value))
        yield f"{name} moved by 16 bytes", _with(base, 2 + i, _moved(value, 4))
        yield f"{name} past 2 GiB", _with(base, 2 + i, over_2gib(value))
    wide_q = torch.zeros(1, 8, HEADS, 2 * HEAD_DIM)[..., :HEAD_DIM]
    yield "q rows wider", _with(base, Q, wide_q)
    qkv = torch.zeros(1, 8, 3, HEADS, HEAD_DIM)
    yield "q k v one buffer", _with(base, Q, *(qkv[:, :, i] for i in range(3)))
    yield "dense beta", _with(base, BETA, base[BETA].contiguous())
    yield "out too short", _with(base, OUT, base[OUT][:, :2])
    yield "tokens differ", [base[0], base[0] + 1, *base[2:]]
    yield (
        "fewer heads in out",
        _with(base, OUT, torch.empty(1, 11, HEADS - 1, HEAD_DIM)),
    )


def _amd_classes(call) -> tuple:
    """What AMD's Triton specializes the kernel's tensor arguments on (16-byte
    alignment, storage within 2 GiB) for ``call``'s decodes."""
    arguments = kda_recurrent_plans._recurrent_arguments(
        *kda_recurrent_plans._decode_rows(*call)
    )
    return tuple(
        HIPBackend.get_tensor_specialization(a, align=True)
        for a in arguments
        if torch.is_tensor(a)
    )


def test_one_signature_is_one_decision_of_the_full_check(amd_buffer_ops):
    """The launch's cheap lookup is sound: two calls of one signature (with
    the rows the decodes need) are covered or refused alike, and are of one
    kind, whose calls AMD's Triton compiles alike; the variants are met in
    pairs of every kind of difference."""
    seen: dict[tuple, tuple] = {}
    amd: dict[tuple, tuple] = {}
    decisions = set()
    for name, call in _variants():
        enough = kda_recurrent_plans._rows(
            call[0], *call[2:7], call[13], call[11], call[12]
        )
        if call[0] != call[1] or not enough:  # the launch looks neither up
            assert not _decision(call)[0], name
            continue
        decision = _decision(call)
        decisions.add(decision)
        if decision[0]:
            classes = amd.setdefault(decision, (name, _amd_classes(call)))
            assert classes[1] == _amd_classes(call), (name, classes[0])
        signature = _signature(call)
        if signature in seen:
            assert seen[signature][1] == decision, (name, seen[signature][0])
        seen[signature] = (name, decision)
    assert (False,) in decisions
    assert len(decisions) > 10
    # Calls that differ only in their counts or in 16-byte moves share one
    # signature: every layer of every step meets it again, no full check.
    same = {"base", "more decodes", "more rows", "one decode"}
    same |= {n for n, _ in _variants() if n.endswith("moved by 16 bytes")}
    assert len({_signature(c) for n, c in _variants() if n in same}) == 1


def _described(arguments) -> tuple:
    """Kernel arguments with each tensor as what the kernel sees of it."""
    return tuple(
        (a.data_ptr(), a.shape, a.stride(), a.dtype) if torch.is_tensor(a) else a
        for a in arguments
    )


def test_the_direct_launch_passes_the_wrappers_arguments(monkeypatch):
    """With a plan (stood in: no binary on the CPU), a call is launched with
    the pointers and values of _recurrent_arguments for its decodes' rows
    and the wrapper's grid; a kind met first runs the wrapper and is planned
    after it, a kind planned already (the warm-up's) is launched at once
    under a new signature."""
    launches, compiled = [], []

    class Kernel:
        def run(self, *args, grid, warmup, num_warps, num_stages):
            compiled.append((args, grid, warmup, num_warps, num_stages))
            return "binary"

    def record(*args):
        launches.append(args)

    monkeypatch.setattr(kda_launch_entry, "DIRECT", True)
    monkeypatch.setattr(kda_launch_entry, "_on_gpu", lambda tensor: True)
    monkeypatch.setattr(kda_recurrent_plans, "_recurrent_kernel", Kernel)
    monkeypatch.setattr(
        kda_recurrent_plans, "_direct", lambda binary: (record, "fn", "meta")
    )
    monkeypatch.setattr(
        kda_launch_entry, "_current_stream", lambda device: ("stream", device)
    )
    monkeypatch.setattr(kda_launch_entry, "_RECURRENT_PLANS", {})
    monkeypatch.setattr(kda_launch_entry, "_RECURRENT_SIGNATURES", {})
    monkeypatch.setattr(
        kda_launch_entry, "RECURRENT_STATS", {"vendored_calls": 0, "plans_made": 0}
    )
    wrapper = []

    def vendored(**kwargs):
        wrapper.append(kwargs)

    first = batch_call(decodes=3)
    kda_launch_entry.recurrent_kda_launched(vendored, *first)
    assert len(wrapper) == 1 and launches == []
    ((args, grid, warmup, warps, stages),) = compiled
    expected = kda_recurrent_plans._recurrent_arguments(
        *kda_recurrent_plans._decode_rows(*first)
    )
    assert _described(args) == _described(expected[:-1])
    assert (grid, warmup, warps, stages) == ((1,), True, 4, 2)
    assert kda_launch_entry.RECURRENT_STATS == {"vendored_calls": 1, "plans_made": 1}

    def pointers(call):
        arguments = kda_recurrent_plans._recurrent_arguments(
            *kda_recurrent_plans._decode_rows(*call)
        )
        return tuple(a.data_ptr() if torch.is_tensor(a) else a for a in arguments)

    second = batch_call(decodes=5, prefill=9)
    kda_launch_entry.recurrent_kda_launched(vendored, *second)
    (call,) = launches
    arguments = kda_recurrent_plans._recurrent_arguments(
        *kda_recurrent_plans._decode_rows(*second)
    )
    grid = kda_recurrent_plans._recurrent_grid(arguments)
    assert call[:9] == (grid, 1, 1, ("stream", -1), "fn", "meta", None, None, None)
    assert call[9:] == pointers(second)
    assert len(wrapper) == 1

    monkeypatch.setattr(kda_launch_entry, "_RECURRENT_SIGNATURES", {})
    kda_launch_entry.recurrent_kda_launched(vendored, *second)
    assert len(wrapper) == 1 and len(launches) == 2 and len(compiled) == 1
    assert launches[1][9:] == pointers(second)
    assert len(kda_launch_entry._RECURRENT_SIGNATURES) == 1
