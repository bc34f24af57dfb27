"""Stand-ins for the parts of vLLM the GPU harness cannot import on the lent
NVIDIA machine (no vLLM install there: only the bundled kernel files).

They replace vLLM's platform detection, logger and Triton import switch, and
the GDN builder classes that kda_metadata.py subclasses (the builders are
exercised by the CPU tests; on the GPU only the kernels and their host
wrappers run). Every kernel and wrapper is vLLM's or the series' real code.
"""

import contextlib
import logging
import sys
import types

import torch
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class _CudaPlatform:
    """What the bundled files ask of vllm.platforms.current_platform."""

    @staticmethod
    def is_rocm() -> bool:
        return False

    @staticmethod
    def is_cuda() -> bool:
        return True

    @staticmethod
    def is_cuda_alike() -> bool:
        return True

    @staticmethod
    def has_device_capability(capability) -> bool:
        major, minor = torch.cuda.get_device_capability()
        if isinstance(capability, tuple):
            return (major, minor) >= capability
        return major * 10 + minor >= capability


class _Stub:
    """Base for the builder classes kda_metadata.py subclasses."""


def install() -> None:
    _module(
        "vllm.triton_utils", triton=triton, tl=tl, tldevice=tldevice, HAS_TRITON=True
    )
    _module("vllm.platforms", current_platform=_CudaPlatform())
    _module("vllm.logger", init_logger=logging.getLogger)
    _module(
        "vllm.v1.attention.backends.gdn_attn",
        GDNAttentionBackend=type("GDNAttentionBackend", (_Stub,), {}),
        GDNAttentionMetadataBuilder=type("GDNAttentionMetadataBuilder", (_Stub,), {}),
        GDNAttentionMetadata=type("GDNAttentionMetadata", (_Stub,), {}),
    )
    # The builder's block table helper (its recurrent warm-up; the harness
    # calls kda_chunk_launch.warm_up_recurrent_kda itself); 0.32.0's builder
    # names the common metadata class (annotations only).
    _module(
        "vllm.v1.attention.backends.utils",
        mamba_get_block_table_tensor=None,
        CommonAttentionMetadata=_Stub,
    )
    # What 0.32.0's FLA index and metadata builder import besides: its sync
    # debugger (off: a no-op, as vLLM has it unless asked), its pinned
    # host-to-device copy, and the checkpoint metadata class (annotations).
    _module(
        "vllm.utils.gpu_sync_debug",
        gpu_sync_allowed=lambda first_only=False: contextlib.nullcontext(),
    )
    _module("vllm.utils.torch_utils", async_tensor_h2d=_async_tensor_h2d)
    _module(
        "vllm.model_executor.layers.mamba.checkpoint",
        MambaPrefillCheckpointMetadata=_Stub,
    )
    _module("vllm.config", VllmConfig=_Stub)
    _module("vllm.v1.kv_cache_interface", MambaSpec=_Stub)


def _async_tensor_h2d(data, device=None, dtype=None, out=None):
    """vLLM's copy of host data to the device, without the pinned staging."""
    tensor = torch.as_tensor(
        data, dtype=dtype or (out.dtype if out is not None else None)
    )
    if out is not None:
        return out.copy_(tensor, non_blocking=True)
    return tensor.to(device, non_blocking=True)
