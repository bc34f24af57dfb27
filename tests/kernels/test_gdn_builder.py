"""The patched GDN metadata builders of the installed vLLM (0.27.1 or 0.32.0)
on random batches that mix prefills, decodes, speculative decodes and
padding.

- KimiK3ROCmKDAMetadataBuilder: the chunk metadata describes exactly the
  cu_seqlens the Kimi layer hands chunk KDA: the prefill slice
  (``prefill_query_start_loc``; vLLM PR #50649 peels the decodes off to the
  recurrent kernel), made on the device.
- The builder the series changes equals the release's own, field by field:
  on 0.27.1 the generic builder (patch 0001 adds the hook; a non-Kimi GDN
  layer keeps 0.27.1 behaviour, and so does the Kimi builder: the same
  metadata, without the host copy); on 0.32.0 the Kimi builder (patch 0002
  swaps upstream's one-program-per-sequence kernel for the chunk-block
  grid: the same metadata).
"""

import dataclasses
import importlib.util

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.gdn_batches import (
    NUM_SPEC,
    Batch,
    assert_describes,
    batches,
    build,
    lengths,
    make_builder,
)
from support.vllm_trees import SERIES, installed_root
from vllm.models.kimi_k3.amd.kda_metadata import KimiK3ROCmKDAMetadataBuilder
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

pytestmark = pytest.mark.every_line

# The builder each release's series changes, the file it is in, and its class.
CHANGED = {
    "0.27.1": (
        "generic",
        "vllm/v1/attention/backends/gdn_attn.py",
        "GDNAttentionMetadataBuilder",
    ),
    "0.32.0": (
        "kimi",
        "vllm/models/kimi_k3/amd/kda_metadata.py",
        "KimiK3ROCmKDAMetadataBuilder",
    ),
}[SERIES.vllm_version]


def load_unpatched_builder():
    """That builder class as the installed wheel ships it."""
    _, rel, name = CHANGED
    spec = importlib.util.spec_from_file_location(
        "unpatched_builder", installed_root() / rel
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


@pytest.fixture(scope="module")
def builders():
    unpatched = load_unpatched_builder()
    return {
        num_spec: {
            "kimi": make_builder(KimiK3ROCmKDAMetadataBuilder, num_spec),
            "generic": make_builder(GDNAttentionMetadataBuilder, num_spec),
            "unpatched": make_builder(unpatched, num_spec),
        }
        for num_spec in (0, NUM_SPEC)
    }


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
    # KimiGatedDeltaNetAttention._forward calls chunk KDA with the prefill
    # slice. Without speculative decodes that is the prefills and the
    # padding behind them; beside them vLLM 0.27.1's builder counts 1-token
    # sequences as prefills and the slice is the whole non-spec batch
    # (upstream's peel, too, applies only without speculative decodes).
    if metadata.spec_sequence_masks is None:
        assert lengths(metadata.prefill_query_start_loc) == (
            batch.prefill_query_lens + [0] * batch.padding
        )
    else:
        assert torch.equal(
            metadata.prefill_query_start_loc, metadata.non_spec_query_start_loc
        )
    assert_describes(
        metadata.chunk_indices,
        metadata.chunk_offsets,
        metadata.prefill_query_start_loc,
    )
    generic = build(builders[num_spec]["generic"], batch, num_spec)
    for name in ("chunk_indices", "chunk_offsets", "prefill_query_start_loc"):
        assert_same(getattr(metadata, name), getattr(generic, name), name)


@pytest.mark.parametrize("num_spec", [0, NUM_SPEC], ids=["no-spec", "spec"])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_changed_builder_equals_unpatched_field_by_field(builders, num_spec, data):
    batch = data.draw(batches(with_spec=bool(num_spec)))
    patched = build(builders[num_spec][CHANGED[0]], batch, num_spec)
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


def test_kimi_metadata_leaves_the_decodes_out(builders):
    """In a mixed non-spec batch the metadata covers the rebased prefill
    slice only: no chunk for any of the three decodes (the rows written
    out by hand)."""
    batch = Batch([], 3, [130, 70], 0, [5, 9, 2, 0, 0])
    kimi = build(builders[0]["kimi"], batch, 0)
    assert lengths(kimi.non_spec_query_start_loc) == [1, 1, 1, 130, 70]
    assert lengths(kimi.prefill_query_start_loc) == [130, 70]
    assert kimi.chunk_indices.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]]
    assert kimi.chunk_offsets.tolist() == [0, 3, 5]


def test_kimi_builder_warms_up_every_reachable_variant_at_construction(builders):
    """The builder is constructed before the server is ready: every kernel
    variant its scheduler limits can reach is made then, never in a step."""
    import vllm.models.kimi_k3.amd.kda_metadata_kernel as kernel

    for made in builders.values():
        builder = made["kimi"]
        scheduler = builder.vllm_config.scheduler_config
        assert builder.chunk_metadata_warm_up.variants == tuple(
            kernel.reachable_variants(
                scheduler.max_num_seqs, scheduler.max_num_batched_tokens
            )
        )
