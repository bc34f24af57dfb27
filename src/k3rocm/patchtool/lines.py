"""The release lines: one patch series per vLLM release, in
``patches/<vLLM version>/``; ``patches/lines.toml`` names the default line.

Shared by the patch tool (which picks the line of the tree it patches), the
image build, the smoke test and the SBOM, so that all of them find a line
the same way.
"""

from __future__ import annotations

import re
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path

from k3rocm.common.vllm_release import installed_vllm_version
from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.series import Series, SeriesError

LINES_FILE = "lines.toml"


def version_key(version: str) -> tuple[int, ...]:
    """A vLLM version as numbers to compare (local parts such as +cpu cut)."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def patches_root() -> Path:
    """The lines shipped with this package (wheel) or this checkout (editable)."""
    packaged = Path(str(resources.files("k3rocm"))) / "patches"
    if (packaged / LINES_FILE).is_file():
        return packaged
    return Path(__file__).resolve().parents[3] / "patches"


def line_versions(root: Path | None = None) -> list[str]:
    """The vLLM versions there is a line for, oldest first."""
    root = root or patches_root()
    found = [p.name for p in root.iterdir() if (p / "series.toml").is_file()]
    return sorted(found, key=version_key)


def line_series(version: str, root: Path | None = None) -> Series | None:
    """The series of the line for vLLM ``version``, if there is one."""
    root = root or patches_root()
    return Series(root / version) if version in line_versions(root) else None


def line_for_version(version: str, root: Path | None = None) -> Series:
    """The series `k3rocm patch` applies to a tree of vLLM ``version``: its
    line's. A version no line is for is refused, naming the lines there are,
    unless it already carries the upstream change: then the default line's
    (whose inspection reports that, exit 3)."""
    root = root or patches_root()
    series = line_series(version, root)
    if series is not None:
        return series
    default = Series(default_line_dir(root))
    since = default.upstream_since
    if since is not None and version_key(version) >= version_key(since):
        return default
    raise Refusal(
        f"found vLLM {version}; this k3rocm has release lines for vLLM "
        f"{', '.join(line_versions(root))} only. Install one of those (or use a "
        "base image that has it)."
    )


def default_line_dir(root: Path | None = None) -> Path:
    """The folder of the line a build takes when nothing names one."""
    root = root or patches_root()
    path = root / LINES_FILE
    try:
        default = tomllib.loads(path.read_text())["default"]
    except (OSError, tomllib.TOMLDecodeError, KeyError) as err:
        raise SeriesError(f"{path} does not name a default line ({err})") from None
    if not isinstance(default, str):
        raise SeriesError(
            f"{path} does not name a default line (default = {default!r}: "
            'write the version as a string, e.g. default = "0.27.1")'
        )
    if default not in line_versions(root):
        raise SeriesError(f"{path} names {default!r}, which has no series there")
    return root / default


def installed_line_dir(root: Path | None = None) -> Path:
    """The folder of the line of the installed vLLM: what an image of that
    line was patched with, what its smoke test and metrics report. The default
    line where no vLLM is installed (an operator's host printing a launch
    command) or none of the lines is for the installed one."""
    root = root or patches_root()
    version = installed_vllm_version()
    if version is not None:
        series = line_series(version, root)
        if series is not None:
            return series.directory
    return default_line_dir(root)


@cache
def shipped_series() -> Series:
    """The series of the installed vLLM's line: its vLLM version is the one
    the launcher's, the try-out's and the image's messages name."""
    return Series(installed_line_dir())
