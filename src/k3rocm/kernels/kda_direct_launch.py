# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_direct_launch.py by
# `k3rocm patchgen`: edit that file, not this one.
"""Launching a compiled Triton binary without Triton's dispatcher, and what
Triton specializes a launch's arguments on.

The series' precompiled KDA launches call compiled binaries directly (on
the 0.27.1 line the chunk and the recurrent ones, kda_chunk_launch.py; on
the 0.32.0 line the recurrent one, kda_recurrent_launch.py), so both lines'
trees carry this module. Everything they take from Triton's
internals is here, so another Triton has one module to check: the JIT
function under the decorators, a binary's launcher, the current stream, and
the integer and pointer classes that pick a binary. Without those internals
(another Triton, or ``TRITON_INTERPRET=1``) ``DIRECT`` is False and every
call runs vLLM's own path.
"""

import torch
from vllm.third_party.flash_linear_attention.ops import l2norm as _l2norm_module
from vllm.triton_utils import triton

_I32 = 1 << 31
# AMD's Triton (buffer ops, on by default in 3.7.1) compiles a pointer apart
# when its tensor's storage passes this many bytes (HIPBackend.is_within_2gb).
POINTER_RANGE = 2**31 - 1


def unwrap(kernel) -> tuple[object, object | None]:
    """(the JIT function, its autotuner or None) under Triton's heuristics
    and autotune decorators."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    tuner = None
    while isinstance(kernel, Heuristics | Autotuner):
        if isinstance(kernel, Autotuner):
            tuner = kernel
        kernel = kernel.fn
    return kernel, tuner


def int_class(value: int, specialized: bool = True) -> int:
    """What Triton's specialization sees of an integer argument: its type
    (i32 or wider) and, where it specializes, whether it is 1 or a
    multiple of 16."""
    wide = 0 if -_I32 <= value < _I32 else 4
    if not specialized:
        return wide
    if value == 1:
        return wide | 1
    return wide | (2 if value % 16 == 0 else 0)


def _misaligned(*tensors: torch.Tensor | None) -> int:
    """Bit i set when tensor i's pointer is not 16-byte aligned (what
    Triton specializes pointers on)."""
    bits = 0
    for i, tensor in enumerate(tensors):
        if tensor is not None and tensor.data_ptr() & 15:
            bits |= 1 << i
    return bits


def _far(*tensors: torch.Tensor | None) -> int:
    """Bit i set when tensor i's storage passes 2 GiB. AMD's Triton compiles
    such a pointer apart (no 32-bit buffer offsets), so a binary compiled
    for a storage within 2 GiB must not be launched on one past it; other
    backends do not tell them apart, and there it only splits kinds."""
    bits = 0
    for i, tensor in enumerate(tensors):
        if tensor is not None and tensor.untyped_storage().nbytes() > POINTER_RANGE:
            bits |= 1 << i
    return bits


def _direct(binary) -> tuple | None:
    """What launching one compiled binary without Triton's dispatcher takes
    (its launcher, function handle and packed metadata), or None where this
    Triton lacks the internals."""
    try:
        binary._init_handles()
        return binary.run, binary.function, binary.packed_metadata
    except AttributeError:
        return None


def _current_stream(device_index: int):
    return triton.runtime.driver.active.get_current_stream(device_index)


def _direct_forward_available() -> bool:
    jit, _ = unwrap(_l2norm_module.l2norm_fwd_kernel2)
    return isinstance(jit, triton.runtime.jit.JITFunction)


# Under TRITON_INTERPRET=1 nothing is compiled: every call is vendored.
DIRECT = _direct_forward_available()
