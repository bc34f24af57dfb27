"""What the dashboard (k3rocm.monitoring.dashboard) and the alert rules
(k3rocm.monitoring.alerts) share: Prometheus job names, metric names,
selectors and alert thresholds. Both generated files are checked against
this by tests/monitoring/test_monitoring.py.
"""

from __future__ import annotations

# The k3rocm_ metrics they query (their one home; the exporters use it too).
from k3rocm.common.metric_names import (  # noqa: F401 (used as names.X)
    BUILD_INFO,
    CONTAINER_PHASE,
    CONTAINER_PHASE_SECONDS,
    CONTAINER_PHASES,
    CONTEXT_TOKENS,
    ENGINE_REQUESTS,
    GENERATION_TOKENS,
    LAST_STEP,
    LOAD_ALERT_BOUND,
    SMOKE_VERDICT,
    STALL_BOUND,
    STEP_DURATION,
    STEPS_TOTAL,
)
from k3rocm.common.smoke_report import VERDICT_FAIL, VERDICT_PASS, VERDICT_PENDING
from k3rocm.common.states import StepKind

# The scrape jobs of monitoring/prometheus.yml: vLLM's /metrics (ours and
# vLLM's own), and the container's start-up endpoint (k3rocm.container.status), which
# carries the instance of its vLLM.
VLLM_JOB = "kimi-k3-vllm"
CONTAINER_JOB = "kimi-k3-container"
JOBS = (VLLM_JOB, CONTAINER_JOB)

# vLLM's own.
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"

# The phases before serving: vLLM serves no HTTP in them.
STARTUP_PHASES = CONTAINER_PHASES[:3]
STARTUP_PHASE_SELECTOR = f'phase=~"{"|".join(STARTUP_PHASES)}"'
# Real steps only: data-parallel padding steps say nothing about latency.
REAL_STEPS_SELECTOR = f'kind!="{StepKind.DUMMY}"'

# The smoke verdict gauge's values, as the dashboard shows them.
VERDICT_TEXT = {VERDICT_PASS: "pass", VERDICT_FAIL: "FAIL", VERDICT_PENDING: "pending"}

# Alert thresholds: starting points for Kimi-K3 on 8x MI355X with
# --max-num-batched-tokens 4096; tune them to your own baseline.
STEP_P99_SECONDS = {StepKind.PREFILL: 5, StepKind.MIXED: 5, StepKind.DECODE: 0.25}
STEP_P99_FOR = "10m"
# Prefill time per token over 30 minutes against its one-day average.
PREFILL_REGRESSION_RATIO = 1.2
KV_CACHE_FULL = 0.95
# How long without a smoke verdict is too long.
NO_VERDICT_FOR = "30m"
REQUESTS_WAITING_FOR = "10m"
DOWN_FOR = "2m"
