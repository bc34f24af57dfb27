"""AMD's 2 GiB pointer class in the 0.27.1 series' precompiled launches
(patch 0005): a plan is only launched on storages of the class its binaries
were compiled for.

AMD's Triton backend (buffer ops, on by default in Triton 3.7.1) compiles a
pointer argument apart when its tensor's storage is within 2 GiB
(``HIPBackend.is_within_2gb``: the binary may then address it with 32-bit
buffer offsets). Series k3.9's plan keys held dtypes, shapes, alignment and
integer classes, not that: a long dep16 step (the fused projection that
raw_beta is a view of passes 2 GiB near 21,700 tokens at 96 heads a rank,
the call's one allocation of intermediates near 7,800) would have been
launched directly with binaries compiled for a short step's storages.
NVIDIA's backend has no such class, so the GPU runs cannot show it, and no
MI355X was lent: the reference here is Triton's own HIP specializer, called
on every tensor each launch is given, on the CPU.
"""

import torch
from test_chunk_launch import HEAD_DIM, HEADS, batch, over_2gib, stand_in_consts
from triton.backends.amd.compiler import HIPBackend
from vllm.models.kimi_k3.amd.ops.third_party.kda import (
    kda_chunk_forward,
    kda_chunk_plans,
    kda_direct_launch,
)

from k3rocm.smoke.chunk_reference import cu_seqlens_of, reference_chunk_metadata

# Where chunk_kda_with_fused_gate takes each tensor input.
CHUNK_POSITIONS = {
    "q": 0, "k": 1, "v": 2, "raw_g": 3, "raw_beta": 4, "A_log": 5, "g_bias": 6,
    "initial_state": 8, "cu_seqlens": 12, "chunk_indices": 13, "chunk_offsets": 14,
}  # fmt: skip


def hip_classes(arguments) -> tuple:
    """What AMD's Triton specializes on of each tensor argument (alignment
    and the 2 GiB class), in order; None for the rest."""
    return tuple(
        HIPBackend.get_tensor_specialization(a, align=True)
        if torch.is_tensor(a)
        else None
        for a in arguments
    )


def launched_classes(args: tuple) -> tuple:
    """Every launch of the chunk forward of ``args`` (as a plan is read back:
    tensors, the intermediates cut from one allocation) with AMD's classes
    of its tensor arguments."""
    seen = []
    prepared = kda_chunk_forward.prepare(*args)
    kda_chunk_forward._forward(
        lambda site, _grid, *a: seen.append((site, hip_classes(a))),
        stand_in_consts(), False, *prepared,
    )  # fmt: skip
    return tuple(seen)


def long_call(tokens: int, sequences: int = 2, states: bool = True) -> tuple:
    """A chunk call of ``tokens`` tokens as test_chunk_launch.batch lays it
    out (initial states or none), allocated and never touched (the classes
    depend on sizes only)."""
    lengths = [tokens // sequences] * (sequences - 1)
    lengths.append(tokens - sum(lengths))
    indices, offsets = reference_chunk_metadata(lengths)
    shape, bf16 = (1, tokens, HEADS, HEAD_DIM), torch.bfloat16
    initial = torch.empty(sequences, HEADS, HEAD_DIM, HEAD_DIM) if states else None
    return (
        *(torch.empty(shape, dtype=bf16) for _ in range(4)),
        torch.empty(1, tokens, HEADS, dtype=bf16), torch.zeros(HEADS),
        torch.zeros(HEADS * HEAD_DIM), None, initial, True, -5.0, True,
        cu_seqlens_of(lengths), indices, offsets,
    )  # fmt: skip


def carved(args: tuple) -> int:
    """The size of a call's one allocation of intermediates."""
    prepared = kda_chunk_forward.prepare(*args)
    return kda_chunk_forward.carved_bytes(*prepared[:5], True, prepared[13].shape[0])


def carved_per_token() -> float:
    return carved(long_call(2**16)) / 2**16


def test_amds_triton_compiles_a_storage_past_2_gib_apart(amd_buffer_ops):
    q = batch([3, 70], -5.0)[0]
    assert HIPBackend.get_tensor_specialization(q) != (
        HIPBackend.get_tensor_specialization(over_2gib(q))
    )


def chunk_variants():
    """Calls alike but for which storages pass 2 GiB: each input's, the
    intermediates' one allocation (a step long enough), the final states'
    (enough sequences)."""
    base = batch([3, 70], -5.0)
    yield "base", base
    for name, i in CHUNK_POSITIONS.items():
        if base[i] is not None:
            yield f"{name} past 2 GiB", (*base[:i], over_2gib(base[i]), *base[i + 1 :])
    # A multiple of 16 tokens past the intermediates' 2 GiB, and 160 fewer:
    # the integer classes alike, both steps past it.
    long = (int(2**31 / carved_per_token()) // 16 + 200) * 16
    assert carved(long_call(long - 160)) > kda_direct_launch.POINTER_RANGE
    yield "short step", long_call(long // 4)
    yield "long step", long_call(long)
    yield "long step, shorter", long_call(long - 160)
    yield "no initial states", long_call(16, states=False)
    many = 2**31 // (HEADS * HEAD_DIM * HEAD_DIM * 4) + 1  # float32 states
    yield "many sequences, no initial states", long_call(2 * many, many, False)


def test_a_plan_is_only_launched_on_the_storages_it_was_compiled_for(amd_buffer_ops):
    """Two calls of one kind give every launch tensors of the same AMD
    classes (so one plan's binaries serve both), and a storage past 2 GiB
    makes a call a kind apart from the same call within it."""
    kinds, classes = {}, {}
    first_of_kind: dict[tuple, str] = {}
    for name, args in chunk_variants():
        kinds[name] = kda_chunk_plans.call_kind(args)
        classes[name] = launched_classes(args)
        other = first_of_kind.setdefault(kinds[name], name)
        assert classes[other] == classes[name], (name, other)
    pairs = [("base", n) for n in classes if "past" in n]
    pairs += [
        ("short step", "long step"),
        ("no initial states", "many sequences, no initial states"),
    ]
    for within, past in pairs:
        assert classes[within] != classes[past], past  # Triton tells them apart
        assert kinds[within] != kinds[past], past
    assert kinds["long step"] == kinds["long step, shorter"]


def test_the_storage_class_is_triton_s():
    """``_far`` against the HIP backend's own test, at the edge."""
    for extra in (-1, 0, 1):
        storage = torch.empty(2**31 - 1 + extra, dtype=torch.uint8)
        view = storage[:16]
        within = HIPBackend.is_within_2gb(view)
        assert kda_direct_launch._far(None, view) == (0 if within else 2), extra
