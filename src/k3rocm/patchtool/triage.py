"""Upstream triage: what newer vLLM releases change in the files we watch.

    python -m k3rocm.patchtool.triage RELEASE [RELEASE ...] [--base TREE]

``RELEASE`` is a vLLM tree (the directory that holds ``vllm/``) or a vLLM
wheel; ``--base`` is the tree the series targets (default: the installed
vLLM, which must be the series' version). The releases are sorted by
version and compared step by step, base first, function by function: every
top-level function, every method of a top-level class (``Class.method``),
each class's own body (``Class``), each top-level assignment (by the names
it binds) and the rest of the module (``<module>``: imports, ``if``/``try``
blocks). Two units are the same when their syntax trees are, docstrings
left out: comments, formatting and docstrings do not count as changes.

``patches/upstream-triage.toml`` holds one entry per upstream change to
the watched files (its pull request, the first release containing it, its
kind, the units it changes and the decision). A unit that changes in the
step ``(previous, release]`` is covered by an entry of a release in that
step that names it. The command prints every step's changes with the
entries covering them and exits 1 when a change is uncovered, when an
entry names a unit that did not change in its step (checked where the step
spans one triaged release; pass every release for the full check) or a
backport names a patch the series does not list; 2 on bad input.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import re
import sys
import tomllib
import zipfile
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path

from k3rocm.common.line_log import line_logger
from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.patchset import find_installed_target, read_vllm_version
from k3rocm.patchtool.series import Series, SeriesError, default_series_dir

TRIAGE_NAME = "upstream-triage.toml"
KINDS = ("fix", "performance", "feature", "refactor")
DECISIONS = ("backported", "not-applicable", "not-carried")
PR_RE = re.compile(r"^vllm-project/vllm#[1-9][0-9]*$")
UNIDENTIFIED = "unidentified"  # the release diff shows it; no pull request found
VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")
WHEEL_RE = re.compile(r"^vllm(?:_cpu)?-([0-9]+\.[0-9]+\.[0-9]+)-[^/]*\.whl$")
EXIT_OK, EXIT_UNCOVERED, EXIT_USAGE = 0, 1, 2


class TriageError(Exception):
    """Bad input: a triage file, a tree or a wheel that cannot be used."""


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# --- the triage data ---------------------------------------------------------


@dataclass(frozen=True)
class Release:
    version: str
    file: str
    sha256: str


@dataclass(frozen=True)
class Entry:
    pull_request: str
    title: str
    release: str
    kind: str
    decision: str
    reason: str
    patches: tuple[str, ...]
    changes: tuple[str, ...]  # "path::unit" patterns (fnmatch)

    @property
    def identified(self) -> bool:
        return self.pull_request != UNIDENTIFIED

    @property
    def url(self) -> str:
        return "https://github.com/vllm-project/vllm/pull/" + self.number

    @property
    def number(self) -> str:
        return self.pull_request.rpartition("#")[2]

    @property
    def label(self) -> str:
        return f"#{self.number}" if self.identified else f"({self.title[:40]}...)"

    def covers(self, path: str, unit: str) -> bool:
        return any(fnmatch.fnmatchcase(f"{path}::{unit}", p) for p in self.changes)


@dataclass(frozen=True)
class Triage:
    path: Path
    base: str
    through: str
    releases: dict[str, Release]
    watch_files: tuple[str, ...]
    watch_globs: tuple[str, ...]
    entries: tuple[Entry, ...]

    def watched(self, path: str) -> bool:
        return path in self.watch_files or any(
            fnmatch.fnmatchcase(path, glob) for glob in self.watch_globs
        )

    def backports(self) -> dict[str, list[Entry]]:
        """patch file name -> the backported entries it carries, in file order."""
        by_patch: dict[str, list[Entry]] = {}
        for entry in self.entries:
            if entry.decision == "backported":
                for patch in entry.patches:
                    by_patch.setdefault(patch, []).append(entry)
        return by_patch


def _need(table: dict, key: str, kind: type, where: str):
    if key not in table:
        raise TriageError(f"{where}: missing {key!r}")
    value = table[key]
    if not isinstance(value, kind):
        raise TriageError(f"{where}: {key!r} must be a {kind.__name__}, not {value!r}")
    return value


def _strings(table: dict, key: str, where: str, default=None) -> tuple[str, ...]:
    if key not in table and default is not None:
        return default
    value = _need(table, key, list, where)
    if not all(isinstance(item, str) and item for item in value):
        raise TriageError(f"{where}: {key!r} must be a list of non-empty strings")
    return tuple(value)


def _version(table: dict, key: str, where: str) -> str:
    value = _need(table, key, str, where)
    if not VERSION_RE.match(value):
        raise TriageError(f"{where}: {key!r} = {value!r} is not a version like 0.28.0")
    return value


def _entry(raw: object, where: str, triage_releases: dict[str, Release]) -> Entry:
    if not isinstance(raw, dict):
        raise TriageError(f"{where} must be a table")
    pull_request = _need(raw, "pull_request", str, where)
    if pull_request != UNIDENTIFIED and not PR_RE.match(pull_request):
        raise TriageError(
            f"{where}: pull_request {pull_request!r} is not like "
            f"vllm-project/vllm#123 (or {UNIDENTIFIED!r})"
        )
    where = f"{where} ({pull_request})"
    release = _version(raw, "release", where)
    if release not in triage_releases:
        raise TriageError(
            f"{where}: release {release} is not one of the [releases] "
            f"({', '.join(triage_releases)})"
        )
    kind = _need(raw, "kind", str, where)
    if kind not in KINDS:
        raise TriageError(f"{where}: kind {kind!r} is not one of {', '.join(KINDS)}")
    decision = _need(raw, "decision", str, where)
    if decision not in DECISIONS:
        raise TriageError(
            f"{where}: decision {decision!r} is not one of {', '.join(DECISIONS)}"
        )
    patches = _strings(raw, "patches", where, default=())
    if decision == "backported" and not patches:
        raise TriageError(f"{where}: a backported entry names its patches")
    if decision == "backported" and pull_request == UNIDENTIFIED:
        raise TriageError(f"{where}: a backported entry names its pull request")
    if decision != "backported" and patches:
        raise TriageError(f"{where}: only a backported entry names patches")
    reason = raw.get("reason", "")
    if not isinstance(reason, str) or (decision != "backported" and not reason):
        raise TriageError(f"{where}: a {decision} entry says why in 'reason'")
    changes = _strings(raw, "changes", where)
    for change in changes:
        path, sep, unit = change.partition("::")
        if not sep or not path or not unit:
            raise TriageError(
                f"{where}: change {change!r} is not 'path/to/file.py::function'"
            )
    return Entry(
        pull_request=pull_request,
        title=_need(raw, "title", str, where),
        release=release,
        kind=kind,
        decision=decision,
        reason=reason,
        patches=patches,
        changes=changes,
    )


def load_triage(path: Path, series: Series | None = None) -> Triage:
    """Read and check the triage file; ``series`` gives the watched series
    files (default: the series beside the triage file)."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise TriageError(f"no triage file at {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TriageError(f"cannot read {path}: {err}") from None
    except tomllib.TOMLDecodeError as err:
        raise TriageError(f"{path} is not valid TOML: {err}") from None
    where = str(path)
    base = _version(data, "base", where)
    through = _version(data, "triaged_through", where)
    releases: dict[str, Release] = {}
    for version, raw in _need(data, "releases", dict, where).items():
        at = f"{where}: [releases.{version!r}]"
        if not VERSION_RE.match(version) or not isinstance(raw, dict):
            raise TriageError(f"{at} must be a table named by a version")
        digest = _need(raw, "sha256", str, at)
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise TriageError(f"{at}: sha256 is not 64 hex digits")
        releases[version] = Release(version, _need(raw, "file", str, at), digest)
    if through not in releases:
        raise TriageError(f"{where}: triaged_through {through} has no [releases] row")
    watch = _need(data, "watch", dict, where)
    watch_files = _strings(watch, "files", f"{where}: [watch]")
    if watch.get("series_files", False) is True:
        if series is None:
            series = Series(path.parent)
        try:
            watch_files = (*series.pristine_files, *watch_files)
        except (KeyError, SeriesError) as err:
            raise TriageError(
                f"{where}: cannot read the series' files: {err}"
            ) from None
    entries_raw = data.get("entry")
    if not isinstance(entries_raw, list) or not entries_raw:
        raise TriageError(f"{where}: no [[entry]] tables")
    entries = tuple(
        _entry(raw, f"{where}: entry {number}", releases)
        for number, raw in enumerate(entries_raw, 1)
    )
    return Triage(
        path=path,
        base=base,
        through=through,
        releases=releases,
        watch_files=watch_files,
        watch_globs=_strings(watch, "globs", f"{where}: [watch]", default=()),
        entries=entries,
    )


def unlisted_patches(triage: Triage, series: Series) -> list[str]:
    """'PR: patch' for each patch a backported entry names that the series
    does not list (a backport whose patch is missing or misnamed)."""
    try:
        listed = set(series.manifest["patches"])
    except (KeyError, SeriesError) as err:
        raise TriageError(f"cannot read the series' patch list: {err}") from None
    return [
        f"{entry.pull_request}: {patch}"
        for entry in triage.entries
        for patch in entry.patches
        if patch not in listed
    ]


def shipped_triage(series: Series | None = None) -> Triage:
    series = series or Series(default_series_dir())
    return load_triage(series.directory / TRIAGE_NAME, series)


# --- the units of a module -----------------------------------------------------


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body[1:]
    return body


def _digest(nodes: list[ast.AST]) -> str:
    text = "\n".join(ast.dump(node, include_attributes=False) for node in nodes)
    return hashlib.sha256(text.encode()).hexdigest()


def _stripped(node: ast.AST) -> ast.AST:
    """A copy of ``node`` with the docstrings of it and of everything inside
    it removed (a body left empty gets ``pass``, as in the source)."""
    copy = deepcopy(node)
    for inner in ast.walk(copy):
        if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner.body = _without_docstring(inner.body) or [ast.Pass()]
    return copy


@dataclass(frozen=True)
class Unit:
    name: str
    line: int
    digest: str


def _add(units: dict[str, Unit], name: str, line: int, nodes: list[ast.AST]) -> None:
    key, count = name, 1
    while key in units:
        count += 1
        key = f"{name}#{count}"
    units[key] = Unit(key, line, _digest(nodes))


def _class_units(units: dict[str, Unit], node: ast.ClassDef, prefix: str) -> None:
    name = f"{prefix}{node.name}"
    own = []
    for stmt in _without_docstring(node.body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            _add(units, f"{name}.{stmt.name}", stmt.lineno, [_stripped(stmt)])
        elif isinstance(stmt, ast.ClassDef):
            _class_units(units, stmt, f"{name}.")
        else:
            own.append(stmt)
    header = ast.ClassDef(
        name=node.name,
        bases=node.bases,
        keywords=node.keywords,
        decorator_list=node.decorator_list,
        type_params=getattr(node, "type_params", []),
        body=own,
    )
    _add(units, name, node.lineno, [header])


def _assigned_names(stmt: ast.stmt) -> list[str] | None:
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        targets = [stmt.target]
    else:
        return None
    names = [t.id for t in targets if isinstance(t, ast.Name)]
    return names if len(names) == len(targets) else None


def module_units(source: str, path: str = "<source>") -> dict[str, Unit]:
    """The comparable units of one module, by qualified name."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as err:
        raise TriageError(f"{path} is not valid Python: {err}") from None
    units: dict[str, Unit] = {}
    rest: list[ast.stmt] = []
    first_rest = 0
    for stmt in _without_docstring(tree.body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            _add(units, stmt.name, stmt.lineno, [_stripped(stmt)])
        elif isinstance(stmt, ast.ClassDef):
            _class_units(units, stmt, "")
        elif (names := _assigned_names(stmt)) is not None:
            _add(units, ",".join(names), stmt.lineno, [stmt])
        else:
            rest.append(stmt)
            first_rest = first_rest or stmt.lineno
    if rest:
        _add(units, "<module>", first_rest, rest)
    return units


# --- trees and wheels ------------------------------------------------------------


@dataclass
class Tree:
    """The watched Python files of one vLLM release, read from a directory
    or a wheel."""

    label: str
    version: str
    files: dict[str, str]  # path inside the tree -> source
    note: str = ""


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _wheel_version(archive: zipfile.ZipFile, path: Path) -> str:
    try:
        text = archive.read("vllm/_version.py").decode()
    except KeyError:
        text = ""
    match = re.search(
        r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)""", text, re.M
    )
    if match:
        return match.group(1)
    named = WHEEL_RE.match(path.name)
    if named:
        return named.group(1)
    raise TriageError(f"{path} has no vllm/_version.py: not a vLLM wheel")


def read_wheel(path: Path, triage: Triage) -> Tree:
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise TriageError(f"no such file: {path}") from None
    except (zipfile.BadZipFile, OSError) as err:
        raise TriageError(f"{path} is not a wheel (zip): {err}") from None
    with archive:
        version = _wheel_version(archive, path)
        note = "not one of the pinned releases: unverified"
        pinned = triage.releases.get(version)
        if pinned is not None and pinned.file == path.name:
            digest = _sha256_file(path)
            if digest != pinned.sha256:
                raise TriageError(
                    f"{path} has sha256 {digest}, but {triage.path.name} pins "
                    f"{pinned.sha256} for vLLM {version}: refusing it"
                )
            note = "sha256 verified"
        files = {
            name: archive.read(name).decode()
            for name in archive.namelist()
            if name.endswith(".py") and triage.watched(name)
        }
    return Tree(str(path), version, files, note)


def read_directory(path: Path, triage: Triage) -> Tree:
    if not (path / "vllm" / "__init__.py").is_file():
        raise TriageError(
            f"{path} is not a vLLM tree: no vllm/__init__.py in it (pass the "
            "directory that holds vllm/, or a wheel)"
        )
    try:
        version = read_vllm_version(path)
    except Refusal as err:
        raise TriageError(str(err)) from None
    files = {}
    for file in sorted((path / "vllm").rglob("*.py")):
        name = file.relative_to(path).as_posix()
        if "__pycache__" not in name and triage.watched(name):
            files[name] = file.read_text()
    return Tree(str(path), version, files)


def read_tree(path: Path, triage: Triage) -> Tree:
    if path.is_dir():
        return read_directory(path, triage)
    if path.suffix == ".whl":
        return read_wheel(path, triage)
    if not path.exists():
        raise TriageError(f"no such file or directory: {path}")
    raise TriageError(f"{path} is neither a vLLM tree (a directory) nor a wheel")


# --- comparing --------------------------------------------------------------------


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


# --- the command ----------------------------------------------------------------


def render(steps: list[Step], triage: Triage) -> str:
    lines = []
    for step in steps:
        lines.append(
            f"== vLLM {step.old.version} -> {step.new.version} "
            f"({step.new.label}{'; ' + step.new.note if step.new.note else ''})"
        )
        if version_key(step.new.version) > version_key(triage.through):
            lines.append(
                f"   newer than the triage (through {triage.through}): add "
                f"entries for its changes to {triage.path.name}"
            )
        if not step.files:
            lines.append("   no watched unit changed")
        for file in step.files:
            lines.append(f"   {file.status} file {file.path}")
            for change in file.units:
                by = step.covering[change]
                mark = ", ".join(e.label for e in by)
                lines.append(
                    f"     {change.status:8} {change.unit} (line {change.line})  "
                    + (mark if by else "UNCOVERED")
                )
        for entry, pattern in step.stale:
            if step.failing_stale:
                lines.append(
                    f"   STALE {entry.label} ({entry.release}) names {pattern}, "
                    "which did not change in this step"
                )
            else:
                lines.append(
                    f"   note: {entry.label} ({entry.release}) names {pattern}, "
                    f"unchanged across these {step.spans} releases (pass the "
                    "releases between them to check it)"
                )
    uncovered = sum(len(s.uncovered) for s in steps)
    stale = sum(len(s.failing_stale) for s in steps)
    changed = sum(len(s.covering) for s in steps)
    lines.append(
        f"{changed} changed units, {uncovered} uncovered, {stale} stale entry "
        f"names ({triage.path})"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3rocm.patchtool.triage",
        description="What newer vLLM releases change in the watched files, "
        "function by function, and which changes no entry of the upstream "
        "triage covers.",
    )
    parser.add_argument(
        "releases",
        nargs="+",
        type=Path,
        metavar="RELEASE",
        help="a newer vLLM: a directory holding vllm/, or a wheel",
    )
    parser.add_argument(
        "--base",
        type=Path,
        help="the series' vLLM (a directory or a wheel; default: the installed vLLM)",
    )
    parser.add_argument(
        "--triage",
        type=Path,
        help=f"the triage file (default: the series' {TRIAGE_NAME})",
    )
    args = parser.parse_args(argv)
    try:
        series = Series(default_series_dir())
        triage = (
            load_triage(args.triage, series) if args.triage else shipped_triage(series)
        )
        if args.base is None:
            try:
                args.base = find_installed_target()
            except Refusal as err:
                raise TriageError(f"{err} (or pass --base)") from None
        base = read_tree(args.base, triage)
        if base.version != triage.base:
            raise TriageError(
                f"the base {base.label} is vLLM {base.version}; the triage starts "
                f"at {triage.base}"
            )
        steps = triage_chain(
            base, [read_tree(p, triage) for p in args.releases], triage
        )
        unlisted_patches(triage, series)
    except TriageError as err:
        line_logger("triage")(str(err))
        return EXIT_USAGE
    print(render(steps, triage))
    unlisted = unlisted_patches(triage, series)
    for problem in unlisted:
        print(f"backport names a patch the series does not list: {problem}")
    failed = unlisted or any(s.uncovered or s.failing_stale for s in steps)
    return EXIT_UNCOVERED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
