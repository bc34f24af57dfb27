"""What Triton compiles a launch of vLLM's recurrent KDA kernel (the AMD
copy, ``fused_recurrent_kda_fwd_kernel``) apart on (its JIT cache key), and
a stand-in for the kernel that records those keys: the line's own kernel,
0.27.1's or 0.32.0's.

The key: the kernel's constexpr arguments (among them the launch
configuration the wrapper picks and the flags its heuristics set),
num_warps and num_stages, each tensor's dtype, 16-byte alignment and AMD's
2 GiB storage class, which optional arguments are None, and each integer
argument's class (1, a multiple of 16, other) unless the kernel opts it out
(``do_not_specialize``: both lines' do for N and T)."""

import inspect

import torch
import vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent as fused_recurrent
from triton.backends.amd.compiler import HIPBackend
from triton.runtime.autotuner import Heuristics


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
# The arguments the kernel's @triton.heuristics set from the others.
HEURISTICS = next(
    (layer.values for layer in _layers(REAL_KERNEL) if isinstance(layer, Heuristics)),
    {},
)


def with_heuristics(kwargs: dict) -> dict:
    """A launch's arguments as the JIT function gets them: the heuristics'
    values set (over any given), as Triton's Heuristics does."""
    return {**kwargs, **{name: rule(kwargs) for name, rule in HEURISTICS.items()}}


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
    """Stands in for the kernel: records the key of each launch
    (``kernel[grid](...)``) and of each compile without a launch (Triton's
    ``warmup`` through the heuristics, or the JIT function's own ``run``
    with ``warmup=True``, which takes every argument, the heuristics' too),
    runs nothing."""

    def __init__(self):
        self.compiled, self.launched = set(), set()

    def warmup(self, grid, **kwargs):
        self.compiled.add(launch_key(with_heuristics(kwargs)))

    def run(self, *args, grid, warmup, **options):
        assert warmup, "a launch through the JIT function's run"
        names = [*KERNEL.parameters][: len(args)]  # the rest come by name
        given = dict(zip(names, args, strict=True))
        self.compiled.add(launch_key({**given, **options}))

    def __getitem__(self, grid):
        return lambda **kwargs: self.launched.add(launch_key(with_heuristics(kwargs)))
