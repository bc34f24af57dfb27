"""The patch series on one vLLM tree: find the tree and read its vLLM
version, classify it (pristine, applied or upstream, refusing anything the
series must not touch), and apply or check the series. Each runs under the
tree's lock, after finishing an apply that a crash interrupted (see
``k3rocm.patchtool.journal``); ``apply`` is all or nothing and idempotent.
The command over these is ``k3rocm.patchtool.patchset``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from k3rocm.common.states import PatchState
from k3rocm.patchtool import unified_diff
from k3rocm.patchtool.journal import locked_and_recovered, pending_journal, write_files
from k3rocm.patchtool.lines import version_key
from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.marker import build_marker, read_marker
from k3rocm.patchtool.series import MARKER_NAME, Series

_VERSION_RE = re.compile(
    r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M
)
_DIST_RE = re.compile(r"^vllm(?:[-_]cpu|[-_]rocm)?-([^-]+)\.dist-info$")
DEFAULT_LOCK_TIMEOUT = 60.0


class AlreadyUpstream(Exception):
    """The tree already carries the upstream change; nothing was changed."""


@dataclass
class TreeState:
    target: str
    vllm_version: str
    state: PatchState  # pristine | applied | upstream
    series_id: str
    marker: dict | None = None
    changed: bool = False  # this run wrote to the tree
    recovered: str | None = None  # what this run did about an interrupted apply


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def find_installed_target() -> Path:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise Refusal(
            "no installed vllm package found; pass --target DIR, the directory "
            "that holds vllm/"
        )
    return Path(next(iter(spec.submodule_search_locations))).parent


def read_vllm_version(target: Path) -> str:
    """The version a vLLM tree declares, read from files (never imported)."""
    version_file = target / "vllm" / "_version.py"
    if version_file.is_file():
        match = _VERSION_RE.search(version_file.read_text())
        if match:
            return match.group(1)
    for entry in sorted(target.iterdir()):
        match = _DIST_RE.match(entry.name)
        if match:
            return match.group(1)
    raise Refusal(
        f"cannot tell which vLLM {target / 'vllm'} is: no vllm/_version.py and "
        "no vllm*.dist-info beside it. Point --target at a vLLM install or a "
        "built source tree."
    )


def inspect(target: Path, series: Series) -> TreeState:
    """Classify a tree, refusing anything the series must not touch."""
    require_vllm_package(target)
    journal = pending_journal(target)
    if journal is not None:
        raise Refusal(
            f"an apply to {target} was interrupted and its journal {journal} is "
            "still there; run `python -m k3rocm.patchtool.patchset apply --target "
            f"{target}` as a user that may write the tree to finish it."
        )
    version = read_vllm_version(target)
    marker = read_marker(target)
    state = TreeState(
        str(target), version, PatchState.PRISTINE, series.series_id, marker
    )
    if marker is not None:
        if marker.get("series_sha256") != series.sha256:
            raise Refusal(
                f"{target} was patched with series {marker.get('series_id')}, not "
                f"{series.series_id}; reinstall vLLM {series.vllm_version} "
                "(pristine) and apply this series"
            )
        _require_files_match(target, series, marker["patched_files"], "patched")
        state.state = PatchState.APPLIED
        return state
    if version != series.vllm_version:
        since = series.upstream_since
        if since is not None and version_key(version) >= version_key(since):
            state.state = PatchState.UPSTREAM
            return state
        raise Refusal(
            f"found vLLM {version} in {target}, expected {series.vllm_version}; "
            f"the series is made for vLLM {series.vllm_version} only. Install "
            f"vllm=={series.vllm_version} (or use a base image that has it)."
        )
    _require_files_match(target, series, series.pristine_files, "pristine")
    for rel in series.created_files:
        if (target / rel).exists():
            raise Refusal(
                f"{target / rel} already exists in a tree without the patch "
                "marker; the tree is not a pristine vLLM "
                f"{series.vllm_version}. Reinstall vLLM and apply again."
            )
    return state


def require_vllm_package(target: Path) -> None:
    if not (target / "vllm" / "__init__.py").is_file():
        raise Refusal(f"{target} holds no vllm/ package (no vllm/__init__.py)")


def _require_inside(target: Path, rels: list[str]) -> None:
    """Every directory the tool would write in resolves inside the tree: a
    directory symlink would carry the writes to another tree. (A symlinked
    file is itself replaced, inside the tree.)"""
    root = target.resolve()
    for rel in rels:
        directory = (target / rel).parent
        resolved = directory.resolve()
        if not resolved.is_relative_to(root):
            raise Refusal(
                f"{directory} resolves to {resolved}, outside the tree {root}; "
                "the patch tool writes only inside its tree. Nothing was "
                "changed: replace the symlink with the directory itself, or "
                "point --target at the tree it leads to."
            )


def _session(
    target: Path, series: Series, must_write: bool, lock_timeout: float, on_wait
):
    """The tree's lock, taken only once the target is known to be a vLLM tree
    (no lock file is left in a directory that is not one) whose written
    directories all lie inside it."""
    require_vllm_package(target)
    _require_inside(target, [*series.touched_files, f"vllm/{MARKER_NAME}"])
    return locked_and_recovered(target, must_write, lock_timeout, on_wait)


def _require_files_match(
    target: Path, series: Series, expected: dict[str, str], kind: str
) -> None:
    for rel, digest in expected.items():
        path = target / rel
        if not path.is_file():
            raise Refusal(f"{path} is missing; the tree is not a {kind} vLLM tree")
        found = _sha256(path)
        if found != digest:
            raise Refusal(
                f"{path} has drifted from the {kind} vLLM {series.vllm_version} "
                f"file (sha256 {found[:12]}, expected {digest[:12]}). Reinstall "
                f"vLLM {series.vllm_version}, or refresh the series for this tree."
            )


def _stage(target: Path, series: Series, staging: Path) -> dict[str, bytes]:
    """Apply the series to copies of the touched files; return their new bytes."""
    for rel in series.touched_files:
        if (target / rel).is_file():
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(target / rel, staging / rel)
    # Our own strict applier: the base image may have neither git nor patch.
    for patch in series.patches:
        try:
            for file_patch in unified_diff.parse(patch.read_bytes()):
                path = staging / file_patch.path
                original = path.read_bytes() if path.is_file() else None
                patched = unified_diff.apply_file(file_patch, original)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(patched)
        except unified_diff.DiffError as err:
            raise Refusal(
                f"patch {patch.name} does not apply to {target}: {err}\n"
                "Nothing was changed. The series or the tree is damaged: "
                "reinstall k3rocm / vLLM."
            ) from None
    return {rel: (staging / rel).read_bytes() for rel in series.touched_files}


def apply(
    target: Path,
    series: Series,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_wait=None,
) -> TreeState:
    with _session(target, series, True, lock_timeout, on_wait) as recovered:
        state = inspect(target, series)
        state.recovered = recovered
        state.changed = recovered == "finished an interrupted apply"
        if state.state == PatchState.APPLIED:
            return state
        if state.state == PatchState.UPSTREAM:
            raise AlreadyUpstream(_upstream_message(state, series))
        with tempfile.TemporaryDirectory(prefix="k3rocm-stage-") as tmp:
            new_files = _stage(target, series, Path(tmp))
        marker = build_marker(series, state.vllm_version, new_files)
        marker_bytes = (json.dumps(marker, indent=2) + "\n").encode()
        new_files[f"vllm/{MARKER_NAME}"] = marker_bytes  # last: it vouches for all
        write_files(target, new_files)
    state.state, state.marker, state.changed = PatchState.APPLIED, marker, True
    return state


def check(
    target: Path,
    series: Series,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_wait=None,
) -> TreeState:
    """Everything ``apply`` verifies; writes only to finish a crashed apply."""
    with _session(target, series, False, lock_timeout, on_wait) as recovered:
        state = inspect(target, series)
        state.recovered = recovered
        if state.state == PatchState.UPSTREAM:
            raise AlreadyUpstream(_upstream_message(state, series))
        if state.state == PatchState.PRISTINE:
            with tempfile.TemporaryDirectory(prefix="k3rocm-stage-") as tmp:
                _stage(target, series, Path(tmp))
    return state


def status(
    target: Path,
    series: Series,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    on_wait=None,
) -> TreeState:
    """``inspect`` under the lock, after finishing an interrupted apply."""
    with _session(target, series, False, lock_timeout, on_wait) as recovered:
        state = inspect(target, series)
    state.recovered = recovered
    return state


def _upstream_message(state: TreeState, series: Series) -> str:
    return (
        f"vLLM {state.vllm_version} in {state.target} already contains the "
        f"upstream change (since {series.upstream_since}); nothing to apply, "
        "nothing changed. This image and series are made for vLLM "
        f"{series.vllm_version}."
    )
