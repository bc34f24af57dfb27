"""The upstream triage file (``patches/0.27.1/upstream-triage.toml``), read and
checked: the pinned releases, the watched files and one entry per upstream
change to them (its pull request, first release, kind, the units it changes
and the decision). The triage command checks release diffs against it; the
SBOM reads the series' backports from it.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from k3rocm.patchtool.lines import installed_line_dir
from k3rocm.patchtool.series import Series, SeriesError

TRIAGE_NAME = "upstream-triage.toml"
KINDS = ("fix", "performance", "feature", "refactor")
DECISIONS = ("backported", "not-applicable", "not-carried")
PR_RE = re.compile(r"^vllm-project/vllm#[1-9][0-9]*$")
UNIDENTIFIED = "unidentified"  # the release diff shows it; no pull request found
VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


class TriageError(Exception):
    """Bad input: a triage file, a tree or a wheel that cannot be used."""


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


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
    series = series or Series(installed_line_dir())
    return load_triage(series.directory / TRIAGE_NAME, series)
