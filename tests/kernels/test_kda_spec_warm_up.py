"""The 0.27.1 series' speculative warm-up (k3.11, patches 0002 and 0005:
``warm_up_spec_recurrent_kda``) against the real Kimi KDA layer: every
launch of the recurrent kernel that vLLM 0.27.1's layer
(``KimiGatedDeltaNetAttention``, its whole forward, patched) makes on
dspark's steps is one the ROCm builder compiled at its first build with
that layer's state pool, before the server reports ready.

The spec path's recurrent call runs vLLM's own wrapper (no precompiled
plan), which compiles the token strides in; the layer lays the call out one
way in a step of spec decodes only and another beside other requests.
Kimi-K3's shapes: head_dim 128, 12, 6 and 96 heads a rank (the full-rank
gate; at 12 also the low-rank one), bfloat16 projections, dspark's 7 draft
tokens. Eager and piecewise CUDA-graph steps only: the launcher refuses
dspark with FULL graphs (vLLM #49918).

Stand-ins, for what cannot exist here or what the recurrent calls do not
read: the recurrent kernel is a recorder of Triton's compile keys
(support.recurrent_launch_keys: no GPU here, and the interpreter compiles
nothing), and "on a GPU" is declared to the warm-up for the same reason;
ROCm's GEMM is vLLM's default one (torch's linear); the platform is
declared ROCm; the convolution kernels write nothing (their wrappers, which
lay out the outputs, are vLLM's); chunk KDA, which takes a step's prefills
and (in 0.27.1's builder, beside spec decodes) its plain decodes, returns
zeros, and gather_initial_states (which asserts a CUDA tensor) is its
documented semantics on the CPU. Steps are short, since their projections
run here.
"""

import random

import pytest
import torch
import vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn as kimi_layer
import vllm.model_executor.layers.utils as gemm
import vllm.models.kimi_k3.amd.ops.third_party.kda as amd_kda
import vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent as fused_recurrent
from support.gdn_batches import Batch, build, builder_config, make_builder
from support.kimi_layer import (
    LAYER_HIDDEN,
    gather_initial_states_on_cpu,
    inert_convolutions,
    kimi_k3_layer,
    single_rank,
)
from support.recurrent_launch_keys import Recorder
from vllm.config import VllmConfig
from vllm.forward_context import set_forward_context
from vllm.models.kimi_k3.amd.kda_metadata import KimiK3ROCmKDAMetadataBuilder
from vllm.models.kimi_k3.amd.ops.third_party.kda import kda_launch_warm_up
from vllm.platforms import current_platform

NUM_SPEC = 7  # dspark's draft tokens
MAX_REQUESTS = 8
PREFIX = "model.layers.0.self_attn"  # the layer make_builder's builder serves


def kimi_layer_and_builder(heads: int, full_rank: bool):
    """A Kimi-K3 KDA layer of ``heads`` heads a rank in a config with
    dspark's speculation, then the ROCm builder of that config (which finds
    the layer, as vLLM builds it after the model); weights random, the state
    pools bound as vLLM binds them."""
    config = builder_config(NUM_SPEC, "bfloat16")
    config.scheduler_config.max_num_batched_tokens = 256  # the chunk warm-up's
    # Past the block table's entries; at 96 heads past 2 GiB, as a dep16
    # rank's pool is (AMD's pointer class: reserved, never touched here).
    slots = 400 if heads == 96 else 128
    layer = kimi_k3_layer(
        kimi_layer.KimiGatedDeltaNetAttention, config, PREFIX, heads, slots, full_rank
    )
    builder = make_builder(KimiK3ROCmKDAMetadataBuilder, NUM_SPEC, config=config)
    assert builder.kda_layers == [layer]
    return layer, builder


def stand_in_chunk_kda(**kwargs):
    return torch.zeros_like(kwargs["v"]), torch.zeros_like(kwargs["initial_state"])


@pytest.fixture(scope="module")
def process_group():
    with single_rank(VllmConfig()):
        yield


@pytest.fixture
def recorder(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(fused_recurrent, "fused_recurrent_kda_fwd_kernel", recorder)
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    # ROCm's GEMM (picked per call on ROCm) needs an AMD GPU: vLLM's default.
    monkeypatch.setattr(gemm, "rocm_unquantized_gemm", gemm.default_unquantized_gemm)
    monkeypatch.setattr(kda_launch_warm_up, "_on_gpu", lambda tensor: True)
    monkeypatch.setattr(kda_launch_warm_up, "DIRECT", False)  # no decode plans
    inert_convolutions(monkeypatch, kimi_layer)
    monkeypatch.setattr(amd_kda, "chunk_kda_with_fused_gate", stand_in_chunk_kda)
    monkeypatch.setattr(
        kimi_layer, "gather_initial_states", gather_initial_states_on_cpu
    )
    return recorder


def random_spec_batch(rng: random.Random) -> Batch:
    """A dspark step: spec decodes (1 to 8 tokens each, drafts in all but
    some), alone or beside plain decodes and prefills."""
    spec = [rng.randint(1, NUM_SPEC + 1) for _ in range(rng.randint(1, MAX_REQUESTS))]
    if max(spec) == 1:  # a step without drafts is no spec step
        spec[0] = rng.randint(2, NUM_SPEC + 1)
    alone = rng.random() < 0.4
    decodes = 0 if alone else rng.randint(0, 3)
    prefills = [] if alone else [rng.randint(2, 24) for _ in range(rng.randint(0, 2))]
    if not alone and not decodes and not prefills:
        decodes = 1
    padding = rng.choice([0, 0, 2])
    contexts = [30] * (len(spec) + decodes) + [rng.choice([0, 30]) for _ in prefills]
    return Batch(spec, decodes, prefills, padding, contexts + [0] * padding)


def call_kind(metadata) -> str:
    if metadata.num_prefills or metadata.num_decodes:
        return kda_launch_warm_up.SPEC_BESIDE_OTHERS
    return kda_launch_warm_up.SPEC_STEP


def serve(heads: int, full_rank: bool, recorder, steps: int = 30):
    """The builder's first build (the warm-ups), then random dspark steps
    through the layer's whole forward; the kinds of spec call made, and what
    the warm-up said it did."""
    layer, builder = kimi_layer_and_builder(heads, full_rank)
    rng = random.Random(heads)
    kinds = set()
    for step in range(steps):
        metadata = build(builder, random_spec_batch(rng), NUM_SPEC)
        if step == 0:  # the first build: the warm-ups ran, nothing launched
            warmed = builder.spec_kda_warm_up
            assert warmed.layers == 1 and not recorder.launched
        padded = metadata.num_actual_tokens + rng.choice([0, 5])
        hidden = torch.randn(padded, LAYER_HIDDEN, dtype=torch.bfloat16)
        with set_forward_context({PREFIX: metadata}, builder.vllm_config):
            layer.forward(hidden, torch.arange(padded), torch.empty_like(hidden))
        kinds.add(call_kind(metadata))
    return kinds, warmed


@pytest.mark.parametrize(
    ("heads", "full_rank"), [(12, True), (12, False), (6, True), (96, True)]
)
def test_every_spec_launch_of_the_real_layer_was_compiled_by_the_warm_up(
    heads, full_rank, process_group, recorder
):
    kinds, warmed = serve(heads, full_rank, recorder)
    assert kinds == set(kda_launch_warm_up.SPEC_LAYOUTS) and warmed.kinds == 2
    # Each binary the warm-up compiled is one a step launched, and no other.
    assert recorder.launched == recorder.compiled


# Warm-ups wrong in one way each, and how many kinds of spec call they miss.
PLANTED = {
    # k3.10's builder: the first step of each kind compiles after ready
    "no spec warm-up": ({"SPEC_LAYOUTS": ()}, 2),
    "the lone spec step's layout only": (
        {"SPEC_LAYOUTS": (kda_launch_warm_up.SPEC_STEP,)}, 1
    ),
    # raw_beta gathered where the layer slices the projection's rows
    "the lone spec step laid out as the gathered one": (
        {"SPEC_STEP": "no layout"}, 1
    ),
}  # fmt: skip


@pytest.mark.parametrize("planted", list(PLANTED))
def test_a_warm_up_short_of_the_layer_misses_spec_launches(
    planted, process_group, recorder, monkeypatch
):
    changes, missed = PLANTED[planted]
    for name, value in changes.items():
        monkeypatch.setattr(kda_launch_warm_up, name, value)
    serve(12, True, recorder, steps=10)
    assert len(recorder.launched - recorder.compiled) == missed
