"""Every module, command and file the operator-facing texts name exists:
README, docs/, the compose files, supervisord.conf and the Dockerfile. A
name left behind by a move fails here (module paths are checked against the
sources, attributes against the module's top-level names, so nothing is
imported)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest
from support.vllm_trees import REPO

from k3rocm.cli.commands import BY_NAME

SRC = REPO / "src"
TEXTS = sorted(
    [
        REPO / "README.md",
        *(REPO / "docs").glob("*.md"),
        *REPO.glob("compose*.yaml"),
        REPO / "docker" / "supervisord.conf",
        REPO / "docker" / "Dockerfile",
    ]
)
# Dashes allowed, so that a label such as k3rocm.patch-series is read whole
# (and left out: no module has a dash).
DOTTED = re.compile(r"\bk3rocm(?:\.[A-Za-z_][\w-]*)+")
COMMAND = re.compile(r"`k3rocm ([a-z][a-z-]*)")
FILE = re.compile(
    r"(?<![\w/.-])((?:docs|scripts|tests|src|patches|monitoring|deploy|docker|"
    r"benchmarks|requirements)/[\w./*-]*[\w*])"
)


def image_labels() -> set[str]:
    """The image's label keys (`k3rocm.sbom`, ...): names, not modules."""
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    return set(re.findall(r"\b(k3rocm\.[\w.-]+)=", dockerfile))


@cache
def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def module_file(parts: list[str]) -> Path | None:
    base = SRC.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def dotted_problem(name: str) -> str | None:
    """None where ``name`` is a module, or a module and a top-level name of
    it (a class's attribute beyond that is not checked)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(parts[:cut])
        if path is None:
            continue
        rest = parts[cut:]
        if not rest or rest[0] in top_level_names(path):
            return None
        return f"{'.'.join(parts[:cut])} has no {rest[0]}"
    return "no such module"


def named(pattern: re.Pattern, text: str) -> set[str]:
    return {m.group(1) if m.groups() else m.group(0) for m in pattern.finditer(text)}


@pytest.mark.parametrize("text", TEXTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_module_command_and_file_named_exists(text):
    content = text.read_text()
    labels = image_labels()
    problems = [
        f"{name}: {why}"
        for name in sorted(named(DOTTED, content) - labels)
        if "-" not in name and (why := dotted_problem(name))
    ]
    problems += [
        f"k3rocm {name}: no such command"
        for name in sorted(named(COMMAND, content))
        if name not in BY_NAME
    ]
    problems += [
        f"{name}: no such file"
        for name in sorted(named(FILE, content))
        if not (REPO / name).exists()
        # Globs and placeholders (overlays/NAME) name no one file.
        and not any(c in name for c in "*<>")
        and not any(part.isupper() for part in name.split("/"))
    ]
    assert not problems, f"{text.relative_to(REPO)} names: {problems}"
