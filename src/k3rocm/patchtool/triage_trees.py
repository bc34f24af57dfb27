"""The watched Python files of one vLLM release, read from a source tree
(the directory that holds ``vllm/``) or from a wheel; a wheel of a release
the triage pins must have the pinned sha256.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.patching import read_vllm_version
from k3rocm.patchtool.triage_file import Triage, TriageError

WHEEL_RE = re.compile(r"^vllm(?:_cpu)?-([0-9]+\.[0-9]+\.[0-9]+)-[^/]*\.whl$")


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
