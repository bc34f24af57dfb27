"""The plugin's pieces in-process: step kinds, the smoke verdict, build info,
and how the plugin binds its series. The whole plugin inside a real vLLM
server is in test_metrics_live.py; malformed inputs in
test_smoke_report_malformed.py and test_build_info_malformed.py."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from support.vllm_trees import SERIES
from vllm.v1.metrics.stats import SchedulerIterationDetails, SchedulerStats

from k3rocm.common.setting_table import KDA_METADATA_OFFERED
from k3rocm.plugin import build_info, metrics, smoke_verdict

pytestmark = pytest.mark.every_line

# legacy is a path only where the release has one (0.27.1, not 0.32.0).
LEGACY_LABEL = "legacy" if "legacy" in KDA_METADATA_OFFERED else "invalid"


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


def scheduler_stats(step: SchedulerIterationDetails) -> SchedulerStats:
    return SchedulerStats(iteration_details=step)


def vllm_config(model_name: str) -> SimpleNamespace:
    """The one part of a VllmConfig the plugin reads."""
    return SimpleNamespace(model_config=SimpleNamespace(served_model_name=model_name))


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
    assert smoke_verdict.read_smoke_verdict(report) == verdict


def test_verdict_collector_reads_the_report_on_every_scrape(tmp_path):
    report = tmp_path / "report.json"
    registry = CollectorRegistry()
    registry.register(smoke_verdict.SmokeVerdictCollector(report))
    assert registry.get_sample_value("k3rocm_smoke_verdict") == -1
    report.write_text(json.dumps({"verdict": "pass"}))
    assert registry.get_sample_value("k3rocm_smoke_verdict") == 1
    report.write_text(json.dumps({"verdict": "fail"}))
    assert registry.get_sample_value("k3rocm_smoke_verdict") == 0


def test_rocm_version(tmp_path):
    assert build_info.rocm_version(tmp_path) == "unknown"
    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_text("7.2.0-43\n")
    assert build_info.rocm_version(tmp_path) == "7.2.0-43"


def test_patch_series_of_the_patched_tree():
    # conftest puts the tree the real patch tool patched first on sys.path.
    assert build_info.patch_series_label() == SERIES.series_id


def test_build_info_in_a_registry_of_its_own(monkeypatch, tmp_path):
    monkeypatch.setenv("K3_IMAGE_TAG", "registry-test:2")
    registry = CollectorRegistry()
    build_info.install_build_info(registry)
    assert (
        registry.get_sample_value(
            "k3rocm_build_info",
            {
                "vllm_version": SERIES.vllm_version,
                "patch_series": SERIES.series_id,
                "image_tag": "registry-test:2",
                "rocm_version": "unknown",
                "kda_metadata": "device",
            },
        )
        == 1
    )


@pytest.mark.parametrize(
    ("value", "label"), [("0.27.1-rocm7.2-k3.7", "0.27.1-rocm7.2-k3.7"),
                         (" 0.27.1-rocm7.2-k3.7\n", "0.27.1-rocm7.2-k3.7"),
                         ("", "unknown"), ("  ", "unknown")]
)  # fmt: skip
def test_build_info_image_tag_as_the_setting_reads_it(monkeypatch, value, label):
    monkeypatch.setenv("K3_IMAGE_TAG", value)
    assert build_info.build_info_labels()["image_tag"] == label


@pytest.mark.parametrize(
    ("value", "label"), [("legacy", LEGACY_LABEL), ("device", "device"), ("", "device"),
                         ("Legacy", "invalid"), ("gpu", "invalid")]
)  # fmt: skip
def test_build_info_names_the_kda_metadata_path(monkeypatch, value, label):
    monkeypatch.setenv("K3_KDA_METADATA", value)
    assert build_info.build_info_labels()["kda_metadata"] == label


def test_dummy_steps_are_counted_but_not_timed():
    registry = CollectorRegistry()

    def value(name: str, kind: str) -> float:
        labels = {"model_name": "in-process", "engine": "7", "kind": kind}
        return registry.get_sample_value(name, labels) or 0.0

    engine_steps = metrics.StepMetrics(registry).for_engine("in-process", 7)
    engine_steps.observe(details(0, 0, dummy=True))
    engine_steps.observe(details(0, 8, ms=12.5))
    assert value("k3rocm_engine_steps_total", "dummy") == 1
    assert value("k3rocm_engine_step_duration_seconds_count", "dummy") == 0
    assert value("k3rocm_engine_steps_total", "decode") == 1
    assert value("k3rocm_engine_step_duration_seconds_sum", "decode") == 0.0125
    assert value("k3rocm_engine_step_generation_tokens_total", "decode") == 8


def test_loggers_share_one_set_of_metrics_per_registry(monkeypatch, tmp_path):
    monkeypatch.setenv("K3_SMOKE_REPORT", str(tmp_path / "report.json"))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    first, second = CollectorRegistry(), CollectorRegistry()
    # As vLLM does: one logger per engine index, both in one process.
    loggers = [
        metrics.StepLatencyLogger(vllm_config("m"), engine, registry=first)
        for engine in (0, 1)
    ]
    other = metrics.StepLatencyLogger(vllm_config("m"), 0, registry=second)
    for _ in range(3):
        loggers[0].record(scheduler_stats(details(1, 0)), None)
    loggers[1].record(scheduler_stats(details(0, 2)), None)
    other.record(scheduler_stats(details(0, 0, dummy=True)), None)
    other.record(None, None)

    def steps(registry, engine: str, kind: str) -> float | None:
        return registry.get_sample_value(
            "k3rocm_engine_steps_total",
            {"model_name": "m", "engine": engine, "kind": kind},
        )

    assert steps(first, "0", "prefill") == 3
    assert steps(first, "1", "decode") == 1
    assert steps(first, "0", "dummy") is None
    assert steps(second, "0", "dummy") == 1
    assert steps(second, "0", "prefill") is None
    for registry in (first, second):
        exposition = generate_latest(registry).decode()
        assert exposition.count("# TYPE k3rocm_build_info gauge") == 1
        assert exposition.count("# TYPE k3rocm_smoke_verdict gauge") == 1
        assert registry.get_sample_value("k3rocm_smoke_verdict") == -1


def test_steps_reuse_the_children_bound_for_their_engine(monkeypatch, tmp_path):
    monkeypatch.setenv("K3_SMOKE_REPORT", str(tmp_path / "report.json"))
    registry = CollectorRegistry()
    logger = metrics.StepLatencyLogger(vllm_config("bound"), 3, registry=registry)
    kinds = {"prefill": (2, 0), "mixed": (1, 1), "decode": (0, 4)}
    for ctx_reqs, gen_reqs in kinds.values():
        logger.record(scheduler_stats(details(ctx_reqs, gen_reqs)), None)
    logger.record(scheduler_stats(details(0, 0, dummy=True)), None)

    # From here on, a label lookup on any step family is a failure.
    step_metrics = metrics.install_plugin_metrics(registry)
    lookups = []
    for family in vars(step_metrics).values():
        monkeypatch.setattr(family, "labels", lambda *a, **kw: lookups.append(a))
    for _ in range(50):
        for ctx_reqs, gen_reqs in kinds.values():
            logger.record(scheduler_stats(details(ctx_reqs, gen_reqs, ms=2)), None)
        logger.record(scheduler_stats(details(0, 0, dummy=True)), None)
    assert lookups == []

    def value(name: str, kind: str) -> float | None:
        labels = {"model_name": "bound", "engine": "3", "kind": kind}
        return registry.get_sample_value(name, labels)

    for kind, (ctx_reqs, gen_reqs) in kinds.items():
        assert value("k3rocm_engine_steps_total", kind) == 51
        assert value("k3rocm_engine_step_duration_seconds_count", kind) == 51
        assert value("k3rocm_engine_step_duration_seconds_sum", kind) == pytest.approx(
            0.004 + 50 * 0.002
        )
        assert value("k3rocm_engine_step_context_tokens_total", kind) == (
            51 * 100 * ctx_reqs
        )
        assert value("k3rocm_engine_step_generation_tokens_total", kind) == (
            51 * gen_reqs
        )
    assert value("k3rocm_engine_steps_total", "dummy") == 51


def wait_until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def test_refreshed_verdict_follows_the_report(tmp_path):
    report = tmp_path / "report.json"
    registry = CollectorRegistry()
    refresher = smoke_verdict.VerdictRefresher(registry, report, interval=0.01)
    try:
        for verdict, value in ((None, -1), ("pass", 1), ("running", -1), ("fail", 0)):
            if verdict is not None:
                report.write_text(json.dumps({"verdict": verdict}))
            wait_until(
                lambda value=value: (
                    registry.get_sample_value("k3rocm_smoke_verdict") == value
                ),
                f"verdict {value}",
            )
    finally:
        refresher.stop.set()
    refresher.thread.join(5)
    assert not refresher.thread.is_alive()
