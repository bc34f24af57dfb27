"""A known gap of the 0.27.1 series' precompiled chunk launches (patch
0005) on AMD, kept in view until a series revision closes it.

AMD's Triton backend (buffer ops, on by default in Triton 3.7.1) compiles a
pointer argument apart when its tensor's storage is within 2 GiB
(``HIPBackend.is_within_2gb``: the binary may then address it with 32-bit
buffer offsets). The plan key of a chunk KDA call (``call_kind``) holds
dtypes, shapes, alignment and integer classes, not that: a step whose
inputs pass 2 GiB (q alone at 96 heads a rank past about 87,000 tokens,
within dep16's proven step of 104,000) would be launched directly with a
binary Triton compiled for storages within 2 GiB. NVIDIA's backend has no
such specialization, so the long-step runs on the H100/H200 cannot show
it, and no MI355X was lent. Strict: the day the key tells them apart, this
fails and comes out.
"""

import pytest
import torch
from test_kda_autotune_guard import call
from triton.backends.amd.compiler import HIPBackend
from vllm.models.kimi_k3.amd.ops.third_party.kda import kda_chunk_plans


def over_2gib(tensor: torch.Tensor) -> torch.Tensor:
    """The same values' shape and strides, in a storage past 2 GiB (reserved
    by the allocator, never touched)."""
    storage = torch.empty(
        2**31 // tensor.element_size() + tensor.numel(), dtype=tensor.dtype
    )
    view = storage[: tensor.numel()].view(tensor.shape)
    return view.as_strided(tensor.shape, tensor.stride())


def test_amds_triton_compiles_a_storage_past_2_gib_apart():
    q = call()[0]
    assert HIPBackend.get_tensor_specialization(q) != (
        HIPBackend.get_tensor_specialization(over_2gib(q))
    )


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="0.27.1 series: the chunk plan key omits AMD's 2 GiB pointer class",
)
def test_the_chunk_plan_key_tells_a_storage_past_2_gib_apart():
    args = call()
    far = (over_2gib(args[0]), *args[1:])
    assert kda_chunk_plans.call_kind(args) != kda_chunk_plans.call_kind(far)
