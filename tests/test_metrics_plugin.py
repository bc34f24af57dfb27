"""The plugin's pieces in-process: step kinds, the smoke verdict, build info.
The whole plugin inside a real vLLM server is in test_metrics_live.py."""

from __future__ import annotations

import json

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from vllm.v1.metrics.stats import SchedulerIterationDetails
from vllm_trees import SERIES

from k3rocm import metrics


def details(ctx_reqs: int, gen_reqs: int, *, dummy: bool = False, ms: float = 4.0):
    return SchedulerIterationDetails(
        iteration_index=0,
        num_ctx_requests=ctx_reqs,
        num_ctx_tokens=100 * ctx_reqs,
        num_generation_requests=gen_reqs,
        num_generation_tokens=gen_reqs,
        elapsed_ms=ms,
        is_dummy=dummy,
    )


@pytest.mark.parametrize(
    ("ctx_reqs", "gen_reqs", "dummy", "kind"),
    [
        (2, 0, False, "prefill"),
        (1, 3, False, "mixed"),
        (0, 5, False, "decode"),
        (0, 0, True, "dummy"),
    ],
)
def test_step_kind(ctx_reqs, gen_reqs, dummy, kind):
    assert metrics.step_kind(details(ctx_reqs, gen_reqs, dummy=dummy)) == kind


@pytest.mark.parametrize(
    ("content", "verdict"),
    [
        (None, -1),
        ('{"verdict": "running"}', -1),
        ('{"verdict": "pass", "stage": 2}', 1),
        ('{"verdict": "fail"}', 0),
        ('{"verdict": "maybe"}', -1),
        ('{"verdict": ', -1),
        ('["pass"]', -1),
    ],
)
def test_read_smoke_verdict(tmp_path, content, verdict):
    report = tmp_path / "report.json"
    if content is not None:
        report.write_text(content)
    assert metrics.read_smoke_verdict(report) == verdict


def test_verdict_collector_reads_the_report_on_every_scrape(tmp_path):
    report = tmp_path / "report.json"
    registry = CollectorRegistry()
    registry.register(metrics.SmokeVerdictCollector(report))
    assert registry.get_sample_value("k3rocm_smoke_verdict") == -1
    report.write_text(json.dumps({"verdict": "pass"}))
    assert registry.get_sample_value("k3rocm_smoke_verdict") == 1
    report.write_text(json.dumps({"verdict": "fail"}))
    assert registry.get_sample_value("k3rocm_smoke_verdict") == 0


def test_rocm_version(tmp_path):
    assert metrics.rocm_version(tmp_path) == "unknown"
    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_text("7.2.0-43\n")
    assert metrics.rocm_version(tmp_path) == "7.2.0-43"


def test_patch_series_of_the_patched_tree():
    # conftest puts the tree the real patch tool patched first on sys.path.
    assert metrics.patch_series_label() == SERIES.series_id


def test_dummy_steps_are_counted_but_not_timed():
    labels = {"model_name": "in-process", "engine": "7"}

    def value(name: str, kind: str) -> float:
        return REGISTRY.get_sample_value(name, {**labels, "kind": kind}) or 0.0

    step_metrics = metrics.step_metrics()
    step_metrics.observe("in-process", 7, details(0, 0, dummy=True))
    step_metrics.observe("in-process", 7, details(0, 8, ms=12.5))
    assert value("k3rocm_engine_steps_total", "dummy") == 1
    assert value("k3rocm_engine_step_duration_seconds_count", "dummy") == 0
    assert value("k3rocm_engine_steps_total", "decode") == 1
    assert value("k3rocm_engine_step_duration_seconds_sum", "decode") == 0.0125
    assert value("k3rocm_engine_step_generation_tokens_total", "decode") == 8
