"""Helpers that let vLLM 0.27.1's vendored AMD KDA Triton kernels run in the
Triton interpreter (TRITON_INTERPRET=1, set by conftest.py before Triton is
imported; conftest also binds the real Triton into vllm.triton_utils, which
swaps in a placeholder where no GPU driver is active), and that poison what
a call allocates.

What each stand-in replaces, and why the interpreter needs it, is in
k3rocm.smoke.interpreter; none changes what a kernel computes."""

import torch
import vllm.models.kimi_k3.amd.ops.third_party.kda.kda_chunk_launch as launch

from k3rocm.smoke.interpreter import make_interpretable


def interpretable_kernel(monkeypatch, kernel) -> None:
    """What the interpreter needs of one kernel (k3rocm.smoke.interpreter,
    the smoke test's own), undone by ``monkeypatch`` after the test."""
    make_interpretable(monkeypatch, kernel)


def interpretable(monkeypatch, lower_bound) -> None:
    """What the interpreter needs of a chunk KDA call's kernels, on the
    vendored and the launched path alike: ``interpretable_kernel`` for each
    launch site's kernel, and the sub-chunk kernel's plain load in place of
    tl.gather."""
    from vllm.models.kimi_k3.amd.ops.third_party.kda import chunk_intra

    monkeypatch.setattr(chunk_intra, "is_gather_supported", False)
    for site in launch.SITES:
        interpretable_kernel(monkeypatch, launch.site_kernel(site, lower_bound))


def poisoned(carve):
    """_carve with every byte of the call's allocation set to 0xFF (NaN in
    bfloat16 and float32): what a kernel reads before anything wrote it
    reaches the outputs."""

    def carve_poisoned(device, pieces, pointers):
        memory, carved = carve(device, pieces, pointers)
        memory.fill_(0xFF)
        return memory, carved

    return carve_poisoned


def fresh(args) -> tuple:
    return tuple(a.clone() if torch.is_tensor(a) else a for a in args)


def poison_allocations(monkeypatch) -> None:
    """torch.empty, torch.empty_like and Tensor.new_empty hand out memory
    with every byte 0xFF (NaN in bfloat16 and float32, -1 in integers), as a
    GPU caching allocator can hand out a freed NaN tensor's memory: a kernel
    that reads what nobody wrote puts NaN in its results. (On the CPU,
    torch.empty's memory is whatever malloc returns, often zeros.)"""
    empty, empty_like, new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def fill(tensor):
        raw = empty(0, dtype=torch.uint8, device=tensor.device)
        raw.set_(tensor.untyped_storage())
        raw.fill_(0xFF)
        return tensor

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(empty_like(*a, **k)))
    monkeypatch.setattr(
        torch.Tensor, "new_empty", lambda *a, **k: fill(new_empty(*a, **k))
    )
