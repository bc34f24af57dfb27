# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.27.1).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_metadata.py by
# `k3rocm patchgen`: edit that file, not this one.
"""The ROCm Kimi-K3 KDA attention backend: vLLM's GDN backend with a
metadata builder whose chunk metadata is made on the device, without the
host wait of ``.tolist()`` on every prefill step (kda_metadata_launch.py),
and which prepares every kernel launch its layers can make before the
server reports ready.
"""

from typing import TYPE_CHECKING

import torch
from vllm.logger import init_logger
from vllm.v1.attention.backends.gdn_attn import (
    GDNAttentionBackend,
    GDNAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.utils import mamba_get_block_table_tensor

from .kda_metadata_launch import prepare_chunk_metadata_device, warm_up_chunk_metadata

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import AttentionSpec

    from .ops.third_party.kda.kda_chunk_launch import RecurrentWarmUp, SpecWarmUp

logger = init_logger(__name__)


def kimi_kda_layers(vllm_config: "VllmConfig", layer_names: list[str]) -> list:
    """The Kimi KDA layers (the series' KimiGatedDeltaNetAttention, which
    has ``split_projection``) among ``layer_names``, as the model registered
    them in the forward context."""
    context = vllm_config.compilation_config.static_forward_context
    return [
        context[name]
        for name in layer_names
        if hasattr(context.get(name), "split_projection")
    ]


class KimiK3ROCmKDAMetadataBuilder(GDNAttentionMetadataBuilder):
    """GDN metadata builder whose chunk metadata is made on the device.

    It describes the cu_seqlens the Kimi KDA layer hands chunk KDA: the
    prefill slice (``prefill_query_start_loc``; in a mixed batch the decodes
    are peeled off to the recurrent kernel, vLLM PR #50649), as the generic
    builder's metadata does, without its host-built copy.

    Built before the server reports ready, it compiles every kernel variant
    its scheduler limits can reach, and plans every kind of chunk KDA call
    its layers can make (kda_chunk_launch.py), so no serving step waits on
    a compile or an autotune.
    """

    def __init__(
        self,
        kv_cache_spec: "AttentionSpec",
        layer_names: list[str],
        vllm_config: "VllmConfig",
        device: torch.device,
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        scheduler = vllm_config.scheduler_config
        self.chunk_metadata_warm_up = warm_up_chunk_metadata(
            scheduler.max_num_seqs, scheduler.max_num_batched_tokens, device
        )
        logger.info(
            "KDA chunk metadata: %d kernel variants ready (%d prepared now) "
            "for max_num_seqs=%d, max_num_batched_tokens=%d in %.2f s",
            len(self.chunk_metadata_warm_up.variants),
            self.chunk_metadata_warm_up.prepared,
            scheduler.max_num_seqs,
            scheduler.max_num_batched_tokens,
            self.chunk_metadata_warm_up.seconds,
        )
        # The chunk KDA forward's precompiled launches: every kind of call
        # this group's Kimi KDA layers can make, planned before serving.
        from .ops.third_party.kda.kda_chunk_launch import warm_up_chunk_kda

        layers = kimi_kda_layers(vllm_config, layer_names)
        self.kda_layers = layers
        self.chunk_kda_warm_up = warm_up_chunk_kda(
            layers, scheduler.max_num_batched_tokens, device
        )
        # Made at the first build that finds the layers' state pools bound.
        self.recurrent_kda_warm_up: RecurrentWarmUp | None = None
        self.spec_kda_warm_up: SpecWarmUp | None = None
        logger.info(
            "KDA chunk launches: %d plans ready (%d made now) for %d layers, "
            "%d kinds of call, in %.2f s",
            self.chunk_kda_warm_up.plans,
            self.chunk_kda_warm_up.made,
            self.chunk_kda_warm_up.layers,
            self.chunk_kda_warm_up.kinds,
            self.chunk_kda_warm_up.seconds,
        )

    def build(self, common_prefix_len, common_attn_metadata, *args, **kwargs):
        if self.recurrent_kda_warm_up is None:
            self.recurrent_kda_warm_up = self._warm_up_recurrent(common_attn_metadata)
        return super().build(common_prefix_len, common_attn_metadata, *args, **kwargs)

    def _warm_up_recurrent(
        self, m: "CommonAttentionMetadata"
    ) -> "RecurrentWarmUp | None":
        """Plan the layers' decode calls for their real state pools and the
        state indices GDNAttentionMetadataBuilder.build cuts from this
        block table, and with speculation compile their spec calls; None
        (try again at the next build) while a pool is not bound yet or a
        CUDA graph is being captured."""
        from .ops.third_party.kda.kda_chunk_launch import (
            warm_up_recurrent_kda,
            warm_up_spec_recurrent_kda,
        )

        states = []
        for layer in self.kda_layers:
            cache = getattr(layer, "kv_cache", None)
            state = cache[1] if isinstance(cache, tuple) and len(cache) > 1 else None
            if not isinstance(state, torch.Tensor) or not state.numel():
                return None
            states.append(state)
        if states and states[0].is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        blocks = mamba_get_block_table_tensor(
            m.block_table_tensor,
            m.seq_lens,
            self.kv_cache_spec,
            self.vllm_config.cache_config.mamba_cache_mode,
        )
        warm_up = warm_up_recurrent_kda(self.kda_layers, states, blocks[:, 0])
        logger.info(
            "KDA recurrent launches: %d plans ready (%d made now) for %d "
            "layers, %d kinds of call, in %.2f s",
            warm_up.plans,
            warm_up.made,
            warm_up.layers,
            warm_up.kinds,
            warm_up.seconds,
        )
        if self.num_spec:
            # The speculative calls run vLLM's wrapper: their binaries.
            self.spec_kda_warm_up = warm_up_spec_recurrent_kda(
                self.kda_layers, states, self.num_spec
            )
            logger.info(
                "KDA speculative recurrent calls: %d kinds compiled for %d "
                "layers in %.2f s",
                self.spec_kda_warm_up.kinds,
                self.spec_kda_warm_up.layers,
                self.spec_kda_warm_up.seconds,
            )
        return warm_up

    def _build_chunk_metadata(
        self,
        *,
        prefill_query_start_loc: torch.Tensor | None,
        prefill_query_start_loc_cpu: torch.Tensor | None,
        non_spec_query_start_loc: torch.Tensor | None,
        non_spec_query_start_loc_cpu: torch.Tensor | None,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert prefill_query_start_loc is not None
        assert prefill_query_start_loc_cpu is not None
        return prepare_chunk_metadata_device(
            prefill_query_start_loc, prefill_query_start_loc_cpu
        )


class KimiK3ROCmKDABackend(GDNAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "KIMI_K3_KDA_ROCM"

    @staticmethod
    def get_builder_cls() -> type[GDNAttentionMetadataBuilder]:
        return KimiK3ROCmKDAMetadataBuilder
