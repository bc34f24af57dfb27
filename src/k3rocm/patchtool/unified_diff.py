"""A strict applier for the unified diffs of the patch series.

The image's base may have no ``git`` or ``patch`` (nothing promises either),
so the patch tool applies its own series. Strict on purpose: every hunk must
match its context and removed lines byte for byte at the line it names (the
tool has already checked each file's sha256 against the pristine release, so
there is no offset or fuzz to allow for); any mismatch is an error that names
the file and hunk.

Understood: ``--- a/PATH`` / ``+++ b/PATH`` file headers, ``/dev/null`` for a
created file, ``@@ -l,s +l,s @@`` hunks, `` ``/``-``/``+`` lines and ``\\ No
newline at end of file``. Text before the first header (the patch's
description) is ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_NO_NEWLINE = b"\\ No newline at end of file"


class DiffError(Exception):
    """The diff is malformed or does not match the file it patches."""


@dataclass
class Hunk:
    old_start: int
    old_count: int
    new_count: int
    lines: list[bytes] = field(default_factory=list)  # each with its ' '/'-'/'+'


@dataclass
class FilePatch:
    path: str
    creates: bool
    hunks: list[Hunk] = field(default_factory=list)


def _strip_prefix(header: bytes) -> str | None:
    name = header.split(b"\t", 1)[0].strip().decode()
    if name == "/dev/null":
        return None
    if not name.startswith(("a/", "b/")):
        raise DiffError(f"file header {name!r} lacks the a/ or b/ prefix")
    return name[2:]


def parse(text: bytes) -> list[FilePatch]:
    lines = text.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    patches: list[FilePatch] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if not (line.startswith(b"--- ") and index + 1 < len(lines)):
            index += 1
            continue
        if not lines[index + 1].startswith(b"+++ "):
            raise DiffError(f"line {index + 2}: '---' header without '+++'")
        old = _strip_prefix(line[4:])
        new = _strip_prefix(lines[index + 1][4:])
        if new is None:
            raise DiffError("the series never deletes files")
        patch = FilePatch(path=new, creates=old is None)
        index += 2
        while index < len(lines) and lines[index].startswith(b"@@"):
            index = _parse_hunk(lines, index, patch)
        if not patch.hunks:
            raise DiffError(f"{new}: file header without hunks")
        patches.append(patch)
    return patches


def _parse_hunk(lines: list[bytes], index: int, patch: FilePatch) -> int:
    match = _HUNK.match(lines[index])
    if match is None:
        raise DiffError(f"{patch.path}: malformed hunk header {lines[index]!r}")
    old_count = int(match.group(2) if match.group(2) is not None else 1)
    new_count = int(match.group(4) if match.group(4) is not None else 1)
    hunk = Hunk(int(match.group(1)), old_count, new_count)
    index += 1
    old_seen = new_seen = 0
    while old_seen < old_count or new_seen < new_count:
        if index >= len(lines):
            raise DiffError(f"{patch.path}: hunk at line {hunk.old_start} is cut short")
        line = lines[index]
        kind = line[:1]
        if kind == b" ":
            old_seen, new_seen = old_seen + 1, new_seen + 1
        elif kind == b"-":
            old_seen += 1
        elif kind == b"+":
            new_seen += 1
        else:
            raise DiffError(f"{patch.path}: unexpected line {line[:60]!r} in a hunk")
        hunk.lines.append(line)
        index += 1
    if old_seen != old_count or new_seen != new_count:
        raise DiffError(f"{patch.path}: hunk at line {hunk.old_start} miscounts")
    if index < len(lines) and lines[index] == _NO_NEWLINE:
        raise DiffError(f"{patch.path}: files without a final newline are not used")
    patch.hunks.append(hunk)
    return index


def apply_file(patch: FilePatch, original: bytes | None) -> bytes:
    """The patched bytes of one file (``original`` is None for a new file)."""
    if patch.creates != (original is None):
        state = "exists" if original is not None else "is missing"
        raise DiffError(f"{patch.path} {state}, which the diff does not expect")
    old = original.split(b"\n") if original else []
    if old and old[-1] == b"":
        old.pop()
    elif original:
        raise DiffError(f"{patch.path} does not end with a newline")
    out: list[bytes] = []
    cursor = 0  # next line of `old` not yet copied
    for hunk in patch.hunks:
        start = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        if start < cursor:
            raise DiffError(f"{patch.path}: hunks overlap or are out of order")
        out.extend(old[cursor:start])
        cursor = start
        for line in hunk.lines:
            kind, body = line[:1], line[1:]
            if kind == b"+":
                out.append(body)
                continue
            if cursor >= len(old) or old[cursor] != body:
                found = old[cursor] if cursor < len(old) else b"<end of file>"
                raise DiffError(
                    f"{patch.path}: line {cursor + 1} is {found[:60]!r}, the diff "
                    f"expects {body[:60]!r}"
                )
            if kind == b" ":
                out.append(body)
            cursor += 1
    out.extend(old[cursor:])
    return b"".join(line + b"\n" for line in out)
