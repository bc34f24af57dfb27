"""The package's architecture, enforced: k3rocm.common is the floor every
wing stands on and imports no wing; a wing imports only the wings it is
declared to build on; nothing imports an entry module (``__main__``); the
top level holds only packages. An AST walk of the sources, so it needs
nothing installed; it is shown to fail on a planted upward import."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from support.vllm_trees import REPO

PACKAGE = REPO / "src" / "k3rocm"
# What each wing may import besides itself (README, "Where things live").
ALLOWED = {
    "common": set(),
    "kernels": set(),  # shipped inside vLLM by the patches: nothing of ours
    "cli": set(),  # names modules, imports none
    "patchtool": {"common"},
    "supply_chain": {"common", "patchtool"},
    "plugin": {"common", "patchtool", "supply_chain"},
    "launcher": {"common", "patchtool"},
    "smoke": {"common", "patchtool"},
    "container": {"common", "launcher"},
    "monitoring": {"common"},
    "accept": {"common"},
    "tryout": {"common", "patchtool", "supply_chain"},
}


def imported_modules(path: Path) -> list[str]:
    """The k3rocm modules a file imports (anywhere in it, lazily too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "k3rocm":
                found += [f"k3rocm.{alias.name}" for alias in node.names]
            elif node.module.startswith("k3rocm."):
                found.append(node.module)
                found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("k3rocm.")]
    return found


def violations(package: Path) -> list[str]:
    found = []
    for entry in package.iterdir():
        if entry.is_file() and entry.suffix == ".py" and entry.name != "__init__.py":
            found.append(f"{entry.name}: a module at the top level (put it in a wing)")
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if len(relative.parts) < 2:
            continue
        wing = relative.parts[0]
        if wing not in ALLOWED:
            found.append(f"{relative}: wing {wing!r} is not declared in ALLOWED")
            continue
        for module in imported_modules(path):
            parts = module.split(".")
            if parts[-1] == "__main__":
                found.append(f"{relative}: imports the entry module {module}")
            target = parts[1]
            target_is_package = (package / target).is_dir()
            if target_is_package and target != wing and target not in ALLOWED[wing]:
                found.append(f"{relative}: {wing} imports {module}")
    return found


def test_every_wing_imports_only_what_it_builds_on():
    assert violations(PACKAGE) == []


def test_a_planted_upward_import_is_caught(tmp_path):
    copy = tmp_path / "k3rocm"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "common" / "planted.py").write_text(
        "from k3rocm.container.guard import log\n"
    )
    (copy / "smoke" / "planted.py").write_text("import k3rocm.launcher.__main__\n")
    (copy / "loose.py").write_text("")
    assert violations(copy) == [
        "loose.py: a module at the top level (put it in a wing)",
        "common/planted.py: common imports k3rocm.container.guard",
        "common/planted.py: common imports k3rocm.container.guard.log",
        "smoke/planted.py: imports the entry module k3rocm.launcher.__main__",
        "smoke/planted.py: smoke imports k3rocm.launcher.__main__",
    ]
