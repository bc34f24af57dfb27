"""Stage 1, before vLLM starts: the patch marker, the Kimi backend, then the
device-kernel checks (``kernel_checks``) and the KDA ops' numbers
(``kda_numerics``)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from k3rocm.common.setting_table import KDA_METADATA, KDA_METADATA_PATHS
from k3rocm.common.smoke_report import CheckName, Stage
from k3rocm.common.states import PatchState, Verdict
from k3rocm.common.vllm_release import TARGET
from k3rocm.patchtool import patching
from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.series import Series
from k3rocm.smoke.kda_numerics import check_kda_numerics
from k3rocm.smoke.kda_spec_numerics import check_kda_spec_numerics
from k3rocm.smoke.kernel_checks import (
    check_kernel_battery,
    check_no_sync,
    kernel_device,
)

BACKEND_NAME = "KIMI_K3_KDA_ROCM"


def check_metadata_path(stage: Stage) -> str | None:
    """Which chunk metadata path this server runs (K3_KDA_METADATA); None
    when the value is not one of them (a failed check)."""
    try:
        path = KDA_METADATA.read(os.environ)
    except ValueError as err:
        stage.add(CheckName.KDA_METADATA_PATH, Verdict.FAIL, str(err))
        return None
    if path == KDA_METADATA_PATHS[0]:
        stage.add(
            CheckName.KDA_METADATA_PATH, Verdict.PASS, "device: the stall-free path"
        )
    else:
        stage.add(
            CheckName.KDA_METADATA_PATH,
            Verdict.PASS,
            f"legacy: vLLM {TARGET.version}'s own path with its device-to-host "
            "stall, as asked (an A/B run); the checks below still test the series' "
            "builder, which this server does not use, so a differing "
            "no-device-sync verdict is expected",
        )
    return path


def check_patch_marker(stage: Stage, series: Series, target: Path) -> bool:
    """The vLLM tree in ``target`` carries exactly this series."""
    try:
        state = patching.inspect(target, series)
    except Refusal as err:
        return stage.add(CheckName.PATCH_MARKER, Verdict.FAIL, str(err))
    if state.state != PatchState.APPLIED:
        return stage.add(
            CheckName.PATCH_MARKER,
            Verdict.FAIL,
            f"vLLM {state.vllm_version} in {target} is {state.state}: no "
            f"{series.series_id} patch marker; the image was not built by "
            "docker/build-steps.sh, or vLLM was reinstalled over it",
        )
    return stage.add(
        CheckName.PATCH_MARKER,
        Verdict.PASS,
        f"series {series.series_id} on vLLM {state.vllm_version} in {target}",
    )


def check_kimi_backend(stage: Stage, path: str = KDA_METADATA_PATHS[0]) -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_rocm():
        return stage.add(
            CheckName.KIMI_BACKEND,
            Verdict.SKIP,
            f"platform is {current_platform.device_type or 'unknown'}, not ROCm: "
            f"{BACKEND_NAME} is selected on ROCm only",
        )
    module, _, name = TARGET.kda_layer.partition(":")
    layer = getattr(importlib.import_module(module), name)

    # get_attn_backend reads nothing from the layer on ROCm; a bare instance
    # (no weights, no config) asks the real method the real question.
    name = layer.get_attn_backend(layer.__new__(layer)).get_name()
    expected = (
        BACKEND_NAME if path == KDA_METADATA_PATHS[0] else TARGET.legacy_kda_backend
    )
    if name != expected:
        return stage.add(
            CheckName.KIMI_BACKEND,
            Verdict.FAIL,
            f"the Kimi KDA layer resolves to {name} on ROCm with "
            f"{KDA_METADATA.env}={path}, not {expected}",
        )
    return stage.add(
        CheckName.KIMI_BACKEND,
        Verdict.PASS,
        f"the Kimi KDA layer resolves to {name} ({KDA_METADATA.env}={path})",
    )


def run_stage1(
    stage: Stage, series: Series, kda_heads: int, speculative: bool = False
) -> None:
    """``speculative``: the server speculates (``dspark``); the KDA kernels'
    spec step is checked too."""
    # The vLLM this interpreter imports, as vLLM itself will.
    if not check_patch_marker(stage, series, patching.find_installed_target()):
        return  # without the series, the other checks have nothing to check
    path = check_metadata_path(stage)
    if path is None:
        return
    check_kimi_backend(stage, path)
    device = kernel_device()
    check_kernel_battery(stage, device)
    check_kda_numerics(stage, device, kda_heads)
    if speculative:
        check_kda_spec_numerics(stage, device, kda_heads)
    check_no_sync(stage, device)
