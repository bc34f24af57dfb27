"""Patches generated from source files in this repository (k3rocm.patchtool.patchgen)
stay in step with their sources, apply with the series' strict applier, and
put exactly the source's bytes into a real vLLM tree."""

import subprocess
import sys

import pytest
from support.vllm_trees import REPO, SERIES, patched_tree

from k3rocm.patchtool import unified_diff
from k3rocm.patchtool.patchgen import GENERATED, main, stale

pytestmark = pytest.mark.every_line


def test_committed_patches_equal_what_their_sources_generate():
    assert stale() == [], "run: python -m k3rocm.patchtool.patchgen"


def test_check_command_passes_on_the_checkout():
    result = subprocess.run(
        [sys.executable, "-m", "k3rocm.patchtool.patchgen", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture
def scratch_repo(tmp_path):
    """A copy of the sources and patches the generator reads."""
    for generated in GENERATED:
        sources = [f.source for f in generated.files]
        for rel in (*sources, generated.path):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_bytes((REPO / rel).read_bytes())
    return tmp_path


FILES = [(g, f) for g in GENERATED for f in g.files]
FILE_IDS = [f"{g.line}/{f.target.rsplit('/', 1)[-1]}" for g, f in FILES]
# The installed vLLM's line: the one patched_tree() applies.
INSTALLED = [(g, f) for g, f in FILES if g.line == SERIES.directory.name]


@pytest.mark.parametrize(("generated", "file"), FILES, ids=FILE_IDS)
def test_editing_a_source_without_regenerating_is_caught(scratch_repo, generated, file):
    source = scratch_repo / file.source
    source.write_bytes(source.read_bytes() + b"# an edit\n")
    # Every line's patch that carries the source goes stale with it.
    carriers = [
        g.path for g in GENERATED if any(f.source == file.source for f in g.files)
    ]
    assert generated.path in carriers
    assert stale(scratch_repo) == carriers
    assert main(["--check", "--repo", str(scratch_repo)]) == 1
    assert main(["--repo", str(scratch_repo)]) == 0
    assert stale(scratch_repo) == []
    patch = (scratch_repo / generated.path).read_bytes()
    (edited,) = [p for p in unified_diff.parse(patch) if p.path == file.target]
    assert edited.hunks[-1].lines[-1] == b"+# an edit"
    # The description survives regeneration.
    assert patch.startswith(generated.description(REPO))


@pytest.mark.parametrize("generated", GENERATED, ids=lambda g: g.patch)
def test_patch_only_adds_its_sources_and_applies_strictly(generated):
    file_patches = unified_diff.parse((REPO / generated.path).read_bytes())
    assert [p.path for p in file_patches] == [f.target for f in generated.files]
    for file_patch, file in zip(file_patches, generated.files, strict=True):
        assert file_patch.creates
        assert all(
            line.startswith(b"+") for hunk in file_patch.hunks for line in hunk.lines
        )
        source = (REPO / file.source).read_bytes()
        assert unified_diff.apply_file(file_patch, None) == source


@pytest.mark.parametrize(
    ("generated", "file"), INSTALLED, ids=[f.target for _, f in INSTALLED]
)
def test_tree_patched_by_the_tool_holds_the_source(generated, file):
    patched = patched_tree() / file.target
    assert patched.read_bytes() == (REPO / file.source).read_bytes()


def test_every_kernel_source_is_generated_into_a_patch():
    """A module under src/k3rocm/kernels/ that no patch carries would be
    tested here but never shipped."""
    kernels = REPO / "src" / "k3rocm" / "kernels"
    generated = {f.source for _, f in FILES}
    modules = {
        str(p.relative_to(REPO))
        for p in kernels.glob("*.py")
        if p.name != "__init__.py"
    }
    assert modules == generated
