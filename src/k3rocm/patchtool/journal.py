"""Journal the patch tool's writes to a vLLM tree, so a crash never leaves
it half-patched.

Before the first file of the tree is replaced, a journal
directory (``<target>/.k3rocm-patch-journal/``) holds a copy of every
original and every new file, and ``journal.json`` naming them; it is
fsync'd and renamed into place, so it either exists whole or not at all.

After a crash the next run *rolls forward*: it installs the journal's new
files (the marker last) and deletes the journal. Rolling forward is chosen
because the journal is written only after every patch applied to a staged
copy, so finishing it is a copy that cannot conflict, and it gives the
result the interrupted ``apply`` was asked for. Should a file then be
unwritable, the run rolls back to the saved originals instead.

Fault-injection hooks, for tests only: ``K3_PATCHSET_STEP_DELAY=SECONDS``
sleeps at every step that writes, and ``K3_PATCHSET_CRASH_AT_STEP=N`` makes
the process SIGKILL itself at step N (counted from 1).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from k3rocm.patchtool.lock import Refusal, TreeLock

JOURNAL_DIR = ".k3rocm-patch-journal"
JOURNAL_FILE = "journal.json"
TEMP_PREFIX = ".k3rocm-tmp-"
_steps_taken = 0


def fault_point() -> None:
    """A step boundary: where the test hooks delay or kill the process."""
    global _steps_taken
    _steps_taken += 1
    if os.environ.get("K3_PATCHSET_CRASH_AT_STEP") == str(_steps_taken):
        os.kill(os.getpid(), signal.SIGKILL)
    delay = float(os.environ.get("K3_PATCHSET_STEP_DELAY") or 0)
    if delay > 0:
        time.sleep(delay)


def sha256_bytes(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


@dataclass
class Entry:
    """One file of the tree the journal replaces or creates."""

    path: str  # relative to the target, under vllm/
    mode: int
    new: str  # file name inside the journal
    new_sha256: str
    original: str | None  # None: the file did not exist
    original_sha256: str | None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, content: bytes, mode: int) -> None:
    """Create or replace path atomically: unique temp file, fsync, rename."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX + path.name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            os.fchmod(handle.fileno(), mode)  # explicit: the umask must not matter
            handle.flush()
            os.fsync(handle.fileno())
        fault_point()
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    fault_point()


def mode_for_new_file(target: Path, rel: str) -> int:
    """The mode of a .py file beside it (else of vllm/__init__.py)."""
    parent = (target / rel).parent
    siblings = sorted(p for p in parent.glob("*.py") if not p.is_symlink())
    for sibling in [*siblings, target / "vllm" / "__init__.py"]:
        if sibling.is_file():
            return stat.S_IMODE(sibling.stat().st_mode)
    return 0o644


def write_files(target: Path, new_files: dict[str, bytes]) -> None:
    """Replace or create every file in order, through the journal."""
    journal = target / JOURNAL_DIR
    shutil.rmtree(journal, ignore_errors=True)
    entries: list[Entry] = []
    try:
        journal.mkdir(mode=0o755)
        for index, (rel, content) in enumerate(new_files.items()):
            path = target / rel
            original = path.read_bytes() if path.exists() else None
            mode = (
                stat.S_IMODE(path.stat().st_mode)
                if original is not None
                else mode_for_new_file(target, rel)
            )
            entry = Entry(rel, mode, f"new-{index}", sha256_bytes(content), None, None)
            _write_durably(journal / entry.new, content, 0o644)
            if original is not None:
                entry.original = f"original-{index}"
                entry.original_sha256 = sha256_bytes(original)
                _write_durably(journal / entry.original, original, 0o644)
            entries.append(entry)
        record = {"entries": [vars(e) for e in entries]}
        _write_durably(journal / JOURNAL_FILE, json.dumps(record).encode(), 0o644)
        _fsync_dir(target)
    except OSError as err:
        shutil.rmtree(journal, ignore_errors=True)
        raise Refusal(
            f"cannot write to {target} ({err}); nothing was changed. Run as a "
            "user that may write the vLLM install."
        ) from None
    try:
        _roll_forward(target, journal, entries)
    except (OSError, ValueError) as err:
        _roll_back_or_refuse(target, journal, entries, err)
        raise Refusal(
            f"cannot write to {target} ({err}); nothing was changed. Run as a "
            "user that may write the vLLM install."
        ) from None
    _discard(target, journal)


def recover(target: Path) -> str | None:
    """Finish or undo an apply that was interrupted; say which, if any."""
    journal = target / JOURNAL_DIR
    if not journal.exists():
        return None
    if not (journal / JOURNAL_FILE).exists():
        # Killed while preparing (the tree was not touched yet) or while
        # discarding a finished journal: either way only the journal goes.
        shutil.rmtree(journal, ignore_errors=True)
        return None
    entries = _read_journal(journal)
    for entry in entries:  # unique temp files a killed run left behind
        for leftover in (target / entry.path).parent.glob(TEMP_PREFIX + "*"):
            try:
                leftover.unlink(missing_ok=True)
            except OSError:
                pass  # not ours to remove: the roll below then refuses
    try:
        _roll_forward(target, journal, entries)
        outcome = "finished an interrupted apply"
    except (OSError, ValueError) as err:
        _roll_back_or_refuse(target, journal, entries, err)
        outcome = "undid an interrupted apply"
    _discard(target, journal)
    return outcome


def _read_journal(journal: Path) -> list[Entry]:
    path = journal / JOURNAL_FILE
    try:
        entries = [Entry(**item) for item in json.loads(path.read_text())["entries"]]
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise Refusal(
            f"the journal {path} of an interrupted apply is unreadable ({err}); "
            "the tree may be half-patched. Reinstall vLLM and apply again."
        ) from None
    for entry in entries:
        rel = PurePosixPath(entry.path)
        if rel.is_absolute() or ".." in rel.parts or rel.parts[:1] != ("vllm",):
            raise Refusal(
                f"the journal {path} names {entry.path!r}, outside vllm/; it was "
                "not written by this tool. Reinstall vLLM and apply again."
            )
    return entries


def _install(target: Path, journal: Path, entry: Entry, name: str, digest: str):
    """Make the tree's file hold the journal copy ``name`` (checked by hash)."""
    path = target / entry.path
    if path.is_file() and sha256_bytes(path.read_bytes()) == digest:
        return
    content = (journal / name).read_bytes()
    if sha256_bytes(content) != digest:
        raise ValueError(f"journal copy {journal / name} is damaged")
    _write_durably(path, content, entry.mode)


def _roll_forward(target: Path, journal: Path, entries: list[Entry]) -> None:
    # The marker is the last entry, so it appears only once all files are new.
    for entry in entries:
        _install(target, journal, entry, entry.new, entry.new_sha256)


def _roll_back(target: Path, journal: Path, entries: list[Entry]) -> None:
    # In reverse: the marker goes first, so no marker ever vouches for a mix.
    for entry in reversed(entries):
        path = target / entry.path
        if entry.original is None:
            if path.exists():
                path.unlink()
                _fsync_dir(path.parent)
                fault_point()
        else:
            assert entry.original_sha256 is not None
            _install(target, journal, entry, entry.original, entry.original_sha256)


def _roll_back_or_refuse(
    target: Path, journal: Path, entries: list[Entry], cause: Exception
) -> None:
    try:
        _roll_back(target, journal, entries)
    except (OSError, ValueError) as err:
        raise Refusal(
            f"cannot finish ({cause}) nor undo ({err}) an apply to {target}; "
            f"the tree may be half-patched and {journal} keeps what is needed "
            "to repair it. Run `python -m k3rocm.patchtool.patchset apply` again as a "
            "user that may write the vLLM install."
        ) from None


def _discard(target: Path, journal: Path) -> None:
    """Drop the journal: first its record (the tree is final), then the rest."""
    try:
        (journal / JOURNAL_FILE).unlink(missing_ok=True)
        _fsync_dir(journal)
        fault_point()
        shutil.rmtree(journal)
        _fsync_dir(target)
        fault_point()
    except OSError:
        pass  # a journal without its record is ignored and removed next run


def pending_journal(target: Path) -> Path | None:
    """The record of an interrupted apply, if the tree has one."""
    path = target / JOURNAL_DIR / JOURNAL_FILE
    return path if path.exists() else None


@contextmanager
def locked_and_recovered(
    target: Path, must_write: bool, lock_timeout: float, on_wait=None
) -> Iterator[str | None]:
    """Hold the tree's lock; first finish (or undo) an interrupted apply.

    Yields what recovery did, or None when there was nothing to recover."""
    with TreeLock(target, lock_timeout, must_write, on_wait):
        yield recover(target)
