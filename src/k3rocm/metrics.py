"""Engine step-latency metrics for vLLM 0.27.1, as a stat-logger plugin.

vLLM 0.27.1 measures every engine step (``SchedulerIterationDetails``, with
``--enable-logging-iteration-details``) but only logs it, one INFO line per
step. This plugin, registered under the entry-point group
``vllm.stat_logger_plugins``, turns each step into Prometheus metrics on the
server's own ``/metrics``:

``k3rocm_engine_step_duration_seconds`` (histogram; labels model_name, engine,
kind)
    Wall time of one engine step. ``kind`` is ``prefill`` (only requests still
    in their prompt), ``decode`` (only requests generating) or ``mixed``.
``k3rocm_engine_step_context_tokens_total``, ``..._generation_tokens_total``
    Tokens the scheduler gave those steps, by the same labels.
``k3rocm_engine_steps_total``
    Steps by the same labels plus ``kind="dummy"``: the padding steps an idle
    data-parallel engine runs, which say nothing about latency and so stay
    out of the histogram.
``k3rocm_build_info``
    Always 1; labels vllm_version, patch_series (the applied series id,
    ``none`` for an unpatched vLLM, ``upstream`` for a vLLM that already has
    the change, ``invalid`` when the tree does not match its marker),
    image_tag and rocm_version (``unknown`` where not known).
``k3rocm_smoke_verdict``
    The start-up smoke test's verdict on the stall-free prefill path, read
    from its JSON report (``K3_SMOKE_REPORT``): 1 pass, 0 fail, -1 no
    verdict yet (no report, still running, or unreadable).

The ``k3rocm_`` prefix names this distribution as the exporter: the metrics
are ours, not vLLM's (vLLM's own use ``vllm:``; colons are reserved for
recording rules, so ours use none).

With several API servers (``--api-server-count``) vLLM switches
prometheus_client to multiprocess mode: each API server process writes its
samples to ``PROMETHEUS_MULTIPROC_DIR`` and ``/metrics`` sums the files.
Counters and histograms need nothing more; gauges name how processes combine
(``multiprocess_mode``); and a custom collector would be invisible there, so
the verdict is then a gauge that a thread refreshes from the report.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from functools import cache
from pathlib import Path

import vllm
from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import (
    IterationStats,
    MultiModalCacheStats,
    SchedulerIterationDetails,
    SchedulerStats,
)

from k3rocm.contract import IMAGE_TAG_ENV, smoke_report_path
from k3rocm.image import DEFAULT_ROCM_ROOT, BuildStepError, read_rocm_version
from k3rocm.patchset import Refusal, find_installed_target, inspect
from k3rocm.series import Series, SeriesError, default_series_dir

log = logging.getLogger(__name__)

# From a 1 ms decode step on a small batch to prefill steps of many seconds
# (a large token budget deep into a long context, or a stalled device).
STEP_DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0,
    15.0, 20.0, 30.0, 60.0,
)  # fmt: skip
STEP_LABELS = ("model_name", "engine", "kind")

VERDICT_PASS, VERDICT_FAIL, VERDICT_PENDING = 1, 0, -1
_VERDICTS = {"pass": VERDICT_PASS, "fail": VERDICT_FAIL}
# How stale the verdict may be in multiprocess mode (well under any scrape
# interval worth using).
VERDICT_REFRESH_SECONDS = 5.0

UNKNOWN = "unknown"


def step_kind(details: SchedulerIterationDetails) -> str:
    if details.is_dummy:
        return "dummy"
    if details.num_ctx_requests and details.num_generation_requests:
        return "mixed"
    return "prefill" if details.num_ctx_requests else "decode"


def read_smoke_verdict(report: Path) -> int:
    try:
        verdict = json.loads(report.read_text()).get("verdict")
    except FileNotFoundError:
        return VERDICT_PENDING
    except (OSError, ValueError, AttributeError) as err:
        log.warning("smoke report %s is unreadable (%s); no verdict", report, err)
        return VERDICT_PENDING
    return _VERDICTS.get(verdict, VERDICT_PENDING)


def patch_series_label() -> str:
    try:
        state = inspect(find_installed_target(), Series(default_series_dir()))
    except (Refusal, SeriesError) as err:
        log.warning("cannot tell which patch series vLLM carries: %s", err)
        return "invalid"
    if state.state == "applied":
        return state.marker["series_id"]
    return "none" if state.state == "pristine" else state.state


def rocm_version(rocm_root: Path = DEFAULT_ROCM_ROOT) -> str:
    """The ROCm version, as the image build read it, or "unknown"."""
    try:
        return read_rocm_version(rocm_root) or UNKNOWN
    except BuildStepError:
        return UNKNOWN


def build_info_labels() -> dict[str, str]:
    return {
        "vllm_version": vllm.__version__,
        "patch_series": patch_series_label(),
        "image_tag": os.environ.get(IMAGE_TAG_ENV) or UNKNOWN,
        "rocm_version": rocm_version(),
    }


class SmokeVerdictCollector:
    """Reads the smoke report on every scrape (single-process mode)."""

    def __init__(self, report: Path):
        self.report = report

    def describe(self):
        return [self._family(VERDICT_PENDING)]

    def collect(self):
        return [self._family(read_smoke_verdict(self.report))]

    @staticmethod
    def _family(value: int) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "k3rocm_smoke_verdict",
            "Smoke test verdict on the stall-free prefill path: "
            "1 pass, 0 fail, -1 no verdict yet.",
            value=value,
        )


def _refresh_verdict_forever(gauge: Gauge, report: Path) -> None:
    # A daemon thread: it lives as long as the API server process.
    while True:
        gauge.set(read_smoke_verdict(report))
        time.sleep(VERDICT_REFRESH_SECONDS)


class StepMetrics:
    """The process's metric objects: one set however many engines and
    plugin instances vLLM creates (prometheus_client refuses duplicates)."""

    def __init__(self) -> None:
        self.step_duration = Histogram(
            "k3rocm_engine_step_duration_seconds",
            "Wall time of one vLLM engine step, by step kind.",
            STEP_LABELS,
            buckets=STEP_DURATION_BUCKETS,
        )
        self.context_tokens = Counter(
            "k3rocm_engine_step_context_tokens_total",
            "Prompt (context) tokens scheduled in engine steps, by step kind.",
            STEP_LABELS,
        )
        self.generation_tokens = Counter(
            "k3rocm_engine_step_generation_tokens_total",
            "Generation tokens scheduled in engine steps, by step kind.",
            STEP_LABELS,
        )
        self.steps = Counter(
            "k3rocm_engine_steps_total",
            "Engine steps, by step kind (dummy: data-parallel padding steps).",
            STEP_LABELS,
        )
        labels = build_info_labels()
        Gauge(
            "k3rocm_build_info",
            "Build of this server: vLLM version, patch series, image, ROCm.",
            list(labels),
            multiprocess_mode="max",
        ).labels(**labels).set(1)
        report = smoke_report_path()
        if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
            verdict = Gauge(
                "k3rocm_smoke_verdict",
                "Smoke test verdict on the stall-free prefill path: "
                "1 pass, 0 fail, -1 no verdict yet.",
                multiprocess_mode="mostrecent",
            )
            threading.Thread(
                target=_refresh_verdict_forever,
                args=(verdict, report),
                name="k3rocm-smoke-verdict",
                daemon=True,
            ).start()
        else:
            REGISTRY.register(SmokeVerdictCollector(report))

    def observe(self, model_name: str, engine: int, details: SchedulerIterationDetails):
        labels = (model_name, str(engine), step_kind(details))
        self.steps.labels(*labels).inc()
        if details.is_dummy:
            return
        self.step_duration.labels(*labels).observe(details.elapsed_ms / 1000)
        self.context_tokens.labels(*labels).inc(details.num_ctx_tokens)
        self.generation_tokens.labels(*labels).inc(details.num_generation_tokens)


@cache
def step_metrics() -> StepMetrics:
    return StepMetrics()


class StepLatencyLogger(StatLoggerBase):
    """vLLM builds one per engine index in every API server process."""

    def __init__(self, vllm_config: VllmConfig, engine_index: int = 0):
        self.model_name = vllm_config.model_config.served_model_name
        self.engine_index = engine_index
        self.metrics = step_metrics()

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ):
        details = scheduler_stats and scheduler_stats.iteration_details
        if details is not None:
            self.metrics.observe(self.model_name, self.engine_index, details)

    def log_engine_initialized(self):
        """Nothing to log: the metrics carry everything."""
