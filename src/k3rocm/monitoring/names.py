"""What the dashboard (k3rocm.monitoring.dashboard) and the alert rules
(k3rocm.monitoring.alerts) share: Prometheus job names, metric names,
selectors and alert thresholds. Both generated files are checked against
this by tests/test_monitoring.py.
"""

from __future__ import annotations

from k3rocm import engine_progress
from k3rocm.container import status
from k3rocm.container.status import PHASES
from k3rocm.plugin import build_info, smoke_verdict
from k3rocm.smoke_report import VERDICT_FAIL, VERDICT_PASS, VERDICT_PENDING
from k3rocm.states import StepKind

# The scrape jobs of monitoring/prometheus.yml: vLLM's /metrics (ours and
# vLLM's own), and the container's start-up endpoint (k3rocm.container.status), which
# carries the instance of its vLLM.
VLLM_JOB = "kimi-k3-vllm"
CONTAINER_JOB = "kimi-k3-container"
JOBS = (VLLM_JOB, CONTAINER_JOB)

# The metrics plugin's step metrics (k3rocm.plugin.metrics).
STEP_DURATION = engine_progress.STEP_DURATION_METRIC
STEPS_TOTAL = engine_progress.STEPS_METRIC
CONTEXT_TOKENS = engine_progress.CONTEXT_TOKENS_METRIC
GENERATION_TOKENS = engine_progress.GENERATION_TOKENS_METRIC
BUILD_INFO = build_info.NAME
LAST_STEP = engine_progress.LAST_STEP_METRIC
ENGINE_REQUESTS = engine_progress.ENGINE_REQUESTS_METRIC
SMOKE_VERDICT = smoke_verdict.NAME
# The container's start-up metrics (k3rocm.container.status).
CONTAINER_PHASE = status.PHASE_METRIC
CONTAINER_PHASE_SECONDS = status.PHASE_SECONDS_METRIC
LOAD_ALERT_BOUND = status.LOAD_ALERT_BOUND
STALL_BOUND = status.STALL_BOUND
# vLLM's own.
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"

# The phases before serving: vLLM serves no HTTP in them.
STARTUP_PHASES = PHASES[:3]
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
