"""Releases compared step by step: what changed between two release trees,
unit by unit, which triage entries cover each change, and which entry
names a unit that did not change in its step.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from k3rocm.patchtool.triage_file import Entry, Triage, TriageError, version_key
from k3rocm.patchtool.triage_trees import Tree
from k3rocm.patchtool.triage_units import module_units


@dataclass(frozen=True)
class Change:
    path: str
    unit: str
    status: str  # added | removed | changed
    line: int  # in the newer tree (the older one for a removed unit)


@dataclass
class FileChange:
    path: str
    status: str  # added | removed | changed
    units: list[Change]


def compare(old: Tree, new: Tree) -> list[FileChange]:
    found = []
    for path in sorted(old.files.keys() | new.files.keys()):
        before = module_units(old.files[path], path) if path in old.files else {}
        after = module_units(new.files[path], path) if path in new.files else {}
        status = (
            "added" if path not in old.files
            else "removed" if path not in new.files
            else "changed"
        )  # fmt: skip
        units = []
        for name in sorted(before.keys() | after.keys()):
            if name not in before:
                units.append(Change(path, name, "added", after[name].line))
            elif name not in after:
                units.append(Change(path, name, "removed", before[name].line))
            elif before[name].digest != after[name].digest:
                units.append(Change(path, name, "changed", after[name].line))
        if units:
            found.append(FileChange(path, status, units))
    return found


@dataclass
class Step:
    old: Tree
    new: Tree
    files: list[FileChange]
    entries: list[Entry]  # the entries of releases in (old, new]
    covering: dict[Change, list[Entry]] = field(default_factory=dict)
    stale: list[tuple[Entry, str]] = field(default_factory=list)  # names no change
    # Releases of the triage in (old, new]: with more than one, a unit added
    # and removed again between them shows no change, so stale names are notes.
    spans: int = 1

    @property
    def uncovered(self) -> list[Change]:
        return [c for c, by in self.covering.items() if not by]

    @property
    def failing_stale(self) -> list[tuple[Entry, str]]:
        return self.stale if self.spans <= 1 else []


def triage_step(old: Tree, new: Tree, triage: Triage) -> Step:
    low, high = version_key(old.version), version_key(new.version)
    entries = [e for e in triage.entries if low < version_key(e.release) <= high]
    step = Step(old, new, compare(old, new), entries)
    step.spans = sum(low < version_key(v) <= high for v in triage.releases)
    changes = [c for f in step.files for c in f.units]
    for change in changes:
        step.covering[change] = [
            e for e in entries if e.covers(change.path, change.unit)
        ]
    for entry in entries:
        for pattern in entry.changes:
            if not any(
                fnmatch.fnmatchcase(f"{c.path}::{c.unit}", pattern) for c in changes
            ):
                step.stale.append((entry, pattern))
    return step


def triage_chain(base: Tree, releases: list[Tree], triage: Triage) -> list[Step]:
    ordered = sorted(releases, key=lambda t: version_key(t.version))
    for tree in ordered:
        if version_key(tree.version) <= version_key(base.version):
            raise TriageError(
                f"{tree.label} is vLLM {tree.version}, not newer than the base "
                f"{base.version}"
            )
    versions = [t.version for t in ordered]
    if len(set(versions)) != len(versions):
        raise TriageError(f"the same release given twice: {', '.join(versions)}")
    steps, previous = [], base
    for tree in ordered:
        steps.append(triage_step(previous, tree, triage))
        previous = tree
    return steps
