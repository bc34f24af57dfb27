"""The comparable units of one Python module, each with a digest of its
syntax tree (docstrings left out), so that two releases of a file compare
function by function: every top-level function, every method of a
top-level class (``Class.method``), each class's own body (``Class``), each
top-level assignment (by the names it binds) and the rest of the module
(``<module>``).
"""

from __future__ import annotations

import ast
import hashlib
from copy import deepcopy
from dataclasses import dataclass

from k3rocm.patchtool.triage_file import TriageError


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body[1:]
    return body


def _digest(nodes: list[ast.AST]) -> str:
    text = "\n".join(ast.dump(node, include_attributes=False) for node in nodes)
    return hashlib.sha256(text.encode()).hexdigest()


def _stripped(node: ast.AST) -> ast.AST:
    """A copy of ``node`` with the docstrings of it and of everything inside
    it removed (a body left empty gets ``pass``, as in the source)."""
    copy = deepcopy(node)
    for inner in ast.walk(copy):
        if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner.body = _without_docstring(inner.body) or [ast.Pass()]
    return copy


@dataclass(frozen=True)
class Unit:
    name: str
    line: int
    digest: str


def _add(units: dict[str, Unit], name: str, line: int, nodes: list[ast.AST]) -> None:
    key, count = name, 1
    while key in units:
        count += 1
        key = f"{name}#{count}"
    units[key] = Unit(key, line, _digest(nodes))


def _class_units(units: dict[str, Unit], node: ast.ClassDef, prefix: str) -> None:
    name = f"{prefix}{node.name}"
    own = []
    for stmt in _without_docstring(node.body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            _add(units, f"{name}.{stmt.name}", stmt.lineno, [_stripped(stmt)])
        elif isinstance(stmt, ast.ClassDef):
            _class_units(units, stmt, f"{name}.")
        else:
            own.append(stmt)
    header = ast.ClassDef(
        name=node.name,
        bases=node.bases,
        keywords=node.keywords,
        decorator_list=node.decorator_list,
        type_params=getattr(node, "type_params", []),
        body=own,
    )
    _add(units, name, node.lineno, [header])


def _assigned_names(stmt: ast.stmt) -> list[str] | None:
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        targets = [stmt.target]
    else:
        return None
    names = [t.id for t in targets if isinstance(t, ast.Name)]
    return names if len(names) == len(targets) else None


def module_units(source: str, path: str = "<source>") -> dict[str, Unit]:
    """The comparable units of one module, by qualified name."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as err:
        raise TriageError(f"{path} is not valid Python: {err}") from None
    units: dict[str, Unit] = {}
    rest: list[ast.stmt] = []
    first_rest = 0
    for stmt in _without_docstring(tree.body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            _add(units, stmt.name, stmt.lineno, [_stripped(stmt)])
        elif isinstance(stmt, ast.ClassDef):
            _class_units(units, stmt, "")
        elif (names := _assigned_names(stmt)) is not None:
            _add(units, ",".join(names), stmt.lineno, [stmt])
        else:
            rest.append(stmt)
            first_rest = first_rest or stmt.lineno
    if rest:
        _add(units, "<module>", first_rest, rest)
    return units
