"""What a precompiled launch would save on a wrapper call: record the
arguments a vLLM wrapper hands one Triton kernel, then time the wrapper,
Triton's dispatcher with those arguments, and the same binary launched
directly (k3rocm.kernels.kda_direct_launch, as the 0.27.1 series' launches
do). Works on either release line's bundle: it reads no kernel's signature
but the JIT function's own argument names."""

import contextlib
import statistics
import time

import torch

from k3rocm.kernels.kda_direct_launch import _direct, unwrap


class _Recorder:
    """Stands in for a module's kernel object: kernel[grid](**kwargs) is
    recorded and forwarded."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.calls: list[tuple[tuple, dict]] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            assert not args, "the wrappers pass every argument by name"
            self.calls.append((tuple(grid), dict(kwargs)))
            return self.kernel[grid](**kwargs)

        return launch


@contextlib.contextmanager
def recording(module, name: str):
    recorder = _Recorder(getattr(module, name))
    setattr(module, name, recorder)
    try:
        yield recorder
    finally:
        setattr(module, name, recorder.kernel)


def launchers(module, name: str, wrapper):
    """(dispatcher, direct) for the kernel `module.name` as `wrapper()`
    launches it: the same grid and arguments through kernel[grid](...), and
    through the compiled binary's own launcher (None where this Triton has
    no such internals)."""
    with recording(module, name) as recorder:
        wrapper()
    ((grid, kwargs),) = recorder.calls
    grid = (*grid, 1, 1)[:3]
    kernel = getattr(module, name)
    binary = kernel[grid](**kwargs)

    def dispatcher():
        kernel[grid](**kwargs)

    direct = _direct(binary)
    if direct is None:
        return dispatcher, None
    run, function, packed = direct
    jit, _ = unwrap(kernel)
    # The heuristics' constexprs are in kwargs only after Triton adds them:
    # compute them as the decorator does.
    values = dict(kwargs)
    fn = kernel
    while fn is not jit:
        for key, rule in getattr(fn, "values", {}).items():
            values.setdefault(key, rule(values))
        fn = fn.fn
    args = [values[arg] for arg in jit.arg_names]

    def launch_direct():
        stream = torch.cuda.current_stream().cuda_stream
        run(*grid, stream, function, packed, None, None, None, *args)

    return dispatcher, launch_direct


def host_us(parts: dict, reps: int) -> dict:
    """Median host microseconds per call of each part, the parts taken in
    turn and each call after a synchronize (launch only in the timing)."""
    for part in parts.values():
        part()
    samples = {name: [] for name in parts}
    for _ in range(reps):
        for name, part in parts.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            part()
            samples[name].append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return {name: statistics.median(v) * 1e6 for name, v in samples.items()}


def gpu_us(call, reps: int = 100) -> float:
    """Mean GPU microseconds per call, back to back between two events."""
    call()
    start, end = (
        torch.cuda.Event(enable_timing=True),
        torch.cuda.Event(enable_timing=True),
    )
    start.record()
    for _ in range(reps):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def compare(module, name: str, wrapper, outputs, reps: int = 400) -> dict:
    """The wrapper, Triton's dispatcher and the direct launch of one
    kernel: host us per call, GPU us per call, and whether the direct
    launch writes bitwise what the wrapper writes (`outputs()` lists the
    tensors a call writes; they are restored between the two)."""
    dispatcher, direct = launchers(module, name, wrapper)
    saved = [t.clone() for t in outputs()]
    wrapper()
    torch.cuda.synchronize()
    by_wrapper = [t.clone() for t in outputs()]
    row = {"gpu us per call (wrapper)": gpu_us(wrapper)}
    parts = {"wrapper": wrapper, "kernel[grid](...)": dispatcher}
    if direct is not None:
        for tensor, before in zip(outputs(), saved, strict=True):
            tensor.copy_(before)
        direct()
        torch.cuda.synchronize()
        row["direct launch bitwise equal to the wrapper"] = all(
            torch.equal(a, b) for a, b in zip(outputs(), by_wrapper, strict=True)
        )
        parts["direct launch"] = direct
    row["host us (median)"] = host_us(parts, reps)
    return row
