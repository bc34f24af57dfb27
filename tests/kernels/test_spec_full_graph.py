"""vLLM #49918 (open upstream) at the level of vLLM 0.27.1's model runner and
CUDA-graph dispatcher: with speculative decoding, a step whose only request
is a prompt of exactly ``1 + num_speculative_tokens`` tokens is classified
as a uniform decode, and with FULL decode graphs it is dispatched to the
FULL spec-verify graph, whose KDA kernels were captured for spec decodes
(the request's prefill state is never written). With ``cudagraph_mode``
PIECEWISE, which the launcher's ``dspark`` feature sets
(k3rocm.launcher.spec_mode), the same step never takes a FULL graph.

What this does not show: the state loss itself on a GPU (no graph is
captured on a CPU)."""

import pytest
from vllm.config import (
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from k3rocm.common.profiles import DSPARK_COMPILATION_CONFIG, DSPARK_SPECULATIVE_CONFIG

K = DSPARK_SPECULATIVE_CONFIG["num_speculative_tokens"]  # 7, the recipe's


def dispatcher(mode: CUDAGraphMode) -> CudagraphDispatcher:
    config = VllmConfig()
    config.speculative_config = SpeculativeConfig(
        method="ngram", num_speculative_tokens=K, prompt_lookup_max=3,
        prompt_lookup_min=1,
    )  # fmt: skip
    compilation = config.compilation_config
    compilation.mode = CompilationMode.VLLM_COMPILE
    compilation.cudagraph_mode = mode
    compilation.cudagraph_capture_sizes = [8, 16, 32, 64]
    compilation.max_cudagraph_capture_size = 64
    compilation.splitting_ops = list(CompilationConfig._attention_ops)
    result = CudagraphDispatcher(config)
    result.initialize_cudagraph_keys(mode, 1 + K)
    return result


def prompt_of_one_plus_k():
    """A fresh request whose whole prompt, 1 + K tokens, is scheduled in one
    step: the model runner's uniform-decode test says yes."""
    uniform = GPUModelRunner._is_uniform_decode(
        max_num_scheduled_tokens=1 + K, uniform_decode_query_len=1 + K,
        num_tokens=1 + K, num_reqs=1,
    )  # fmt: skip
    return 1 + K, uniform


def test_a_prompt_of_one_plus_k_tokens_takes_the_full_spec_graph():
    """The bug's first half in 0.27.1 (FULL_AND_PIECEWISE, vLLM's default
    with spec decoding): the prefill is replayed as a spec decode."""
    tokens, uniform = prompt_of_one_plus_k()
    assert uniform
    mode, batch = dispatcher(CUDAGraphMode.FULL_AND_PIECEWISE).dispatch(
        tokens, uniform_decode=uniform
    )
    assert mode == CUDAGraphMode.FULL and batch.uniform


@pytest.mark.parametrize("tokens", [1 + K, 2 * (1 + K), 8 * (1 + K)])
def test_dsparks_piecewise_mode_never_takes_a_full_graph(tokens):
    """What dspark sets (PIECEWISE) dispatches the same steps, and every
    uniform spec step, to piecewise graphs, where the KDA layers run with
    the step's own metadata."""
    mode_name = DSPARK_COMPILATION_CONFIG["cudagraph_mode"]
    mode, batch = dispatcher(CUDAGraphMode[mode_name]).dispatch(
        tokens, uniform_decode=True
    )
    assert mode == CUDAGraphMode.PIECEWISE and not batch.uniform
