"""The container image: its tag scheme and the build steps docker/Dockerfile runs.

    python -m k3rocm.supply_chain.image tag [--rocm-version V]
    python -m k3rocm.supply_chain.image verify-base --rocm-version V
        [--target DIR] [--rocm-root DIR]
    python -m k3rocm.supply_chain.image patch [--target DIR] [--series-id ID]
    python -m k3rocm.supply_chain.image versions --out FILE [--target DIR]
        [--rocm-root DIR]

Every step exits non-zero with a message saying what is wrong, so a base image
that drifted fails the build instead of producing an image that lies about
what it serves.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import sys
from pathlib import Path

from k3rocm.common.line_log import line_logger
from k3rocm.common.states import PatchState
from k3rocm.patchtool import patching
from k3rocm.patchtool.lines import installed_line_dir, shipped_series
from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.series import Series
from k3rocm.supply_chain.rocm import (
    DEFAULT_ROCM_ROOT,
    RocmVersionError,
    read_rocm_version,
)

# The base image the series is verified against (vLLM's ROCm image of the
# series' vLLM version, patches/0.27.1/series.toml), and the ROCm release in it.
# scripts/build-image uses these; docker/Dockerfile's defaults for builds
# without build arguments (compose) cannot be computed, so the tests hold
# them equal.
BASE_IMAGE_REPOSITORY = "vllm/vllm-openai-rocm"
ROCM_VERSION = "7.2"


def base_image(series: Series) -> str:
    return f"{BASE_IMAGE_REPOSITORY}:v{series.vllm_version}"


BASE_IMAGE = base_image(shipped_series())
# Where the image records what it holds (docker/Dockerfile writes it).
VERSIONS_FILE = Path("/etc/k3rocm/versions.json")
# Distributions whose versions decide what the container does.
_RECORDED_DISTRIBUTIONS = (
    "k3rocm",
    "torch",
    "triton",
    "supervisor",
    "dumb-init",
    "prometheus-client",
)


class BuildStepError(Exception):
    """The base image or the patched tree is not what the image promises."""


def image_tag(series: Series, rocm_version: str = ROCM_VERSION) -> str:
    """Immutable tag: vLLM version, ROCm version, series revision."""
    return f"{series.vllm_version}-rocm{rocm_version}-{series.revision}"


def verify_base(target: Path, series: Series, rocm_root: Path, rocm: str) -> str:
    vllm_version = patching.read_vllm_version(target)
    if vllm_version != series.vllm_version:
        raise BuildStepError(
            f"the base image holds vLLM {vllm_version} in {target}; this image is "
            f"made for vLLM {series.vllm_version} (set BASE_IMAGE to a "
            f"vllm-openai-rocm {series.vllm_version} image)"
        )
    found = read_rocm_version(rocm_root)
    if found != rocm and not found.startswith(rocm + "."):
        raise BuildStepError(
            f"the base image has ROCm {found}, but the image is tagged and labelled "
            f"ROCm {rocm}; pass --build-arg ROCM_VERSION matching the base image"
        )
    return f"base image: vLLM {vllm_version}, ROCm {found} in {rocm_root}"


def patch(target: Path, series: Series, expected_series_id: str | None) -> str:
    """Apply the series, then re-read the tree and require it applied."""
    if expected_series_id and expected_series_id != series.series_id:
        raise BuildStepError(
            f"the build was asked for series {expected_series_id}, but the "
            f"installed k3rocm carries {series.series_id}; rebuild with "
            "scripts/build-image so the label and the tree agree"
        )
    try:
        patching.apply(target, series)
        state = patching.inspect(target, series)
    except (Refusal, patching.AlreadyUpstream) as err:
        raise BuildStepError(str(err)) from None
    if state.state != PatchState.APPLIED:
        raise BuildStepError(f"after apply, {target} reads as {state.state}")
    return f"series {series.series_id} applied to vLLM {state.vllm_version} in {target}"


def base_digest(reference: str) -> str | None:
    _, at, digest = reference.partition("@")
    return digest if at and digest.startswith("sha256:") else None


def versions(target: Path, series: Series, rocm_root: Path) -> dict:
    """What the image holds; the build arguments name the image itself."""
    recorded: dict[str, str | None] = {
        "image_tag": os.environ.get("K3_IMAGE_VERSION"),
        "base_image": os.environ.get("BASE_IMAGE"),
        # Pinned only when built from name@sha256:...; a tag may move.
        "base_image_digest": base_digest(os.environ.get("BASE_IMAGE") or ""),
        "git_revision": os.environ.get("K3_GIT_REVISION"),
    }
    for name in _RECORDED_DISTRIBUTIONS:
        try:
            recorded[name] = md.version(name)
        except md.PackageNotFoundError:
            recorded[name] = None
    return {
        "vllm": patching.read_vllm_version(target),
        "patch_series": series.series_id,
        "rocm": read_rocm_version(rocm_root),
        "python": platform.python_version(),
        **recorded,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3rocm.supply_chain.image", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("tag").add_argument("--rocm-version", default=ROCM_VERSION)
    base = sub.add_parser("verify-base")
    base.add_argument("--rocm-version", required=True)
    step = sub.add_parser("patch")
    step.add_argument("--series-id")
    record = sub.add_parser("versions")
    record.add_argument("--out", type=Path, required=True)
    for command in (base, step, record):
        command.add_argument("--target", type=Path, help="dir holding vllm/")
    for command in (base, record):
        command.add_argument("--rocm-root", type=Path, default=DEFAULT_ROCM_ROOT)
    args = parser.parse_args(argv)

    series = Series(installed_line_dir())
    if args.command == "tag":
        print(image_tag(series, args.rocm_version))
        return 0
    try:
        target = args.target or patching.find_installed_target()
        if args.command == "verify-base":
            message = verify_base(target, series, args.rocm_root, args.rocm_version)
        elif args.command == "patch":
            message = patch(target, series, args.series_id)
        else:
            recorded = versions(target, series, args.rocm_root)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(recorded, indent=2) + "\n")
            message = f"wrote {args.out}: {json.dumps(recorded)}"
    except (BuildStepError, RocmVersionError, Refusal) as err:
        line_logger(f"k3rocm.supply_chain.image {args.command}")(str(err))
        return 1
    print(message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
