"""What Triton compiles a launch of vLLM 0.32.0's recurrent KDA kernel apart
on (its JIT cache key), and a stand-in for the kernel that records those
keys. 0.32.0 line only: the module imports that line's kernel.

The key: the kernel's constexpr arguments (among them the launch
configuration the wrapper picks), num_warps and num_stages, each tensor's
dtype, 16-byte alignment and AMD's 2 GiB storage class, which optional
arguments are None, and each integer argument's class (1, a multiple of 16,
other) unless the kernel opts it out (``do_not_specialize``: 0.32.0's does
for N and T)."""

import inspect

import torch
import vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent as fused_recurrent
from triton.backends.amd.compiler import HIPBackend


def _layers(kernel):
    """The kernel, then what it wraps: heuristics, the JIT (or interpreted)
    function, the Python function."""
    while kernel is not None:
        yield kernel
        kernel = getattr(kernel, "fn", None)


def _opted_out(kernel) -> set[str]:
    """The integer arguments the kernel keeps out of Triton's classes."""
    for layer in _layers(kernel):
        names = getattr(layer, "do_not_specialize", None)
        if names is None and isinstance(getattr(layer, "kwargs", None), dict):
            names = layer.kwargs.get("do_not_specialize")  # the interpreter's
        if names is not None:
            return set(names)
    return set()


REAL_KERNEL = fused_recurrent.fused_recurrent_kda_fwd_kernel
KERNEL = inspect.signature([*_layers(REAL_KERNEL)][-1])
OPTED_OUT = _opted_out(REAL_KERNEL)


def launch_key(kwargs: dict) -> tuple:
    """What Triton compiles a launch of the recurrent kernel apart on."""
    key = []
    for name, value in sorted(kwargs.items()):
        param = KERNEL.parameters.get(name)
        if param is None or "constexpr" in str(param.annotation):
            key.append((name, value))  # constexprs, num_warps, num_stages
        elif torch.is_tensor(value):
            # AMD's backend also asks whether the storage passes 2 GiB.
            within = HIPBackend.is_within_2gb(value)
            key.append((name, value.dtype, value.data_ptr() % 16 == 0, within))
        elif isinstance(value, bool) or value is None or isinstance(value, float):
            key.append((name, type(value)))
        elif name in OPTED_OUT:
            key.append((name, int))
        else:
            key.append((name, 1 if value == 1 else value % 16 == 0))
    return tuple(key)


class Recorder:
    """Stands in for the kernel: records each launch's key, runs nothing."""

    def __init__(self):
        self.compiled, self.launched = set(), set()

    def warmup(self, grid, **kwargs):
        self.compiled.add(launch_key(kwargs))

    def __getitem__(self, grid):
        return lambda **kwargs: self.launched.add(launch_key(kwargs))
