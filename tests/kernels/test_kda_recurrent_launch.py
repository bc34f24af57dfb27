"""The 0.32.0 series' direct launch of the recurrent KDA kernel (patches
0008-0009, src/k3rocm/kernels/kda_recurrent_launch.py), held to vLLM
0.32.0's own wrapper on the CPU.

A plan is the binary the wrapper launched for a call, found again by the
call's signature. Two things make that sound, and each is tested against
the wrapper itself: every call of one signature is one the wrapper would
launch with the same binary (Triton's cache key of its launch, as
support.recurrent_launch_keys.launch_key models it, AMD's 2 GiB class
included) and grid; and the direct launch hands that binary what the
wrapper would hand Triton for the call (its arguments through the kernel's
real heuristics, pointers for tensors). The calls are the layer's own:
random batches through the real 0.32.0 GDN builder at 12, 6 and 96 heads,
laid out as each of amd/kda.py's recurrent calls, up to the launcher's
largest step. No binary runs here (no GPU; the interpreter compiles
nothing): the launcher, the JIT function's compile and the stream are
stand-ins, named below; GPU proof: docs/benchmarks.md.
"""

import random

import pytest
import torch
from support.vllm_trees import ON_DEFAULT_LINE

pytestmark = pytest.mark.every_line
if ON_DEFAULT_LINE:  # the default line's series has no such module to import
    pytest.skip("the 0.32.0 line's recurrent launch", allow_module_level=True)

import vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent as fused_recurrent  # noqa: E402
from support.gdn_batches import Batch, build, make_builder  # noqa: E402
from support.recurrent_launch_keys import REAL_KERNEL, launch_key  # noqa: E402
from test_kda_recurrent_warm_up import (  # noqa: E402
    MAX_NUM_SEQS,
    NUM_SPEC,
    fused_recurrent_builder,
    random_batch,
    serving_calls,
    stand_in_layer,
)
from triton.runtime.autotuner import Heuristics  # noqa: E402
from vllm.models.kimi_k3.amd import kda_recurrent_launch as launch  # noqa: E402
from vllm.models.kimi_k3.amd import kda_recurrent_warm_up as warm_up  # noqa: E402

from k3rocm.launcher.step_bound import PROVEN_TOKEN_HEADS  # noqa: E402

ARG_NAMES = launch.unwrap(REAL_KERNEL)[0].arg_names


class StandInJit:
    """Stands in for the kernel's JIT function under its real heuristics:
    records each launch's arguments by parameter name; a warm-up run
    (``plan_after``'s) returns a stand-in binary."""

    def __init__(self):
        self.arg_names = ARG_NAMES
        self.launches, self.compiled = [], []

    def run(self, *args, grid, warmup, **kwargs):
        named = dict(zip(self.arg_names, args, strict=False))
        if named.keys() & kwargs.keys():  # as Triton's binder refuses it
            raise TypeError(f"multiple values for {named.keys() & kwargs.keys()}")
        named.update((k, v) for k, v in kwargs.items() if k in self.arg_names)
        options = {"num_warps": kwargs["num_warps"], "num_stages": kwargs["num_stages"]}
        if warmup:
            self.compiled.append((named, options))
            return "binary"
        self.launches.append((grid, named, options))
        return None


@pytest.fixture
def on_a_stand_in_gpu(monkeypatch):
    """The direct path switched on for CPU tensors, the kernel's JIT function,
    the binary's launcher and the stream replaced (named above); returns
    (the stand-in JIT, the direct launches recorded)."""
    jit = StandInJit()
    kernel = Heuristics(jit, ARG_NAMES, REAL_KERNEL.values)
    monkeypatch.setattr(fused_recurrent, "fused_recurrent_kda_fwd_kernel", kernel)
    direct = []
    monkeypatch.setattr(launch, "DIRECT", True)
    monkeypatch.setattr(launch, "_on_gpu", lambda tensor: True)
    monkeypatch.setattr(launch, "_current_stream", lambda device: "stream")
    monkeypatch.setattr(
        launch, "_direct", lambda binary: (lambda *a: direct.append(a), "fn", "meta")
    )
    monkeypatch.setattr(launch, "PLANS", {})
    monkeypatch.setattr(launch, "STATS", {"wrapper_calls": 0, "plans_made": 0})
    return jit, direct


def layer_calls(heads: int, steps: int, monkeypatch) -> list[dict]:
    """The keyword arguments of the recurrent calls the layer makes in
    ``steps`` random steps (each call once through the wrapper, recorded)."""
    calls = []
    with monkeypatch.context() as recording:
        recording.setattr(
            fused_recurrent, "fused_recurrent_kda", lambda **kw: calls.append(kw)
        )
        layer_steps(heads, steps)
    return calls


def layer_steps(heads: int, steps: int) -> None:
    layer = stand_in_layer(heads)
    builder = make_builder(fused_recurrent_builder(), NUM_SPEC)
    builder.vllm_config.scheduler_config.max_num_seqs = MAX_NUM_SEQS
    first = build(builder, Batch([1], 0, [], 0, [50]), NUM_SPEC)
    indices_row = first.spec_state_indices_tensor.stride(0)
    layouts = {
        layout.call: layout
        for layout in warm_up.layer_layouts(layer, indices_row, NUM_SPEC)
    }
    layouts.setdefault(
        "speculative step", layouts.get("speculative step, persistent indices")
    )
    largest = PROVEN_TOKEN_HEADS // heads
    rng = random.Random(heads)
    for _ in range(steps):
        step = rng.choice([0, 0, rng.randint(1, largest), largest])
        serving_calls(layer, builder, random_batch(rng), layouts, step)


def as_launched(value):
    """A kernel argument as the binary receives it."""
    return value.data_ptr() if torch.is_tensor(value) else value


def signature(call: dict) -> tuple:
    return launch._signature(
        call["q"], call["k"], call["v"], call["raw_g"], call["raw_beta"],
        call["A_log"], call["dt_bias"], call["lower_bound"], call["initial_state"],
        call["cu_seqlens"], call["ssm_state_indices"],
        call.get("num_accepted_tokens"), call.get("uniform_sequence_length"),
        call["out"],
    )  # fmt: skip


@pytest.mark.parametrize("heads", (12, 6, 96))
def test_one_signature_is_one_binary_and_grid_of_the_wrapper(heads, monkeypatch):
    """Every pair of the layer's calls with one signature: the wrapper
    launches both with one Triton cache key (AMD's 2 GiB class included)
    and the same programs a request; the calls meet many signatures."""
    calls = layer_calls(heads, 120, monkeypatch)
    jit = StandInJit()
    kernel = Heuristics(jit, ARG_NAMES, REAL_KERNEL.values)
    monkeypatch.setattr(fused_recurrent, "fused_recurrent_kda_fwd_kernel", kernel)
    seen: dict[tuple, tuple] = {}
    for call in calls:
        fused_recurrent.fused_recurrent_kda(**call)
        grid, named, options = jit.launches[-1]
        n = call["cu_seqlens"].shape[0] - 1
        assert grid[0] % n == 0
        launched = (launch_key({**named, **options}), grid[0] // n)
        assert launch._counts_agree(
            call["q"], call["k"], call["v"], call["raw_g"], call["raw_beta"],
            call["ssm_state_indices"], call.get("num_accepted_tokens"),
            call.get("uniform_sequence_length"), call["out"], n,
        )  # fmt: skip
        assert seen.setdefault(signature(call), launched) == launched
    # Pairs met many times over, in several launch configurations, and with
    # storages past 2 GiB (the signature's alignment and 2 GiB bits).
    assert len(calls) > 4 * len(seen)
    assert len({key for key, _ in seen.values()}) >= 6
    assert any(key[2] for key in seen) and any(not key[2] for key in seen)


@pytest.mark.parametrize("heads", (12, 6, 96))
def test_the_direct_launch_hands_the_binary_what_the_wrapper_would(
    heads, monkeypatch, on_a_stand_in_gpu
):
    """Each of the layer's calls of a signature met before is launched
    directly, with the arguments, grid and binary the wrapper launches for
    it (the wrapper run on the same call beside, through the kernel's
    real heuristics); the first call of a signature runs the wrapper."""
    jit, direct = on_a_stand_in_gpu
    calls = layer_calls(heads, 100, monkeypatch)
    planned: dict[tuple, dict] = {}
    checked = 0
    for call in calls:
        key = signature(call)
        before = len(direct)
        fused_recurrent.fused_recurrent_kda(**call)
        if key not in planned:  # the wrapper ran it, and the plan was made
            assert len(direct) == before and jit.compiled
            planned[key] = jit.compiled[-1]
            continue
        assert len(direct) == before + 1
        grid_x, _, _, stream, fn, meta, *hooks_and_args = direct[-1]
        assert (stream, fn, meta, hooks_and_args[:3]) == (
            "stream",
            "fn",
            "meta",
            [None] * 3,
        )
        # The wrapper on the same call, beside: what Triton would launch.
        with monkeypatch.context() as wrapper_only:
            wrapper_only.setattr(launch, "DIRECT", False)
            fused_recurrent.fused_recurrent_kda(**call)
        grid, named, options = jit.launches[-1]
        assert grid_x == grid[0]
        assert hooks_and_args[3:] == [as_launched(named[n]) for n in ARG_NAMES]
        compiled_named, compiled_options = planned[key]
        assert compiled_options == options
        assert launch_key({**compiled_named, **compiled_options}) == launch_key(
            {**named, **options}
        )
        checked += 1
    assert checked > 2 * len(planned)  # most calls met their plan
    assert launch.STATS["plans_made"] == len(planned)
