"""The `k3rocm` command (k3rocm.cli): every entry module of the package is
registered, docs/commands.md is the registry's table, and the installed
console script runs each command as `python -m` does, exit status and all."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.vllm_trees import REPO

from k3rocm.cli.commands import BY_NAME, COMMANDS, commands_table

SRC = REPO / "src"
K3ROCM = shutil.which("k3rocm", path=str(Path(sys.executable).parent))
# The interpreter the script runs under (its shebang): the launcher's dry run
# prints it.
SCRIPT_PYTHON = Path(K3ROCM).read_text().splitlines()[0].removeprefix("#!")


def entry_modules() -> set[str]:
    """Modules with a `__main__` block, and packages with a __main__.py,
    as `python -m` names them."""
    found = set()
    for path in (SRC / "k3rocm").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__main__":
            found.add(".".join(parts[:-1]))
            continue
        tree = ast.parse(path.read_text())
        if any(
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and getattr(node.test.left, "id", None) == "__name__"
            for node in tree.body
        ):
            found.add(".".join(parts))
    return found


def test_every_entry_module_is_a_registered_command():
    registered = {command.module for command in COMMANDS}
    assert entry_modules() == registered
    assert len(BY_NAME) == len(COMMANDS)


def test_the_docs_table_is_the_registry():
    assert commands_table() in (REPO / "docs" / "commands.md").read_text(), (
        "docs/commands.md is stale: paste k3rocm.cli.commands.commands_table()"
    )


def run(*command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, **kwargs
    )


def test_help_lists_every_command_and_an_unknown_one_is_one_line():
    assert K3ROCM, "the venv has no k3rocm script (pip install -e .)"
    listing = run(K3ROCM, "--help")
    assert listing.returncode == 0
    for command in COMMANDS:
        assert f"  {command.name} " in listing.stdout, command.name
    unknown = run(K3ROCM, "no-such")
    assert unknown.returncode == 2
    assert unknown.stderr.splitlines() == [
        "k3rocm: no command 'no-such'; `k3rocm --help` lists them"
    ]


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        # A dry run that prints the command, and one the launcher refuses (2).
        (
            ["launch", "--dry-run", "--profile", "cpu-dev", "--model", "MODEL"],
            0,
            "--served-model-name",
        ),
        (["launch", "--dry-run", "--profile", "no-such"], 2, ""),
        # A module run with a leading subcommand, and a generator.
        (["ctl", "--help"], 0, "Usage:"),
        (["settings"], 0, "K3_PROFILE"),
    ],
)
def test_a_command_is_its_module(args, code, says, tmp_path):
    """Same output and exit status as `python -m MODULE` with the same
    arguments, and the status and output each case is known for (both
    failing alike does not pass)."""
    command = BY_NAME[args[0]]
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    args = [str(model) if arg == "MODEL" else arg for arg in args]
    env = {**os.environ, "K3_RUN_DIR": str(tmp_path)}
    through_script = run(K3ROCM, *args, env=env)
    through_module = run(
        SCRIPT_PYTHON, "-m", command.module, *command.leading, *args[1:], env=env
    )
    assert through_script.returncode == through_module.returncode == code
    assert through_script.stdout == through_module.stdout
    assert says in through_script.stdout
