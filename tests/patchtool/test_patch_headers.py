"""Every patch of the series says, in its header, why it exists, what
upstream carries of it, and when to drop it (vllm-ascend's patch/__init__.py
is the model)."""

import re

import pytest
from support.vllm_trees import REPO

from k3rocm.patchtool.lines import line_versions
from k3rocm.patchtool.series import Series


@pytest.mark.parametrize("line", line_versions(REPO / "patches"))
def test_every_patch_says_what_it_carries_from_upstream_and_when_to_drop_it(line):
    """Each header has its Subject, its Upstream (the pull request, or none)
    and its Drop line (the release that carries it, or the condition); a
    release named there is later than the series' target, or the patch
    would already be due to go."""
    series = Series(REPO / "patches" / line)
    target = tuple(int(part) for part in series.vllm_version.split("."))
    for patch in series.patches:
        text = patch.read_text()
        header = text[: min(text.find("\ndiff "), text.find("\n--- "))]
        for field in ("Subject", "Upstream", "Drop"):
            lines = [
                line for line in header.splitlines() if line.startswith(field + ": ")
            ]
            assert len(lines) == 1, (patch.name, field)
        drop = header[header.index("\nDrop: ") :].split("\n\n")[0]
        for version in re.findall(r"vLLM (\d+)\.(\d+)\.(\d+) or later", drop):
            assert tuple(map(int, version)) > target, (patch.name, drop)
