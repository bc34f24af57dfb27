"""Stage 1, before vLLM starts: the patch marker, the Kimi backend, then the
device-kernel checks (``kernel_checks``)."""

from __future__ import annotations

from pathlib import Path

from k3rocm import patchset
from k3rocm.series import Series
from k3rocm.smoke.kernel_checks import (
    check_kernel_battery,
    check_no_sync,
    kernel_device,
)
from k3rocm.smoke.report import Stage
from k3rocm.states import PatchState, Verdict

BACKEND_NAME = "KIMI_K3_KDA_ROCM"


def check_patch_marker(stage: Stage, series: Series, target: Path) -> bool:
    """The vLLM tree in ``target`` carries exactly this series."""
    try:
        state = patchset.inspect(target, series)
    except patchset.Refusal as err:
        return stage.add("patch marker", Verdict.FAIL, str(err))
    if state.state != PatchState.APPLIED:
        return stage.add(
            "patch marker",
            Verdict.FAIL,
            f"vLLM {state.vllm_version} in {target} is {state.state}: no "
            f"{series.series_id} patch marker; the image was not built by "
            "docker/build-steps.sh, or vLLM was reinstalled over it",
        )
    return stage.add(
        "patch marker",
        Verdict.PASS,
        f"series {series.series_id} on vLLM {state.vllm_version} in {target}",
    )


def check_kimi_backend(stage: Stage) -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_rocm():
        return stage.add(
            "kimi backend",
            Verdict.SKIP,
            f"platform is {current_platform.device_type or 'unknown'}, not ROCm: "
            f"{BACKEND_NAME} is selected on ROCm only",
        )
    from vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn import (
        KimiGatedDeltaNetAttention as Layer,
    )

    # get_attn_backend reads nothing from the layer on ROCm; a bare instance
    # (no weights, no config) asks the real method the real question.
    name = Layer.get_attn_backend(Layer.__new__(Layer)).get_name()
    if name != BACKEND_NAME:
        return stage.add(
            "kimi backend",
            Verdict.FAIL,
            f"the Kimi KDA layer resolves to {name} on ROCm",
        )
    return stage.add(
        "kimi backend", Verdict.PASS, f"the Kimi KDA layer resolves to {name}"
    )


def run_stage1(stage: Stage, series: Series) -> None:
    # The vLLM this interpreter imports, as vLLM itself will.
    if not check_patch_marker(stage, series, patchset.find_installed_target()):
        return  # without the series, the other checks have nothing to check
    check_kimi_backend(stage)
    device = kernel_device()
    check_kernel_battery(stage, device)
    check_no_sync(stage, device)
