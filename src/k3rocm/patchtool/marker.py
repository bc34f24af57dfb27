"""The patch marker ``vllm/.k3rocm-patchset.json``: what it records, and a
check of its shape before anything trusts it (a marker written by hand or
by another tool must give a refusal, not a traceback)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.series import MARKER_NAME, Series


def build_marker(series: Series, vllm_version: str, new_files: dict[str, bytes]):
    return {
        "series_id": series.series_id,
        "series_revision": series.revision,
        "series_sha256": series.sha256,
        "vllm_version": vllm_version,
        "patches": [p.name for p in series.patches],
        "patched_files": {
            rel: hashlib.sha256(content).hexdigest()
            for rel, content in new_files.items()
        },
        "applied_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def read_marker(target: Path) -> dict | None:
    path = target / "vllm" / MARKER_NAME
    if not path.exists():
        return None
    try:
        marker = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise Refusal(
            f"patch marker {path} is unreadable ({err}); reinstall vLLM "
            f"and apply the series again"
        ) from None
    problem = _marker_problem(marker)
    if problem:
        raise Refusal(
            f"patch marker {path} is malformed ({problem}); this tool did not "
            "write it. Reinstall vLLM (pristine) and apply the series again."
        )
    return marker


def _marker_problem(marker: object) -> str | None:
    """What is wrong with the shape of a parsed marker, if anything."""
    if not isinstance(marker, dict):
        return f"a JSON {type(marker).__name__}, not an object"
    for key in ("series_id", "series_sha256"):
        if not isinstance(marker.get(key), str):
            return f"{key!r} is not a string"
    files = marker.get("patched_files")
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        return "'patched_files' is not an object of path -> sha256 strings"
    for rel in files:
        parts = PurePosixPath(rel).parts
        if PurePosixPath(rel).is_absolute() or ".." in parts or parts[:1] != ("vllm",):
            return f"'patched_files' names {rel!r}, outside vllm/"
    patches = marker.get("patches")
    if not isinstance(patches, list) or not all(isinstance(p, str) for p in patches):
        return "'patches' is not a list of strings"
    return None
