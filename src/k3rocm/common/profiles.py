"""Launch profiles, features and the AMD recipe for Kimi-K3.

The flags are the target release's spellings (k3rocm.common.vllm_release);
tests/launcher/test_launcher_commands.py parses every command with the
installed vLLM's own `vllm serve` parser."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

from k3rocm.common.vllm_release import TARGET

_FLAG = TARGET.serve


class MultiNode(Enum):
    NONE = "none"
    # vLLM's own multi-node launch: the same command on every node with
    # --nnodes/--node-rank/--master-addr/--master-port, --headless on workers.
    NATIVE = "native"
    # No Ray profiles: see docs/launching.md, "Why no Ray profiles".


# Kimi-K3's KDA heads (vLLM #52803: "TP8 is 12 heads per rank"; #58045).
# Tensor parallelism splits them; data parallelism does not.
KDA_HEADS = 96


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    tensor_parallel: int
    data_parallel: int
    expert_parallel: bool
    multi_node: MultiNode
    # False only for the cpu-dev profiles: no recipe flags, no AMD
    # environment, no GPUs.
    kimi_on_rocm: bool = True
    # Ranks each node runs: its GPUs (an MI355X/MI350X node carries 8).
    ranks_per_node: int = 8

    @property
    def world_size(self) -> int:
        return self.tensor_parallel * self.data_parallel

    @property
    def kda_heads_per_rank(self) -> int:
        """The KDA heads each rank's layer holds: 12 at TP8, 6 at TP16, all
        96 at dep16."""
        return KDA_HEADS // self.tensor_parallel

    @property
    def default_num_nodes(self) -> int:
        if self.multi_node is MultiNode.NONE:
            return 1
        return self.world_size // self.ranks_per_node


PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile("tp8", "one node, tensor parallel 8", 8, 1, False, MultiNode.NONE),
        Profile(
            "tep8",
            "one node, tensor parallel 8 with expert parallel MoE",
            8,
            1,
            True,
            MultiNode.NONE,
        ),
        Profile(
            "tep16",
            "two nodes (vLLM native multi-node), tensor parallel 16 with expert "
            "parallel MoE",
            16,
            1,
            True,
            MultiNode.NATIVE,
        ),
        Profile(
            "dep16",
            "two nodes (vLLM native multi-node), data parallel 16 attention with "
            "expert parallel MoE",
            1,
            16,
            True,
            MultiNode.NATIVE,
        ),
        Profile(
            "cpu-dev",
            "development only: plain single-process vLLM for any model, no "
            "Kimi-K3 or AMD settings, no GPU check",
            1,
            1,
            False,
            MultiNode.NONE,
            kimi_on_rocm=False,
        ),
        Profile(
            "cpu-dev-2node",
            "development only: cpu-dev over two nodes (vLLM native multi-node), "
            "tensor parallel 2, one rank on each node",
            2,
            1,
            False,
            MultiNode.NATIVE,
            kimi_on_rocm=False,
            ranks_per_node=1,
        ),
    )
}
# The multi-node profiles an operator of AMD nodes picks from.
MULTI_NODE_PROFILES = tuple(
    name
    for name, profile in PROFILES.items()
    if profile.multi_node is MultiNode.NATIVE and profile.kimi_on_rocm
)
DEFAULT_PROFILE = "tp8"

# The recipe's AMD environment. VLLM_USE_BREAKABLE_CUDAGRAPH=0 is required on
# ROCm; the others are tunables an operator may set differently beforehand.
AMD_ENV = (
    ("VLLM_ROCM_USE_AITER", "1"),
    ("SAFETENSORS_FAST_GPU", "1"),
    # 1: the a8w4 MoE path; 0 selects a16w4.
    ("AITER_SITUV2_A8W4", "1"),
    ("AITER_BF16_FP8_MOE_BOUND", "0"),
    ("VLLM_USE_BREAKABLE_CUDAGRAPH", "0"),
)
REQUIRED_AMD_ENV = {"VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}

# The recipe's AMD flags that no setting or feature controls. Extra arguments
# come after them, so an operator can still override any of these.
AMD_ARGS = (
    (_FLAG.trust_remote_code.long,),
    (_FLAG.load_format.long, "auto"),
    (_FLAG.gpu_memory_utilization.long, "0.95"),
    (_FLAG.max_num_batched_tokens.long, "4096"),
)
AMD_MAX_NUM_SEQS = 128

DSPARK_SPECULATIVE_CONFIG = {
    "method": "dspark",
    "model": "Inferact/Kimi-K3-DSpark",
    "num_speculative_tokens": 7,
    "attention_backend": "TRITON_MLA",
}
# With speculative decoding vLLM 0.27.1 replays a prompt of exactly
# 1 + num_speculative_tokens tokens through the FULL spec-verify CUDA graph
# as if it were a spec decode, and the KDA layers never write its state
# (vLLM #49918, open). In PIECEWISE mode the KDA layers run outside the
# graphs with the step's real metadata (tests/kernels/test_spec_full_graph.py).
DSPARK_COMPILATION_CONFIG = {"cudagraph_mode": "PIECEWISE"}


@dataclass(frozen=True)
class Feature:
    name: str
    meaning: str
    args: tuple[tuple[str, ...], ...]


# In the order their flags appear in the command.
FEATURES: dict[str, Feature] = {
    feature.name: feature
    for feature in (
        Feature(
            "reasoning",
            "split Kimi-K3's thinking from the answer",
            ((_FLAG.reasoning_parser.long, "kimi_k3"),),
        ),
        Feature(
            "tools",
            "tool calling with automatic tool choice",
            (
                (_FLAG.enable_auto_tool_choice.long,),
                (_FLAG.tool_call_parser.long, "kimi_k3"),
            ),
        ),
        Feature(
            "dspark",
            "DSpark speculative decoding, 7 draft tokens (AMD settings), "
            "PIECEWISE CUDA graphs",
            (
                (
                    _FLAG.speculative_config.long,
                    json.dumps(DSPARK_SPECULATIVE_CONFIG, separators=(",", ":")),
                ),
                (
                    _FLAG.compilation_config.long,
                    json.dumps(DSPARK_COMPILATION_CONFIG, separators=(",", ":")),
                ),
            ),
        ),
        Feature(
            "encoder-dp",
            "run the vision encoder data-parallel across the TP ranks",
            ((_FLAG.mm_encoder_tp_mode.long, "data"),),
        ),
        Feature(
            "text-only",
            "load the language model only, no vision encoder",
            ((_FLAG.language_model_only.long,),),
        ),
        Feature("fp8-kv", "FP8 KV cache", ((_FLAG.kv_cache_dtype.long, "fp8"),)),
    )
}
# The recipe's own defaults: the reasoning parser and the data-parallel
# vision encoder.
DEFAULT_FEATURES = ("reasoning", "encoder-dp")

# Pairs of features that cannot go together, and why.
FEATURE_CONFLICTS = {
    frozenset({"text-only", "encoder-dp"}): (
        "text-only loads no vision encoder, so there is no encoder to run data-parallel"
    ),
}
