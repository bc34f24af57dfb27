"""Every ``k3rocm_*`` metric name, in one place: the exporters (the metrics
plugin, the drain middleware, the container's status server) register them,
the generators (k3rocm.monitoring) write rules and panels on them, the
watchdog and the smoke test read them."""

from __future__ import annotations

# The metrics plugin's step metrics (k3rocm.plugin.metrics).
STEP_DURATION = "k3rocm_engine_step_duration_seconds"
STEPS_TOTAL = "k3rocm_engine_steps_total"
CONTEXT_TOKENS = "k3rocm_engine_step_context_tokens_total"
GENERATION_TOKENS = "k3rocm_engine_step_generation_tokens_total"
LAST_STEP = "k3rocm_engine_last_step_timestamp_seconds"
ENGINE_REQUESTS = "k3rocm_engine_requests"
# The plugin's info gauges (k3rocm.plugin.build_info, .smoke_verdict).
BUILD_INFO = "k3rocm_build_info"
SMOKE_VERDICT = "k3rocm_smoke_verdict"
# vLLM's API server, from the drain middleware (k3rocm.container.drain).
API_IN_FLIGHT = "k3rocm_api_requests_in_flight"
API_REFUSED_DRAINING = "k3rocm_api_requests_refused_draining"
API_BODY_TIMEOUTS = "k3rocm_api_requests_body_timeouts"
API_BODY_TOO_LARGE = "k3rocm_api_requests_body_too_large"
# The container's start-up metrics (k3rocm.container.status), and the values
# of CONTAINER_PHASE's phase label, in the order a start goes through them.
CONTAINER_PHASE = "k3rocm_container_phase"
CONTAINER_PHASE_SECONDS = "k3rocm_container_phase_seconds"
STAGE1_VERDICT = "k3rocm_smoke_stage1_verdict"
LOAD_ALERT_BOUND = "k3rocm_container_load_alert_seconds"
STALL_BOUND = "k3rocm_container_stall_seconds"
CONTAINER_PHASES = ("stage1", "loading", "stage2", "serving", "draining", "stopping")
