"""The vLLM flags the step-latency metrics plugin needs, by the layout of
the API servers (k3rocm.launcher.command adds them)."""

from __future__ import annotations

# vLLM flags the step-latency metrics plugin (k3rocm.plugin.metrics) needs, for a
# server whose one API server runs in the `vllm serve` process (the default
# when data-parallel size is 1): iteration details feed the plugin, and
# --disable-log-stats drops vLLM's logging stat logger, which would otherwise
# log every step at INFO; the installed plugin keeps stats collection, the
# plugin's feed and vLLM's `vllm:` metrics on (checked on 0.27.1).
VLLM_METRICS_ARGS = ("--enable-logging-iteration-details", "--disable-log-stats")
# The same for every other layout: several API servers (--api-server-count > 1,
# or data parallel, which defaults it to the data-parallel size) and headless
# nodes. There `vllm serve` starts the engine cores itself with
# --disable-log-stats taken literally, so the engines would send no scheduler
# stats: no plugin metrics and no `vllm:` running/waiting/KV-cache gauges.
# Nothing logs per step there anyway: vLLM drops its logging stat logger when
# it runs several API servers, and headless nodes log no stats.
VLLM_METRICS_ARGS_MULTIPROCESS = ("--enable-logging-iteration-details",)


def vllm_metrics_args(*, single_api_server: bool) -> tuple[str, ...]:
    """The metrics flags for a `vllm serve` command that runs one API server
    in its own process (True) or several API servers or none (False)."""
    return VLLM_METRICS_ARGS if single_api_server else VLLM_METRICS_ARGS_MULTIPROCESS
