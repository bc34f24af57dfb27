"""The ROCm release an install declares, read from its version file.

Shared by the image build steps (k3rocm.supply_chain.image) and the metrics plugin
(k3rocm.plugin.build_info), so neither imports the other.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_ROCM_ROOT = Path("/opt/rocm")


class RocmVersionError(Exception):
    """The ROCm version file is missing or unreadable."""


def read_rocm_version(rocm_root: Path) -> str:
    version_file = rocm_root / ".info" / "version"
    try:
        # Bytes as they are: no newline translation inside the version.
        return version_file.read_bytes().decode("utf-8").strip()
    # A binary or non-UTF-8 file is as unreadable as a missing one.
    except (OSError, UnicodeDecodeError) as err:
        raise RocmVersionError(
            f"cannot read the ROCm version from {version_file} ({err}); the base "
            "image is not a ROCm image"
        ) from None
