"""The target vLLM release's names live in k3rocm.common.vllm_release alone:
its version is the series' target (patches/series.toml, read here without
vLLM), and no other module spells one of its names again. The names
themselves are checked against the real vLLM where vLLM runs (the routes
by test_api_access's walk, the flags by the launcher's goldens parsed by
`vllm serve`'s parser, the titles by the compose stall tests)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path

from k3rocm.common.vllm_release import RELEASES, TARGET, TARGET_VERSION

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "k3rocm"


def test_the_target_is_the_series_target():
    manifest = tomllib.loads((REPO / "patches" / "series.toml").read_text())
    assert TARGET_VERSION == manifest["target"]["vllm_version"]
    assert TARGET.version == TARGET_VERSION
    assert all(release.version == version for version, release in RELEASES.items())


def _names() -> set[str]:
    names: set[str] = set()
    for field in fields(TARGET):
        value = getattr(TARGET, field.name)
        names |= {value} if isinstance(value, str) else set(value)
    # /health and /metrics are also the paths of our own servers (the status
    # server, Prometheus' convention): read everywhere, left out here.
    return names - {TARGET.version} - TARGET.open_paths


def test_no_other_module_spells_a_name_of_the_release():
    """A second copy would stay behind when the series moves on. The kernels
    ship inside vLLM (patches) and name nothing of ours."""
    names = _names()
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "vllm_release.py" or path.parent.name == "kernels":
            continue
        for literal in re.findall(r"""["']([^"'\n]+)["']""", path.read_text()):
            if literal in names:
                offenders.append(f"{path.relative_to(REPO)}: {literal}")
    assert not offenders, offenders
