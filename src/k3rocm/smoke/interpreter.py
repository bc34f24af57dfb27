"""What vLLM's vendored AMD KDA Triton kernels (0.27.1's, 0.32.0's) need to
run in the Triton interpreter (``TRITON_INTERPRET=1``: the CPU development profile and
the tests), set for the duration of a ``with`` block and restored after.

None of it changes what a kernel computes:

- an autotuned kernel tries only its first configuration (the interpreter
  has no device timer to choose among them);
- vLLM's fla module-level aliases of Triton builtins (``exp2 = tl.exp2`` at
  import) are looked up at call time, where the interpreter has put its own
  versions in ``tl``;
- ``range`` inside a kernel yields Triton scalars, as compiled loops do (one
  kernel calls ``i_t.to(...)`` on its loop variable);
- the sub-chunk kernel takes its plain-load branch instead of ``tl.gather``,
  which the interpreter lacks.
"""

from __future__ import annotations

import builtins
import importlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

_MISSING = object()

# The modules of the Triton kernels a chunk KDA call and the recurrent
# decodes run, in every release there is a line for (0.27.1 reaches them
# through its precompiled launches, 0.32.0 through Triton's dispatcher).
KDA_KERNEL_MODULES = (
    "vllm.models.kimi_k3.amd.ops.third_party.kda.chunk",
    "vllm.models.kimi_k3.amd.ops.third_party.kda.chunk_intra",
    "vllm.models.kimi_k3.amd.ops.third_party.kda.chunk_intra_token_parallel",
    "vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent",
    "vllm.third_party.flash_linear_attention.ops.l2norm",
    "vllm.third_party.flash_linear_attention.ops.chunk_delta_h",
)


class _Changes:
    """Attribute and mapping changes, undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[tuple[object, str, object, bool]] = []

    def setattr(self, target: object, name: str, value: object) -> None:
        self._undo.append((target, name, getattr(target, name, _MISSING), False))
        setattr(target, name, value)

    def setitem(self, target: dict, key: str, value: object) -> None:
        self._undo.append((target, key, target.get(key, _MISSING), True))
        target[key] = value

    def undo(self) -> None:
        while self._undo:
            target, key, old, item = self._undo.pop()
            if old is _MISSING:
                if item:
                    del target[key]
                else:
                    delattr(target, key)
            elif item:
                target[key] = old
            else:
                setattr(target, key, old)


def tensor_range(*bounds):
    """``range`` for an interpreted kernel: Triton scalars as loop values."""
    import triton.language as tl

    ints = (b.handle.data.item() if isinstance(b, tl.tensor) else b for b in bounds)
    return (tl.full([], i, tl.int32) for i in builtins.range(*ints))


def builtin_at_call(name: str):
    """A stand-in for a module-level alias of ``tl.<name>``."""
    import triton.language as tl

    def call(*args, **kwargs):
        return getattr(tl, name)(*args, **kwargs)

    return call


def make_interpretable(changes, kernel) -> None:
    """One kernel (under its heuristics and autotune decorators); every
    change goes through ``changes.setattr`` / ``changes.setitem`` (a
    ``_Changes``, or pytest's monkeypatch, which undo them)."""
    import triton.language as tl

    jit, tuner = jit_and_tuner(kernel)
    if tuner is not None:
        changes.setattr(tuner, "configs", tuner.configs[:1])
    names = jit.fn.__globals__
    changes.setitem(names, "range", tensor_range)
    for name, value in list(names.items()):
        builtin = getattr(value, "__name__", None)
        if builtin and getattr(tl, builtin, None) is value:
            changes.setitem(names, name, builtin_at_call(builtin))


@contextmanager
def interpretable(kernels, *, gather: bool = False) -> Iterator[None]:
    """``kernels`` runnable in the interpreter inside the block; unless
    ``gather``, the sub-chunk kernel's plain-load branch too."""
    from vllm.models.kimi_k3.amd.ops.third_party.kda import chunk_intra

    changes = _Changes()
    try:
        if not gather:
            changes.setattr(chunk_intra, "is_gather_supported", False)
        for kernel in kernels:
            make_interpretable(changes, kernel)
        with warnings.catch_warnings():
            # vLLM's kernels use tl.make_block_ptr, which Triton 3.7 calls
            # deprecated, once per interpreted program.
            warnings.filterwarnings("ignore", "tl.make_block_ptr is deprecated")
            yield
    finally:
        changes.undo()


def jit_and_tuner(kernel) -> tuple[object, object | None]:
    """The kernel under its heuristics and autotune decorators (a JIT
    function, or the interpreter's stand-in), and its autotuner (None for a
    kernel that is not autotuned)."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    tuner = None
    while isinstance(kernel, Autotuner | Heuristics):
        tuner = kernel if isinstance(kernel, Autotuner) else tuner
        kernel = kernel.fn
    return kernel, tuner


def kda_kernels() -> list:
    """Every Triton kernel of KDA_KERNEL_MODULES, once each (any
    KernelInterface: compiled, interpreted or decorated)."""
    from triton.runtime.jit import KernelInterface

    found: dict[int, object] = {}
    for name in KDA_KERNEL_MODULES:
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, KernelInterface):
                found.setdefault(id(value), value)
    return list(found.values())
