"""Names the launcher, the metrics plugin and the smoke test share."""

import os
from pathlib import Path

# Where the smoke test writes its JSON report; the metrics plugin reads it
# for the verdict gauge, the container health check for readiness.
SMOKE_REPORT_ENV = "K3_SMOKE_REPORT"
DEFAULT_SMOKE_REPORT = Path("/run/k3rocm/smoke-report.json")


def smoke_report_path() -> Path:
    return Path(os.environ.get(SMOKE_REPORT_ENV, DEFAULT_SMOKE_REPORT))


# vLLM flags the step-latency metrics plugin (k3rocm.metrics) needs:
# iteration details feed the plugin; --disable-log-stats only turns off vLLM's
# own logging stat logger (one INFO line per step with the details on), while
# a registered plugin keeps stats collection and vLLM's `vllm:` Prometheus
# metrics alive.
VLLM_METRICS_ARGS = ("--enable-logging-iteration-details", "--disable-log-stats")

# The image's tag, set in the image; the metrics plugin reports it in
# k3rocm_build_info.
IMAGE_TAG_ENV = "K3_IMAGE_TAG"
