"""The module paths operators type (README) and older images bake in still
work after the modules moved into subpackages (k3rocm.aliases): each alias
behaves as the module it names, compared run for run."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from k3rocm.aliases import MOVED

RUNNABLE = ["k3rocm.patchset", "k3rocm.patchgen", "k3rocm.supervise"]


def run(module: str, *args: str, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize("alias", RUNNABLE)
def test_an_alias_runs_the_moved_module(alias):
    via_alias, direct = run(alias, "--help"), run(MOVED[alias], "--help")
    assert via_alias.returncode == direct.returncode == 0, via_alias.stderr
    # The usage line may name either path.
    assert via_alias.stdout.replace(MOVED[alias], alias) == direct.stdout.replace(
        MOVED[alias], alias
    )


def test_the_health_alias_answers_as_the_health_check(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "K3_RUN_DIR": str(tmp_path)}
    for ready in (None, "pass\n"):
        if ready:
            (tmp_path / "ready").write_text(ready)
        via_alias = run("k3rocm.health", env=env)
        direct = run(MOVED["k3rocm.health"], env=env)
        assert (via_alias.returncode, via_alias.stdout) == (
            direct.returncode,
            direct.stdout,
        )


def test_the_middleware_path_of_earlier_launch_commands_imports():
    alias = importlib.import_module("k3rocm.drain")
    moved = importlib.import_module(MOVED["k3rocm.drain"])
    assert alias.DrainMiddleware is moved.DrainMiddleware


def test_every_alias_module_exists():
    for alias in MOVED:
        assert importlib.util.find_spec(alias), alias
