"""A patch series as data: manifest, patch files, identity (one per
release line: k3rocm.patchtool.lines finds them).

Shared by the patch tool, the smoke test and the metrics plugin, so all
three name the series the same way.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

MARKER_NAME = ".k3rocm-patchset.json"
_NEW_FILE_RE = re.compile(r"^\+\+\+ b/(\S+)", re.MULTILINE)


@dataclass(frozen=True)
class Series:
    directory: Path

    @cached_property
    def manifest(self) -> dict:
        path = self.directory / "series.toml"
        try:
            return tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise SeriesError(f"no series manifest at {path}") from None
        except tomllib.TOMLDecodeError as err:
            raise SeriesError(f"{path} is not valid TOML: {err}") from None

    @property
    def revision(self) -> str:
        return self.manifest["revision"]

    @property
    def vllm_version(self) -> str:
        return self.manifest["target"]["vllm_version"]

    @property
    def upstream_since(self) -> str | None:
        """The first vLLM release that makes the whole series unnecessary;
        None while no release does (a line kept for fixes upstream lacks)."""
        return self.manifest["target"].get("upstream_since")

    @property
    def pristine_files(self) -> dict[str, str]:
        """Relative path -> sha256 of each file the series modifies."""
        return dict(self.manifest["target"]["files"])

    @cached_property
    def patches(self) -> list[Path]:
        paths = [self.directory / name for name in self.manifest["patches"]]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise SeriesError(f"series lists missing patch files: {missing}")
        return paths

    @cached_property
    def touched_files(self) -> list[str]:
        """Every path the series writes, in first-touched order."""
        seen: dict[str, None] = {}
        for patch in self.patches:
            for path in _NEW_FILE_RE.findall(patch.read_text()):
                seen.setdefault(path, None)
        return list(seen)

    @property
    def created_files(self) -> list[str]:
        return [p for p in self.touched_files if p not in self.pristine_files]

    @cached_property
    def sha256(self) -> str:
        """Hash of the manifest and every patch, in series order."""
        digest = hashlib.sha256()
        for path in [self.directory / "series.toml", *self.patches]:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return digest.hexdigest()

    @property
    def series_id(self) -> str:
        """What the marker, the smoke test and the metrics report."""
        return f"{self.revision}+{self.sha256[:12]}"


class SeriesError(Exception):
    """The series itself is unusable (missing or malformed files)."""
