"""The vLLM releases' names live in k3rocm.common.vllm_release alone: one
entry per release line (patches/, read here without vLLM), the installed
one the target, and no other module spells one of its names again. The names
themselves are checked against the real vLLM where vLLM runs (the routes
by test_api_access's walk, the flags by the launcher's goldens parsed by
`vllm serve`'s parser, the titles by the compose stall tests)."""

from __future__ import annotations

import ast
import importlib.metadata
import tomllib
from dataclasses import fields, is_dataclass
from pathlib import Path

from k3rocm.common.vllm_release import (
    DEFAULT_VERSION,
    RELEASES,
    TARGET,
    TARGET_VERSION,
    installed_vllm_version,
)

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "k3rocm"


def test_every_line_has_its_release_and_the_default_is_the_default_line():
    lines = tomllib.loads((REPO / "patches" / "lines.toml").read_text())
    assert DEFAULT_VERSION == lines["default"]
    versions = {p.parent.name for p in (REPO / "patches").glob("*/series.toml")}
    assert set(RELEASES) == versions
    for version in versions:
        manifest = REPO / "patches" / version / "series.toml"
        assert tomllib.loads(manifest.read_text())["target"]["vllm_version"] == version
    assert all(release.version == version for version, release in RELEASES.items())


def test_the_target_is_the_installed_release_else_the_default(monkeypatch):
    """TARGET follows the installed vLLM (this environment's, if any)."""
    assert TARGET.version == TARGET_VERSION
    installed = installed_vllm_version()
    assert TARGET_VERSION == (installed if installed in RELEASES else DEFAULT_VERSION)

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert installed_vllm_version() is None


def _strings(value: object) -> set[str]:
    """Every string inside a release's value (flag tables, flags, tuples)."""
    if isinstance(value, str):
        return {value}
    if is_dataclass(value):
        parts = [getattr(value, field.name) for field in fields(value)]
    else:
        parts = list(value)  # a tuple or set of names
    return set().union(*map(_strings, parts))


def _names() -> set[str]:
    # /health and /metrics are also the paths of our own servers (the status
    # server, Prometheus' convention): read everywhere, left out here.
    return _strings(TARGET) - {TARGET.version} - TARGET.open_paths


def test_the_names_include_every_flag_of_the_flag_tables():
    """The walk reaches the flags (a planted second copy of one is caught)."""
    names = _names()
    assert {"--host", "-tp", "--headless", "--result-filename"} <= names
    assert TARGET.serve.node_rank.spellings == ("--node-rank", "-r")
    assert TARGET.serve.max_num_batched_tokens.dest == "max_num_batched_tokens"


def _literals(path: Path) -> list[str]:
    """The module's string constants, less the option names of its own
    command lines (add_argument's first arguments: our CLIs may share a
    spelling with vLLM's, e.g. --seed)."""
    tree = ast.parse(path.read_text())
    own_options = {
        id(arg)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
        for arg in node.args
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in own_options
    ]


def test_no_other_module_spells_a_name_of_the_release():
    """A second copy would stay behind when the series moves on. The kernels
    ship inside vLLM (patches) and name nothing of ours."""
    names = _names()
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "vllm_release.py" or path.parent.name == "kernels":
            continue
        for literal in _literals(path):
            if literal in names:
                offenders.append(f"{path.relative_to(REPO)}: {literal}")
    assert not offenders, offenders
