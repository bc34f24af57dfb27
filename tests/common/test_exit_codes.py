"""The container's exit codes have one home (k3rocm.common.exit_codes):
README's table is generated from it, and the modules that exit with them
spell no code as a number."""

from __future__ import annotations

import ast

import pytest
from support.vllm_trees import REPO

from k3rocm.common.exit_codes import MEANINGS, ExitCode, exit_codes_table

# The modules whose exit status is the container's (or the launcher's).
EXITING = [
    "src/k3rocm/container/guard.py",
    "src/k3rocm/container/supervise.py",
    "src/k3rocm/container/watchdog.py",
    "src/k3rocm/launcher/__main__.py",
]


def test_readmes_table_is_the_enum():
    assert exit_codes_table() in (REPO / "README.md").read_text(), (
        "README's exit code table is stale: paste "
        "k3rocm.common.exit_codes.exit_codes_table()"
    )


def test_every_code_the_container_exits_with_has_a_meaning():
    assert set(MEANINGS) == set(ExitCode) - {ExitCode.NOT_FOUND}


@pytest.mark.parametrize("path", EXITING)
def test_no_module_spells_an_exit_code_as_a_number(path):
    """`return 3`, `sys.exit(4)`, `(5, reason)`: each would be a second home
    of a code. 0 stays a plain success."""
    codes = {int(code) for code in ExitCode} - {0}
    tree = ast.parse((REPO / path).read_text())
    spelled = []
    for node in ast.walk(tree):
        value = getattr(node, "value", None)
        if isinstance(node, ast.Return) and isinstance(value, ast.Constant):
            spelled += [value.value] if value.value in codes else []
        if isinstance(node, ast.Return) and isinstance(value, ast.Tuple):
            first = value.elts[0] if value.elts else None
            if isinstance(first, ast.Constant) and first.value in codes:
                spelled.append(first.value)
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "exit"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in codes
        ):
            spelled.append(node.args[0].value)
    assert not spelled, f"{path} spells exit codes {spelled}: use ExitCode"
