"""What speculative decoding (the ``dspark`` feature) needs of the rest of
the command.

The feature sets ``--compilation-config '{"cudagraph_mode":"PIECEWISE"}'``:
with FULL CUDA graphs vLLM 0.27.1 replays a prompt of exactly
``1 + num_speculative_tokens`` tokens through the spec-verify graph, and the
KDA layers never write that request's state (vLLM #49918, open upstream;
tests/kernels/test_spec_full_graph.py). A compilation config in the extra
arguments would replace the feature's (vLLM reads the last one), so it is
refused, in any spelling vLLM's parser reads.
"""

from __future__ import annotations

from k3rocm.common.vllm_release import TARGET
from k3rocm.launcher.messages import label
from k3rocm.launcher.owned_flags import last_values
from k3rocm.launcher.settings import LaunchSettings

_COMPILATION = TARGET.serve.compilation_config.dest


def spec_mode_problems(settings: LaunchSettings) -> list[str]:
    """One message if the extra arguments set a compilation config while
    the ``dspark`` feature is on."""
    if "dspark" not in settings.features or not settings.extra_args:
        return []
    if _COMPILATION not in last_values(settings.extra_args, (_COMPILATION,)):
        return []
    return [
        f"{label('extra_args')} sets a compilation config "
        f"({TARGET.serve.compilation_config.long}) "
        f"while {label('features')} has dspark, which sets cudagraph_mode PIECEWISE: "
        f"with FULL CUDA graphs vLLM {TARGET.version} leaves the KDA state of a "
        "prompt of exactly 1 + num_speculative_tokens tokens unwritten (vLLM #49918); "
        "remove the compilation config from the extra arguments, or turn dspark off."
    ]
