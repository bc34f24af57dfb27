"""The patched GDN metadata builders of vLLM 0.27.1 on random batches that mix
prefills, decodes, speculative decodes and padding.

- KimiK3ROCmKDAMetadataBuilder: the chunk metadata describes exactly the
  cu_seqlens the Kimi layer hands chunk KDA (``non_spec_query_start_loc``).
- The generic builder with the series applied equals the unpatched 0.27.1
  builder, field by field (a non-Kimi GDN layer keeps 0.27.1 behaviour).
- The trap: the generic builder's metadata describes the decode-peeled
  prefill slice, so handing it to the Kimi layer's kernel would be wrong.
"""

import dataclasses
import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.config import SpeculativeConfig, VllmConfig
from vllm.models.kimi_k3.amd.kda_metadata import KimiK3ROCmKDAMetadataBuilder
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import MambaSpec
from vllm_trees import installed_root

from k3rocm.chunk_reference import reference_chunk_metadata

NUM_SPEC = 2


def load_unpatched_gdn_attn():
    """vLLM 0.27.1's own gdn_attn.py, straight from the installed wheel."""
    path = installed_root() / "vllm/v1/attention/backends/gdn_attn.py"
    spec = importlib.util.spec_from_file_location("unpatched_gdn_attn", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not hasattr(module.GDNAttentionMetadataBuilder, "_build_chunk_metadata")
    return module


def make_builder(cls, num_spec: int):
    config = VllmConfig()
    if num_spec:
        config.speculative_config = SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=num_spec,
            prompt_lookup_max=3,
            prompt_lookup_min=1,
        )
    spec = MambaSpec(
        shapes=((8, 3), (2, 4, 4)),
        dtypes=(torch.float32, torch.float32),
        block_size=16,
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        num_speculative_blocks=num_spec,
    )
    return cls(spec, ["model.layers.0.self_attn"], config, torch.device("cpu"))


@pytest.fixture(scope="module")
def builders():
    unpatched = load_unpatched_gdn_attn().GDNAttentionMetadataBuilder
    return {
        num_spec: {
            "kimi": make_builder(KimiK3ROCmKDAMetadataBuilder, num_spec),
            "generic": make_builder(GDNAttentionMetadataBuilder, num_spec),
            "unpatched": make_builder(unpatched, num_spec),
        }
        for num_spec in (0, NUM_SPEC)
    }


@dataclasses.dataclass
class Batch:
    """Requests in the order vLLM's reordering gives them: speculative
    decodes, plain decodes, prefills, then zero-length padding at the back."""

    spec_query_lens: list[int]
    decodes: int
    prefill_query_lens: list[int]
    padding: int
    context_lens: list[int]

    @property
    def query_lens(self) -> list[int]:
        return (
            self.spec_query_lens
            + [1] * self.decodes
            + self.prefill_query_lens
            + [0] * self.padding
        )

    def draft_tokens(self) -> torch.Tensor:
        """Per request: draft tokens of a spec decode, -1 for every other."""
        drafts = [n - 1 for n in self.spec_query_lens]
        drafts += [-1] * (len(self.query_lens) - len(drafts))
        return torch.tensor(drafts, dtype=torch.int32)

    def metadata(self) -> CommonAttentionMetadata:
        query_lens = torch.tensor(self.query_lens, dtype=torch.int32)
        query_start_loc = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
        query_start_loc[1:] = query_lens.cumsum(0)
        seq_lens = query_lens + torch.tensor(self.context_lens, dtype=torch.int32)
        num_reqs = len(query_lens)
        return CommonAttentionMetadata(
            query_start_loc=query_start_loc,
            query_start_loc_cpu=query_start_loc.clone(),
            seq_lens=seq_lens,
            num_reqs=num_reqs,
            num_actual_tokens=int(query_lens.sum()),
            max_query_len=int(query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            block_table_tensor=torch.arange(
                num_reqs * (NUM_SPEC + 1), dtype=torch.int32
            ).reshape(num_reqs, NUM_SPEC + 1),
            slot_mapping=torch.zeros(int(query_lens.sum()), dtype=torch.int64),
        )


@st.composite
def batches(draw, with_spec: bool):
    spec = (
        draw(st.lists(st.integers(1, NUM_SPEC + 1), min_size=1, max_size=6))
        if with_spec
        else []
    )
    decodes = draw(st.integers(0, 8))
    prefills = draw(st.lists(st.integers(2, 400), min_size=0, max_size=8))
    padding = draw(st.integers(0, 4))
    n = len(spec) + decodes + len(prefills) + padding
    contexts = draw(st.lists(st.integers(0, 200), min_size=n, max_size=n))
    # Decodes always continue a sequence; padding has no context.
    for i in range(len(spec) + decodes):
        contexts[i] = max(contexts[i], 1)
    for i in range(n - padding, n):
        contexts[i] = 0
    if not spec and decodes + len(prefills) == 0:
        prefills = [draw(st.integers(2, 400))]
        contexts.insert(n - padding, 0)
    return Batch(spec, decodes, prefills, padding, contexts)


def build(builder, batch: Batch, num_spec: int):
    metadata = batch.metadata()
    if not num_spec:
        return builder.build(0, metadata)
    accepted = torch.ones(metadata.num_reqs, dtype=torch.int32)
    return builder.build(0, metadata, accepted, batch.draft_tokens())


def lengths(cu_seqlens: torch.Tensor) -> list[int]:
    return (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()


def assert_describes(metadata, cu_seqlens: torch.Tensor) -> None:
    indices, offsets = reference_chunk_metadata(lengths(cu_seqlens))
    assert torch.equal(metadata.chunk_indices, indices)
    assert torch.equal(metadata.chunk_offsets, offsets)


@pytest.mark.parametrize("num_spec", [0, NUM_SPEC], ids=["no-spec", "spec"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_kimi_builder_describes_the_cu_seqlens_the_layer_passes(
    builders, num_spec, data
):
    batch = data.draw(batches(with_spec=bool(num_spec)))
    metadata = build(builders[num_spec]["kimi"], batch, num_spec)
    if metadata.num_prefills == 0:
        assert metadata.chunk_indices is None and metadata.chunk_offsets is None
        return
    # KimiGatedDeltaNetAttention._forward calls chunk KDA with
    # cu_seqlens=m.non_spec_query_start_loc (the whole non-spec batch).
    assert_describes(metadata, metadata.non_spec_query_start_loc)


@pytest.mark.parametrize("num_spec", [0, NUM_SPEC], ids=["no-spec", "spec"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_generic_builder_equals_unpatched_field_by_field(builders, num_spec, data):
    batch = data.draw(batches(with_spec=bool(num_spec)))
    patched = build(builders[num_spec]["generic"], batch, num_spec)
    unpatched = build(builders[num_spec]["unpatched"], batch, num_spec)
    names = [f.name for f in dataclasses.fields(unpatched)]
    assert [f.name for f in dataclasses.fields(patched)] == names
    for name in names:
        assert_same(getattr(patched, name), getattr(unpatched, name), name)


def assert_same(ours, theirs, where: str) -> None:
    """Deep equality over the builder's fields (tensors, arrays, dicts)."""
    assert type(ours) is type(theirs), where
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), where
    elif isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), where
    elif isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), where
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{where}[{key!r}]")
    else:
        assert ours == theirs, where


def test_generic_metadata_would_be_wrong_for_the_kimi_layer(builders):
    """In a mixed non-spec batch the generic builder describes the rebased
    prefill-only slice; the Kimi layer's kernel runs over decodes too."""
    batch = Batch([], 3, [130, 70], 0, [5, 9, 2, 0, 0])
    generic = build(builders[0]["generic"], batch, 0)
    kimi = build(builders[0]["kimi"], batch, 0)
    assert_describes(generic, generic.prefill_query_start_loc)
    assert lengths(generic.non_spec_query_start_loc) == [1, 1, 1, 130, 70]
    assert not torch.equal(generic.chunk_indices, kimi.chunk_indices)
    assert kimi.chunk_indices.tolist() == [
        [0, 0], [1, 0], [2, 0], [3, 0], [3, 1], [3, 2], [4, 0], [4, 1],
    ]  # fmt: skip
    assert_describes(kimi, kimi.non_spec_query_start_loc)
