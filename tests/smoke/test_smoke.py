"""The smoke test's parts in this process: stage 1 on the CPU (the patched
vLLM from conftest, the device kernel in the Triton interpreter), its checks
failing where they must, stage timeouts and the guard's decisions. Stage 2
and the policies run in the real process tree (test_container_tree.py)."""

from __future__ import annotations

import time

import pytest
import torch
from support.vllm_trees import SERIES, copy_tree, installed_root, patched_tree

from k3rocm.common.exit_codes import ExitCode
from k3rocm.common.smoke_report import CheckName, Stage
from k3rocm.common.states import Verdict
from k3rocm.common.vllm_release import TARGET
from k3rocm.container.guard import Guard
from k3rocm.smoke.chunk_reference import CHUNK_SIZE
from k3rocm.smoke.kernel_checks import KERNEL_BATTERY, compare_with_reference
from k3rocm.smoke.settings import Settings
from k3rocm.smoke.stage1 import check_patch_marker, run_stage1
from k3rocm.smoke.timeouts import run_with_timeout

pytestmark = pytest.mark.every_line


def statuses(stage: Stage) -> dict[str, str]:
    return {check.name: check.status for check in stage.checks}


def test_stage1_on_cpu_runs_the_kernel_interpreted_and_skips_gpu_checks(
    monkeypatch,
):
    monkeypatch.delenv("K3_KDA_METADATA", raising=False)
    stage = Stage()
    run_stage1(stage, SERIES, kda_heads=12)
    assert statuses(stage) == {
        CheckName.PATCH_MARKER: "pass",
        CheckName.KDA_METADATA_PATH: "pass",
        CheckName.KIMI_BACKEND: "skip",
        CheckName.DEVICE_KERNEL: "pass",
        CheckName.KDA_NUMERICS: "pass",
        CheckName.NO_DEVICE_SYNC: "skip",
    }
    details = {check.name: check.detail for check in stage.checks}
    assert "on cpu" in details[CheckName.DEVICE_KERNEL]
    assert "match the float64 reference on cpu" in details[CheckName.KDA_NUMERICS]
    assert "not ROCm" in details[CheckName.KIMI_BACKEND]
    assert "no GPU" in details[CheckName.NO_DEVICE_SYNC]
    assert details[CheckName.KDA_METADATA_PATH].startswith("device: ")


def test_on_rocm_the_real_layer_resolves_to_the_series_backend(monkeypatch):
    """The release's own ROCm Kimi-K3 KDA layer class (0.27.1's GDN layer,
    0.32.0's amd/kda.py layer) asked which backend it resolves to."""
    from vllm.platforms import current_platform

    monkeypatch.delenv("K3_KDA_METADATA", raising=False)
    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    stage = Stage()
    run_stage1(stage, SERIES, kda_heads=12)
    details = {check.name: check.detail for check in stage.checks}
    assert statuses(stage)[CheckName.KIMI_BACKEND] == "pass"
    assert (
        "KIMI_K3_KDA_ROCM (K3_KDA_METADATA=device)" in details[CheckName.KIMI_BACKEND]
    )


def test_stage1_reports_the_legacy_path_and_refuses_other_values(monkeypatch):
    """legacy is a path only on a release that has one (0.27.1's stall);
    elsewhere it is refused like any other value."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_rocm", lambda: True)
    refused = ["fast"]
    if TARGET.legacy_kda_backend is None:
        refused.append("legacy")
    else:
        monkeypatch.setenv("K3_KDA_METADATA", "legacy")
        stage = Stage()
        run_stage1(stage, SERIES, kda_heads=12)
        details = {check.name: check.detail for check in stage.checks}
        assert statuses(stage)[CheckName.KDA_METADATA_PATH] == "pass"
        assert "expected" in details[CheckName.KDA_METADATA_PATH]
        # On ROCm, legacy resolves the real layer to vLLM 0.27.1's backend.
        assert statuses(stage)[CheckName.KIMI_BACKEND] == "pass"
        assert "GDN_ATTN (K3_KDA_METADATA=legacy)" in details[CheckName.KIMI_BACKEND]
    for value in refused:
        monkeypatch.setenv("K3_KDA_METADATA", value)
        stage = Stage()
        run_stage1(stage, SERIES, kda_heads=12)
        assert statuses(stage)[CheckName.KDA_METADATA_PATH] == "fail"
        assert CheckName.KIMI_BACKEND not in statuses(stage)


def poisoned_result(kernel, damage):
    """``kernel`` (an AMD KDA op as the layer calls it) with ``damage``
    done to its outputs and states."""

    def run(**kwargs):
        out, state = kernel(**kwargs)
        damage(kwargs.get("out", out), state, kwargs)
        return out, state

    return run


def nan_first_output(out, state, kwargs):
    out.view(-1)[0] = float("nan")


def scaled_decode_states(out, state, kwargs):
    """1 % more in the decodes' states: finite, and far outside the
    tolerance."""
    state[kwargs["ssm_state_indices"].long()] *= 1.01


@pytest.mark.parametrize(
    ("op", "damage"),
    [
        ("chunk_kda_with_fused_gate", nan_first_output),
        ("fused_recurrent_kda", nan_first_output),
        ("fused_recurrent_kda", scaled_decode_states),
    ],
    ids=["chunk-nan", "recurrent-nan", "recurrent-state-off"],
)
def test_kda_numerics_fails_on_a_poisoned_result(monkeypatch, op, damage):
    import vllm.models.kimi_k3.amd.ops.third_party.kda as amd_kda

    from k3rocm.smoke.kda_numerics import check_kda_numerics

    monkeypatch.setattr(amd_kda, op, poisoned_result(getattr(amd_kda, op), damage))
    stage = Stage()
    assert not check_kda_numerics(stage, "cpu")
    (check,) = stage.checks
    assert (check.name, check.status) == (CheckName.KDA_NUMERICS, "fail")
    assert "differ from the float64 reference on cpu" in check.detail
    if damage is nan_first_output:
        assert "largest error inf times" in check.detail


def test_stage1_with_dspark_checks_a_spec_step_too(monkeypatch):
    """``dspark`` on: a spec step of the KDA kernels is its own check (off:
    absent, see the test above)."""
    import k3rocm.smoke.stage1 as stage1

    monkeypatch.delenv("K3_KDA_METADATA", raising=False)
    # The non-spec numerics have their own tests; here only where the spec
    # check sits.
    monkeypatch.setattr(
        stage1,
        "check_kda_numerics",
        lambda stage, *_: stage.add(CheckName.KDA_NUMERICS, Verdict.PASS, ""),
    )
    stage = Stage()
    run_stage1(stage, SERIES, kda_heads=12, speculative=True)
    names = [check.name for check in stage.checks]
    assert names[names.index(CheckName.KDA_NUMERICS) + 1] == CheckName.KDA_SPEC_NUMERICS
    assert statuses(stage)[CheckName.KDA_SPEC_NUMERICS] == "pass"
    (detail,) = (
        c.detail for c in stage.checks if c.name == CheckName.KDA_SPEC_NUMERICS
    )
    assert "match the float64 reference on cpu" in detail
    assert Settings.from_env({"K3_FEATURES": "dspark"}).speculative
    assert not Settings.from_env({}).speculative


def accepted_ignored(kernel):
    """The spec kernel as if every request had accepted one token: it starts
    from column 0 instead of column ``accepted - 1``."""

    def run(**kwargs):
        accepted = kwargs.get("num_accepted_tokens")
        if accepted is not None:
            kwargs["num_accepted_tokens"] = torch.ones_like(accepted)
        return kernel(**kwargs)

    return run


def column_read_contiguously(kernel):
    """The packed decode reading its strided column as if contiguous (what
    dropping its stride does: the table's first entries)."""

    def run(**kwargs):
        column = kwargs["state_indices"]
        flat = column.as_strided((column.numel() * column.stride(0),), (1,))
        kwargs["state_indices"] = flat[: column.numel()].clone()
        return kernel(**kwargs)

    return run


def unpatched_packed_decode(kernel):
    """vLLM 0.27.1's own packed decode (the installed wheel's file)."""
    import importlib.util

    relative = "vllm/models/kimi_k3/amd/ops/third_party/kda/fused_recurrent.py"
    spec = importlib.util.spec_from_file_location(
        "unpatched_fused_recurrent", installed_root() / relative
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fused_recurrent_kda_packed_decode


# 0.27.1's own packed decode refuses the strided column (vLLM #51682, which
# 0.32.0 has).
UNPATCHED_DECODE = (
    [
        pytest.param(
            "fused_recurrent_kda_packed_decode",
            unpatched_packed_decode,
            "ValueError",
            id="0.27.1",
        )
    ]
    if SERIES.vllm_version == "0.27.1"
    else []
)


@pytest.mark.parametrize(
    ("op", "plant", "says"),
    [
        pytest.param(
            "fused_recurrent_kda",
            lambda k: poisoned_result(k, nan_first_output),
            "inf",
            id="spec-nan",
        ),
        pytest.param(
            "fused_recurrent_kda", accepted_ignored, "differ", id="accepted-ignored"
        ),
        pytest.param(
            "fused_recurrent_kda_packed_decode",
            lambda k: poisoned_result(k, nan_first_output),
            "inf",
            id="decode-nan",
        ),
        pytest.param(
            "fused_recurrent_kda_packed_decode",
            column_read_contiguously,
            "differ",
            id="column-contiguous",
        ),
        *UNPATCHED_DECODE,
    ],
)
def test_kda_spec_numerics_fails_on_a_planted_error(monkeypatch, op, plant, says):
    import vllm.models.kimi_k3.amd.ops.third_party.kda as amd_kda

    from k3rocm.smoke.kda_spec_numerics import check_kda_spec_numerics

    monkeypatch.setattr(amd_kda, op, plant(getattr(amd_kda, op)))
    stage = Stage()
    assert not check_kda_spec_numerics(stage, "cpu")
    (check,) = stage.checks
    assert (check.name, check.status) == (CheckName.KDA_SPEC_NUMERICS, "fail")
    if says == "inf":
        assert "largest error inf times" in check.detail
    elif says == "differ":
        assert "differ from the float64 reference on cpu" in check.detail
    else:
        assert "failed on cpu: ValueError" in check.detail
        assert "contiguous" in check.detail


def test_kda_numerics_keeps_the_autotuners_choices_only_while_it_runs():
    """On a GPU the check has the KDA kernels' autotuners keep their choice
    in Triton's cache (a warm start then times no configuration again),
    and gives them back as vLLM's process would have them."""
    from k3rocm.smoke.interpreter import jit_and_tuner, kda_kernels
    from k3rocm.smoke.kda_numerics import autotuning_cached

    kernels = kda_kernels()
    tuners = [t for _, t in map(jit_and_tuner, kernels) if t is not None]
    assert len(tuners) >= 6 and not any(t.cache_results for t in tuners)
    with autotuning_cached(kernels):
        assert all(t.cache_results for t in tuners)
    assert not any(t.cache_results for t in tuners)
    with pytest.raises(RuntimeError), autotuning_cached(kernels):
        raise RuntimeError("a kernel failed")
    assert not any(t.cache_results for t in tuners)


def test_kernel_check_catches_metadata_that_differs_from_the_reference():
    """vLLM's legacy builder labels chunks by non-empty ordinal, wrong once an
    empty sequence sits before a non-empty one: the battery must see it."""
    from vllm.third_party.flash_linear_attention.ops.index import (
        prepare_chunk_indices,
        prepare_chunk_offsets,
    )

    def legacy(cu_seqlens, _cu_seqlens_cpu):
        return (
            prepare_chunk_indices(cu_seqlens, CHUNK_SIZE),
            prepare_chunk_offsets(cu_seqlens, CHUNK_SIZE),
        )

    # (An all-empty batch makes the legacy builder raise, not differ.)
    battery = [b for b in KERNEL_BATTERY if b[0] != "all empty"]
    mismatches = compare_with_reference(legacy, "cpu", battery)
    assert [m.split(" [")[0] for m in mismatches] == [
        "empty sequences front, middle, back"
    ]


def test_marker_check_fails_on_an_unpatched_or_drifted_tree(tmp_path):
    pristine = copy_tree(installed_root(), tmp_path / "pristine")
    stage = Stage()
    assert not check_patch_marker(stage, SERIES, pristine)
    assert "pristine" in stage.checks[0].detail

    drifted = copy_tree(patched_tree(), tmp_path / "drifted")
    layer = drifted / "vllm" / "models" / "kimi_k3" / "amd" / "kda_metadata.py"
    layer.write_text(layer.read_text() + "\n# edited after the build\n")
    stage = Stage()
    assert not check_patch_marker(stage, SERIES, drifted)
    assert "drifted" in stage.checks[0].detail


def test_a_stage_that_hangs_fails_on_its_timeout():
    stage = Stage()
    in_time = run_with_timeout(lambda s: time.sleep(30), stage, 0.5)
    assert not in_time
    assert stage.status == "fail"
    assert statuses(stage) == {CheckName.TIMEOUT: "fail"}


def test_a_stage_that_crashes_fails_instead_of_hanging():
    stage = Stage()
    assert run_with_timeout(lambda s: 1 / 0, stage, 5)
    assert stage.status == "fail"
    assert "ZeroDivisionError" in stage.checks[0].detail


def test_unknown_failure_policy_is_refused():
    with pytest.raises(ValueError, match="stop, warn"):
        Settings.from_env({"K3_SMOKE_ON_FAILURE": "ignore"})


def test_guard_bounds_vllm_restarts_and_stops_on_a_failed_smoke(tmp_path, monkeypatch):
    report = tmp_path / "smoke-report.json"
    report.write_text(
        '{"stages": {"stage1": {"checks": [{"name": "device kernel", '
        '"status": "fail"}, {"name": "patch marker", "status": "pass"}]}}, '
        '"kept": "/cache/forensics/smoke-report-1.json"}'
    )
    monkeypatch.setenv("K3_SMOKE_REPORT", str(report))
    deaths = tmp_path / "vllm-deaths"
    guard = Guard(max_restarts=2, deaths_file=deaths)
    exited = "PROCESS_STATE_EXITED"
    assert guard.judge(exited, "vllm", expected=False) is None
    assert guard.judge(exited, "vllm", expected=False) is None
    assert guard.judge(exited, "vllm", expected=False)[0] == ExitCode.VLLM
    fresh = tmp_path / "fresh"
    assert (
        Guard(2, fresh).judge("PROCESS_STATE_FATAL", "vllm", False)[0] == ExitCode.VLLM
    )
    assert Guard(2, fresh).judge(exited, "smoke", expected=True) is None
    code, reason = Guard(2, fresh).judge(exited, "smoke", expected=False)
    assert code == ExitCode.SMOKE
    assert (
        "K3_SMOKE_ON_FAILURE=stop: stage1 device kernel (report kept in "
        "/cache/forensics/smoke-report-1.json); "
    ) in reason


def test_guard_counts_a_vllm_exit_with_status_0(tmp_path):
    """supervisord calls an exit with status 0 expected; for vLLM it is still
    a death nobody asked for (a requested stop ends in STOPPED)."""
    guard = Guard(max_restarts=1, deaths_file=tmp_path / "vllm-deaths")
    assert guard.judge("PROCESS_STATE_EXITED", "vllm", expected=True) is None
    assert (
        guard.judge("PROCESS_STATE_EXITED", "vllm", expected=True)[0] == ExitCode.VLLM
    )


def test_a_vllm_failing_while_starting_is_left_to_supervisords_retries(tmp_path):
    guard = Guard(max_restarts=0, deaths_file=tmp_path / "vllm-deaths")
    assert guard.judge("PROCESS_STATE_EXITED", "vllm", False, "STARTING") is None
    assert guard.vllm_deaths == 0


def test_a_restarted_guard_keeps_the_death_count(tmp_path):
    deaths = tmp_path / "vllm-deaths"
    Guard(max_restarts=1, deaths_file=deaths).judge(
        "PROCESS_STATE_EXITED", "vllm", False
    )
    restarted = Guard(max_restarts=1, deaths_file=deaths)
    assert restarted.vllm_deaths == 1
    assert restarted.judge("PROCESS_STATE_EXITED", "vllm", False)[0] == ExitCode.VLLM


def test_a_smoke_that_could_not_run_is_named_so(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_SMOKE_REPORT", str(tmp_path / "missing.json"))
    code, reason = Guard(1, tmp_path / "d").judge(
        "PROCESS_STATE_EXITED", "smoke", False
    )
    assert code == ExitCode.SETTINGS
    assert "could not run" in reason and "K3_SMOKE_ON_FAILURE=stop" not in reason


@pytest.mark.parametrize(
    ("profile", "heads"), [("tp8", 12), ("tep8", 12), ("tep16", 6), ("dep16", 96)]
)
def test_stage1_checks_the_kda_kernels_at_the_layers_head_count(profile, heads):
    """Kimi-K3's 96 KDA heads, 12 a rank at TP8 (vLLM #52803), split by
    tensor parallelism only: stage 1's numerics run at the rank's count."""
    assert Settings.from_env({"K3_PROFILE": profile}).kda_heads == heads
