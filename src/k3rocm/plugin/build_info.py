"""``k3rocm_build_info``: what this server runs, as labels of a constant 1.

Labels: vllm_version, patch_series (the applied series id, ``none`` for an
unpatched vLLM, ``upstream`` for a vLLM that already has the change,
``invalid`` when the tree does not match its marker or the marker is not one
the patch tool writes), image_tag and rocm_version (``unknown`` where not
known), kda_metadata (K3_KDA_METADATA: ``device``, the series' path, or
``legacy``, vLLM 0.27.1's; ``invalid`` for anything else, which the layer
refuses). Nothing in the marker may fail vLLM's start: the plugin builds these
labels while vLLM sets up its stat loggers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from k3rocm.common.json_file import UnreadableJson, read_json_file
from k3rocm.common.metric_names import BUILD_INFO
from k3rocm.common.setting_kinds import SettingError
from k3rocm.common.setting_table import IMAGE_TAG, KDA_METADATA
from k3rocm.common.states import PatchState
from k3rocm.patchtool.lines import installed_line_dir
from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.patching import find_installed_target, inspect
from k3rocm.patchtool.series import MARKER_NAME, Series, SeriesError
from k3rocm.supply_chain.rocm import (
    DEFAULT_ROCM_ROOT,
    RocmVersionError,
    read_rocm_version,
)

log = logging.getLogger(__name__)

DOCUMENTATION = (
    "Build of this server: vLLM version, patch series, image, ROCm, and the "
    "KDA metadata path it runs."
)
UNKNOWN = "unknown"
INVALID = "invalid"


def is_label_text(value: object) -> bool:
    """A non-empty str that /metrics can encode (JSON and environment
    variables can both carry lone surrogates, which UTF-8 cannot)."""
    if not isinstance(value, str) or not value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def label_text(value: str) -> str:
    """value with anything UTF-8 cannot encode written as an escape."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def marker_problem(marker: Path) -> str | None:
    """What makes the patch marker unlike one the patch tool writes, or None
    (also when there is no marker: the tree is then unpatched or upstream).
    The patch tool's own checks assume that shape."""
    try:
        content = read_json_file(marker)
    except FileNotFoundError:
        return None
    except UnreadableJson as err:
        return str(err)
    if not isinstance(content, dict):
        return f"it holds a JSON {type(content).__name__}, not an object"
    if not is_label_text(content.get("series_id")):
        return "its series_id is not a non-empty UTF-8 string"
    if not isinstance(content.get("series_sha256"), str):
        return "its series_sha256 is not a string"
    files = content.get("patched_files")
    if not isinstance(files, dict) or not all(
        isinstance(digest, str) for digest in files.values()
    ):
        return "its patched_files is not an object of path: sha256 strings"
    return None


def patch_series_label(target: Path | None = None, series: Series | None = None) -> str:
    """The patch series the vLLM tree at target (default: the installed one)
    carries, as the patch_series label."""
    try:
        target = target or find_installed_target()
        series = series or Series(installed_line_dir())
        problem = marker_problem(target / "vllm" / MARKER_NAME)
        if problem:
            log.warning("the patch marker in %s is not valid: %s", target, problem)
            return INVALID
        state = inspect(target, series)
        if state.state != PatchState.APPLIED:
            return "none" if state.state == PatchState.PRISTINE else state.state
        series_id = state.marker["series_id"]
    except (Refusal, SeriesError, OSError) as err:
        log.warning("cannot tell which patch series vLLM carries: %s", err)
        return INVALID
    except Exception:
        # The label is not worth failing vLLM's start over (the marker could
        # change between the check above and the patch tool's own read).
        log.exception("cannot tell which patch series vLLM carries")
        return INVALID
    # The patch tool read the marker again: checked the same way.
    return series_id if is_label_text(series_id) else INVALID


def rocm_version(rocm_root: Path = DEFAULT_ROCM_ROOT) -> str:
    """The ROCm version, as the image build read it, or "unknown" (also for
    a file whose text, control characters and all, is no version)."""
    try:
        version = read_rocm_version(rocm_root)
    except RocmVersionError:
        return UNKNOWN
    return version if version and version.isprintable() else UNKNOWN


def build_info_labels() -> dict[str, str]:
    # Imported here, not above: importing this module needs no vLLM.
    import vllm

    return {
        "vllm_version": vllm.__version__,
        "patch_series": patch_series_label(),
        "image_tag": label_text(IMAGE_TAG.text(os.environ) or UNKNOWN),
        "rocm_version": rocm_version(),
        "kda_metadata": kda_metadata_label(),
    }


def kda_metadata_label() -> str:
    try:
        return str(KDA_METADATA.read(os.environ))
    except SettingError:
        return INVALID


def install_build_info(
    registry: CollectorRegistry, labels: dict[str, str] | None = None
) -> Gauge:
    """A gauge, not a collector: in multiprocess mode only metric objects
    reach /metrics; every API server sets the same labels to 1 ("max")."""
    labels = build_info_labels() if labels is None else labels
    gauge = Gauge(
        BUILD_INFO,
        DOCUMENTATION,
        list(labels),
        multiprocess_mode="max",
        registry=registry,
    )
    gauge.labels(**labels).set(1)
    return gauge
