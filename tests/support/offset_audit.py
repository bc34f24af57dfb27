"""A source audit of Triton kernels for 32-bit pointer-offset products.

Triton computes with the type of its operands: program ids and the
`.to(tl.int32)` loads of cu_seqlens are 32-bit, so `(bos * H + i_h) * K`
wraps past 2**31 before it reaches the 64-bit pointer. The audit walks every
@triton.jit function of a source file and reports each product inside an
offset added to a pointer that is computed from a run-time index (a program
id, or a value the kernel loads) while neither operand is 64-bit yet.

What counts as what (read off the source, no execution):
- pointers: the names a kernel hands to tl.load / tl.store /
  tl.make_block_ptr or to a tensor descriptor (`make_tensor_descriptor`,
  vLLM 0.32.0's kernels; the leftmost name of that argument), and the names
  assigned from an expression that starts with a pointer;
- run-time indices: names assigned from an expression holding
  `tl.program_id` or `tl.load`, or another such name, except a remainder
  (`i_nh % H` is below H, a head or tile count);
- 64-bit: `x.to(tl.int64)`, a name last assigned a 64-bit expression, and
  any arithmetic with a 64-bit operand.
A product with a small literal (`i_t * 2`) passes: the index it scales
counts chunks or sequences, far below 2**31 / 64.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

_POINTER_USERS = {"load", "store", "make_block_ptr", "atomic_add"}
# vLLM 0.32.0's kernels import it from their utils and call it by name.
_DESCRIPTOR = "make_tensor_descriptor"
_SMALL_LITERAL = 64


@dataclass(frozen=True)
class Finding:
    kernel: str
    line: int
    product: str

    def __str__(self) -> str:
        return f"{self.kernel}:{self.line}: {self.product}"


def _is_tl_call(node: ast.AST, names: set[str]) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in names
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "tl"
    )


def _takes_a_pointer(node: ast.AST) -> bool:
    """A call whose first argument is a pointer: tl's pointer users, or a
    tensor descriptor, however it is named (tl.…, or imported)."""
    if _is_tl_call(node, _POINTER_USERS | {_DESCRIPTOR}):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == _DESCRIPTOR
    )


def _leftmost_name(node: ast.AST) -> str | None:
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.BinOp):
            node = node.left
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return None


def _is_jit(fn: ast.FunctionDef) -> bool:
    for decorator in fn.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


class _Kernel:
    def __init__(self, fn: ast.FunctionDef, bounded: frozenset[str]):
        self.fn = fn
        self.bounded = bounded
        self.pointers = self._pointers()
        self.wide: set[str] = set()
        self.indices: set[str] = set()

    def _pointers(self) -> set[str]:
        pointers = set()
        for node in ast.walk(self.fn):
            if _takes_a_pointer(node) and node.args:
                name = _leftmost_name(node.args[0])
                if name:
                    pointers.add(name)
        # A name assigned from a pointer expression is a pointer, and so is
        # the first name of an expression assigned to a pointer.
        assignments = [
            pair for node in _statements_in_order(self.fn) for pair in _targets(node)
        ]
        grew = True
        while grew:
            grew = False
            for names, value in assignments:
                first = _leftmost_name(value)
                linked = {first, *names}
                if first and linked & pointers and not linked <= pointers:
                    pointers |= linked
                    grew = True
        return pointers

    def is_wide(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "to":
                arg = node.args[0] if node.args else None
                return isinstance(arg, ast.Attribute) and arg.attr == "int64"
            # min, max, tl.minimum, tl.maximum: as wide as their widest.
            return any(self.is_wide(arg) for arg in node.args)
        if isinstance(node, ast.Name):
            return node.id in self.wide
        if isinstance(node, ast.BinOp):
            return self.is_wide(node.left) or self.is_wide(node.right)
        if isinstance(node, ast.Subscript):
            return self.is_wide(node.value)
        return False

    def is_index(self, node: ast.AST) -> bool:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return False
        for sub in ast.walk(node):
            if _is_tl_call(sub, {"program_id", "load"}):
                return True
            if (
                isinstance(sub, ast.Name)
                and sub.id in self.indices
                and sub.id not in self.bounded
            ):
                return True
        return False

    def _small_literal(self, node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int)
            and abs(node.value) <= _SMALL_LITERAL
        )

    def _check_offset(self, offset: ast.AST, findings: list[Finding]) -> None:
        for sub in ast.walk(offset):
            if not (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mult)):
                continue
            if self.is_wide(sub.left) or self.is_wide(sub.right):
                continue
            if self._small_literal(sub.left) or self._small_literal(sub.right):
                continue
            if self.is_index(sub):
                findings.append(Finding(self.fn.name, sub.lineno, ast.unparse(sub)))

    def audit(self) -> list[Finding]:
        findings: list[Finding] = []
        for node in _statements_in_order(self.fn):
            for names, value in _targets(node):
                for name in names:
                    self.wide.discard(name)
                    self.indices.discard(name)
                    if self.is_wide(value):
                        self.wide.add(name)
                    if self.is_index(value):
                        self.indices.add(name)
            for sub in _own_expressions(node):
                for expr in ast.walk(sub):
                    if (
                        isinstance(expr, ast.BinOp)
                        and isinstance(expr.op, (ast.Add, ast.Sub))
                        and _leftmost_name(expr.left) in self.pointers
                    ):
                        self._check_offset(expr.right, findings)
            if (
                isinstance(node, ast.AugAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id in self.pointers
            ):
                self._check_offset(node.value, findings)
        return sorted(set(findings), key=lambda f: (f.line, f.product))


def _statements_in_order(fn: ast.FunctionDef) -> list[ast.stmt]:
    """Every statement of the body, nested ones included, in source order
    (an else branch's assignment comes after its if branch's)."""
    found = [n for n in ast.walk(fn) if isinstance(n, ast.stmt) and n is not fn]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _targets(node: ast.stmt) -> list[tuple[list[str], ast.AST]]:
    if isinstance(node, ast.Assign):
        pairs = []
        for target in node.targets:
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs += [
                    ([t.id], v)
                    for t, v in zip(target.elts, node.value.elts, strict=True)
                    if isinstance(t, ast.Name)
                ]
            elif isinstance(target, ast.Name):
                pairs.append(([target.id], node.value))
        return pairs
    if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
        return [
            ([node.target.id], ast.BinOp(ast.Name(node.target.id), node.op, node.value))
        ]
    if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
        return [([node.target.id], node.iter)]
    return []


def _own_expressions(node: ast.stmt) -> list[ast.AST]:
    """The expressions of a statement itself, not of statements nested in it."""
    if isinstance(node, (ast.If, ast.While)):
        return [node.test]
    if isinstance(node, ast.For):
        return [node.iter]
    if isinstance(node, (ast.FunctionDef, ast.With)):
        return []
    return [node]


def audit_source(
    source: str, bounded: dict[str, frozenset[str]] | None = None
) -> list[Finding]:
    """Every unguarded 32-bit offset product of the file's Triton kernels.
    ``bounded`` names, per kernel, the run-time indices whose products stay
    below 2**31 by construction (a head, an in-head tile, a sequence, a
    token within its sequence: see the caller for each reason)."""
    bounded = bounded or {}
    findings: list[Finding] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and _is_jit(node):
            findings += _Kernel(node, bounded.get(node.name, frozenset())).audit()
    return findings
