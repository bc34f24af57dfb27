"""Names the launcher, the metrics plugin and the smoke test share."""

import os
from pathlib import Path

# Where the smoke test writes its JSON report (default: in the runtime
# directory below); the metrics plugin reads it for the verdict gauge, the
# container health check for readiness.
SMOKE_REPORT_ENV = "K3_SMOKE_REPORT"
SMOKE_REPORT_NAME = "smoke-report.json"


def smoke_report_path() -> Path:
    return Path(os.environ.get(SMOKE_REPORT_ENV, run_dir() / SMOKE_REPORT_NAME))


# vLLM flags the step-latency metrics plugin (k3rocm.metrics) needs, for a
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


# The image's tag, set in the image; the metrics plugin reports it in
# k3rocm_build_info.
IMAGE_TAG_ENV = "K3_IMAGE_TAG"

# The container's runtime directory (k3rocm.supervise clears it at start):
# the smoke test's ready mark (the health check needs it) and its stage-1
# gate (vLLM starts only after it).
RUN_DIR_ENV = "K3_RUN_DIR"
DEFAULT_RUN_DIR = Path("/run/k3rocm")
READY_MARK = "ready"
STAGE1_GATE = "stage1-done"


def run_dir() -> Path:
    return Path(os.environ.get(RUN_DIR_ENV, DEFAULT_RUN_DIR))
