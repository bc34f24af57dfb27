"""Batches for the GDN metadata builders of vLLM (0.27.1, 0.32.0), in the
order vLLM's reordering gives them, and the checks both the builder and the
layer tests make against the reference."""

import dataclasses
import functools
import tempfile
from pathlib import Path

import torch
from hypothesis import strategies as st
from vllm.config import ModelConfig, SpeculativeConfig, VllmConfig
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.kv_cache_interface import MambaSpec

from k3rocm.smoke.chunk_reference import reference_chunk_metadata
from k3rocm.tryout.tiny_model import build_tiny_llama

NUM_SPEC = 2


@functools.cache
def _model_config(dtype: str) -> ModelConfig:
    """A real model's config (the tiny Llama's): 0.32.0's GDN builder reads
    the model's head sizes from it when it picks a prefill backend; a Kimi
    KDA layer built with the builder's config reads its dtype."""
    directory = Path(tempfile.mkdtemp(prefix="k3-gdn-model-"))
    return ModelConfig(model=str(build_tiny_llama(directory)), dtype=dtype)


def builder_config(num_spec: int, dtype: str = "float32") -> VllmConfig:
    """A config for a GDN builder: the tiny Llama's model config in
    ``dtype``, speculation with ``num_spec`` tokens (n-gram proposals)."""
    config = VllmConfig(model_config=_model_config(dtype))
    if num_spec:
        config.speculative_config = SpeculativeConfig(
            method="ngram",
            num_speculative_tokens=num_spec,
            prompt_lookup_max=3,
            prompt_lookup_min=1,
        )
    return config


def make_builder(cls, num_spec: int, dtype: str = "float32", config=None):
    """A ``cls`` builder for the layer ``model.layers.0.self_attn``, in
    ``config`` (builder_config's by default), whose KV cache spec has
    ``num_spec`` speculative blocks."""
    config = config or builder_config(num_spec, dtype)
    spec = MambaSpec(
        shapes=((8, 3), (2, 4, 4)),
        dtypes=(torch.float32, torch.float32),
        block_size=16,
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        num_speculative_blocks=num_spec,
    )
    return cls(spec, ["model.layers.0.self_attn"], config, torch.device("cpu"))


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

    def metadata(self, num_spec: int) -> CommonAttentionMetadata:
        """As the model runner hands it to a builder with ``num_spec``
        speculative tokens (one state block per request plus one each)."""
        query_lens = torch.tensor(self.query_lens, dtype=torch.int32)
        query_start_loc = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
        query_start_loc[1:] = query_lens.cumsum(0)
        seq_lens = query_lens + torch.tensor(self.context_lens, dtype=torch.int32)
        num_reqs = len(query_lens)
        # 0.32.0's builder tells first chunks from resumed ones by the host's
        # sequence lengths (exact here: no asynchronous speculation).
        since_0_32 = {
            name: seq_lens.clone()
            for name in ("seq_lens_cpu_upper_bound",)
            if name in {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
        }
        return CommonAttentionMetadata(
            query_start_loc=query_start_loc,
            query_start_loc_cpu=query_start_loc.clone(),
            seq_lens=seq_lens,
            num_reqs=num_reqs,
            num_actual_tokens=int(query_lens.sum()),
            max_query_len=int(query_lens.max()),
            max_seq_len=int(seq_lens.max()),
            block_table_tensor=torch.arange(
                num_reqs * (num_spec + 1), dtype=torch.int32
            ).reshape(num_reqs, num_spec + 1),
            slot_mapping=torch.zeros(int(query_lens.sum()), dtype=torch.int64),
            **since_0_32,
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
    metadata = batch.metadata(num_spec)
    if not num_spec:
        return builder.build(0, metadata)
    accepted = torch.ones(metadata.num_reqs, dtype=torch.int32)
    return builder.build(0, metadata, accepted, batch.draft_tokens())


def lengths(cu_seqlens: torch.Tensor) -> list[int]:
    return (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()


def assert_describes(
    chunk_indices: torch.Tensor, chunk_offsets: torch.Tensor, cu_seqlens: torch.Tensor
) -> None:
    """The chunk metadata equals the reference for exactly these cu_seqlens."""
    indices, offsets = reference_chunk_metadata(lengths(cu_seqlens))
    assert torch.equal(chunk_indices, indices)
    assert torch.equal(chunk_offsets, offsets)
