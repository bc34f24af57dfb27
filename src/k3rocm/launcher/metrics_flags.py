"""The vLLM flags the step-latency metrics plugin needs, by the layout of
the API servers (k3rocm.launcher.command adds them; the flags themselves are
the target release's, k3rocm.common.vllm_release)."""

from __future__ import annotations

from k3rocm.common.vllm_release import TARGET


def vllm_metrics_args(*, single_api_server: bool) -> tuple[str, ...]:
    """The metrics flags for a `vllm serve` command that runs one API server
    in its own process (True) or several API servers or none (False)."""
    if single_api_server:
        return TARGET.metrics_args_one_api_server
    return TARGET.metrics_args_multiprocess
