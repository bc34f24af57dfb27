"""Patches generated from source files in this repository (k3rocm.patchgen)
stay in step with their sources, apply with the series' strict applier, and
put exactly the source's bytes into a real vLLM tree."""

import subprocess
import sys

import pytest
from vllm_trees import REPO, patched_tree

from k3rocm import unified_diff
from k3rocm.patchgen import GENERATED, main, stale


def test_committed_patches_equal_what_their_sources_generate():
    assert stale() == [], "run: python -m k3rocm.patchgen"


def test_check_command_passes_on_the_checkout():
    result = subprocess.run(
        [sys.executable, "-m", "k3rocm.patchgen", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture
def scratch_repo(tmp_path):
    """A copy of the sources and patches the generator reads."""
    for generated in GENERATED:
        for rel in (generated.source, f"patches/{generated.patch}"):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_bytes((REPO / rel).read_bytes())
    return tmp_path


@pytest.mark.parametrize("generated", GENERATED, ids=lambda g: g.patch)
def test_editing_a_source_without_regenerating_is_caught(scratch_repo, generated):
    source = scratch_repo / generated.source
    source.write_bytes(source.read_bytes() + b"# an edit\n")
    assert stale(scratch_repo) == [generated.patch]
    assert main(["--check", "--repo", str(scratch_repo)]) == 1
    assert main(["--repo", str(scratch_repo)]) == 0
    assert stale(scratch_repo) == []
    patch = (scratch_repo / "patches" / generated.patch).read_bytes()
    assert patch.endswith(b"\n+# an edit\n")
    # The description survives regeneration.
    assert patch.startswith(generated.description(REPO))


@pytest.mark.parametrize("generated", GENERATED, ids=lambda g: g.patch)
def test_patch_only_adds_the_source_and_applies_strictly(generated):
    (file_patch,) = unified_diff.parse(
        (REPO / "patches" / generated.patch).read_bytes()
    )
    assert file_patch.creates and file_patch.path == generated.target
    assert all(
        line.startswith(b"+") for hunk in file_patch.hunks for line in hunk.lines
    )
    source = (REPO / generated.source).read_bytes()
    assert unified_diff.apply_file(file_patch, None) == source


@pytest.mark.parametrize("generated", GENERATED, ids=lambda g: g.patch)
def test_tree_patched_by_the_tool_holds_the_source(generated):
    patched = patched_tree() / generated.target
    assert patched.read_bytes() == (REPO / generated.source).read_bytes()
