"""k3rocm.patchtool.unified_diff (the patch tool's own applier, so the image needs no
git) against `git apply` as the reference, on the real files of the installed
vLLM (0.27.1 or 0.32.0) with its line's series."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.vllm_trees import SERIES, installed_root

from k3rocm.patchtool import unified_diff

pytestmark = pytest.mark.every_line

ROOT = installed_root()


def ours(originals: dict[str, bytes | None]) -> dict[str, bytes]:
    """The series applied in order, file by file, by the module under test."""
    files = dict(originals)
    for patch in SERIES.patches:
        for file_patch in unified_diff.parse(patch.read_bytes()):
            files[file_patch.path] = unified_diff.apply_file(
                file_patch, files.get(file_patch.path)
            )
    return {rel: data for rel, data in files.items() if data is not None}


def git_apply(
    originals: dict[str, bytes | None], tree: Path
) -> dict[str, bytes] | None:
    """The same with git; None when git refuses."""
    for rel, data in originals.items():
        if data is not None:
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_bytes(data)
    for patch in SERIES.patches:
        result = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", str(patch)],
            cwd=tree,
            capture_output=True,
        )
        if result.returncode != 0:
            return None
    return {rel: (tree / rel).read_bytes() for rel in SERIES.touched_files}


def pristine() -> dict[str, bytes | None]:
    return {
        rel: (ROOT / rel).read_bytes() if (ROOT / rel).is_file() else None
        for rel in SERIES.touched_files
    }


def test_the_series_applies_byte_for_byte_like_git(tmp_path):
    assert ours(pristine()) == git_apply(pristine(), tmp_path)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_changed_line_is_refused_exactly_when_git_refuses(tmp_path_factory, data):
    originals = pristine()
    existing = sorted(rel for rel, text in originals.items() if text is not None)
    rel = data.draw(st.sampled_from(existing))
    lines = originals[rel].split(b"\n")[:-1]
    index = data.draw(st.integers(0, len(lines) - 1))
    lines[index] = lines[index] + b"  # changed"
    originals[rel] = b"\n".join(lines) + b"\n"
    reference = git_apply(originals, tmp_path_factory.mktemp("git"))
    if reference is None:
        with pytest.raises(unified_diff.DiffError, match=rel.split("/")[-1]):
            ours(originals)
    else:
        assert ours(originals) == reference


def test_a_created_file_that_exists_is_refused():
    originals = pristine()
    created = next(rel for rel, data in originals.items() if data is None)
    originals[created] = b"already here\n"
    with pytest.raises(unified_diff.DiffError, match="exists"):
        ours(originals)


@pytest.mark.parametrize(
    "damage",
    [
        # The first hunk claims one line more than it has.
        lambda text: re.sub(
            rb"^(@@ -\d+(?:,\d+)? \+\d+,)(\d+)",
            lambda m: m[1] + str(int(m[2]) + 1).encode(),
            text,
            count=1,
            flags=re.MULTILINE,
        ),
        lambda text: text.replace(b"+++ b/", b"+++ ", 1),
        lambda text: text[: len(text) // 2],
    ],
    ids=["miscounted-hunk", "header-without-prefix", "cut-short"],
)
def test_a_damaged_patch_is_refused(damage):
    text = damage(SERIES.patches[0].read_bytes())
    with pytest.raises(unified_diff.DiffError):
        for file_patch in unified_diff.parse(text):
            original = None if file_patch.creates else ROOT / file_patch.path
            unified_diff.apply_file(file_patch, original and original.read_bytes())
