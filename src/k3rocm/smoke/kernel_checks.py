"""Stage 1's device-kernel checks: the kernel equals the reference on a fixed
battery of batches (on the GPU, or on the CPU in the Triton interpreter), and
builds its metadata without synchronising the host with the device (GPU
only)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from k3rocm.common.smoke_report import CheckName, Stage
from k3rocm.common.states import Verdict
from k3rocm.smoke.chunk_reference import (
    CHUNK_SIZE,
    cu_seqlens_of,
    reference_chunk_metadata,
)

# Sequence lengths of the kernel battery: what the upstream reviewers asked
# about (empty sequences anywhere, mixed prefill/decode batches, more
# sequences than one tile and than the kernel's narrowest prefix load of 128
# lanes, one prompt longer than a chunk block) and chunk-boundary lengths.
KERNEL_BATTERY: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("one token", (1,)),
    ("chunk boundaries", (63, 64, 65, 128, 129)),
    ("mixed prefill and decode", (1, 1, 300, 1, 130, 1)),
    ("empty sequences front, middle, back", (0, 100, 0, 0, 64, 0)),
    ("all empty", (0, 0, 0)),
    ("130 sequences", tuple(1 + (i * 37) % 200 for i in range(130))),
    ("long prompt over several chunk blocks", (64 * 300 + 7, 3)),
)

MetadataBuilder = Callable[..., tuple]


def kernel_device() -> str | None:
    """Where the device kernel can run here: the GPU, the Triton interpreter
    on the CPU, or nowhere."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") == "1":
        # Off the GPU vllm.triton_utils hides Triton (no active driver); the
        # CPU development profile binds the real modules so the kernel runs
        # in the interpreter. Must happen before the kernel module is imported.
        import triton
        import triton.language as tl
        import vllm.triton_utils as triton_utils

        triton_utils.triton, triton_utils.tl, triton_utils.HAS_TRITON = (
            triton,
            tl,
            True,
        )
        return "cpu"
    return None


def compare_with_reference(
    build: MetadataBuilder,
    device: str,
    battery: Sequence[tuple[str, tuple[int, ...]]] = KERNEL_BATTERY,
) -> list[str]:
    """Names of the batches where ``build(cu_seqlens, cu_seqlens_cpu)``
    differs from the reference."""
    import torch

    mismatches = []
    for name, seq_lens in battery:
        cu_cpu = cu_seqlens_of(seq_lens)
        indices, offsets = build(cu_cpu.to(device), cu_cpu)
        want_indices, want_offsets = reference_chunk_metadata(seq_lens, CHUNK_SIZE)
        if not (
            torch.equal(indices.cpu().to(torch.int32), want_indices)
            and torch.equal(offsets.cpu().to(torch.int64), want_offsets)
        ):
            mismatches.append(f"{name} {list(seq_lens)[:8]}")
    return mismatches


def check_kernel_battery(stage: Stage, device: str | None) -> bool:
    if device is None:
        return stage.add(
            CheckName.DEVICE_KERNEL,
            Verdict.SKIP,
            "no GPU, and TRITON_INTERPRET is not 1: nowhere to run the kernel",
        )
    from vllm.models.kimi_k3.amd.kda_metadata_launch import (
        prepare_chunk_metadata_device,
    )

    mismatches = compare_with_reference(prepare_chunk_metadata_device, device)
    if mismatches:
        return stage.add(
            CheckName.DEVICE_KERNEL,
            Verdict.FAIL,
            f"differs from the reference on {device} for: " + "; ".join(mismatches),
        )
    return stage.add(
        CheckName.DEVICE_KERNEL,
        Verdict.PASS,
        f"equals the reference on {len(KERNEL_BATTERY)} batches on {device}",
    )


def sync_check(build: MetadataBuilder, legacy: MetadataBuilder) -> tuple[Verdict, str]:
    """(status, detail): ``build`` must not synchronise the host with the
    device, ``legacy`` must (else the detector proves nothing here)."""
    import torch

    cu_cpu = cu_seqlens_of((5, 300, 0, 64, 1))
    cu_device = cu_cpu.to("cuda")
    build(cu_device, cu_cpu)  # compile outside the debug mode
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        try:
            build(cu_device, cu_cpu)
        except RuntimeError as err:
            return Verdict.FAIL, f"building the metadata synchronised: {err}"
        try:
            legacy(cu_device, cu_cpu)
        except RuntimeError:
            return Verdict.PASS, (
                "our metadata build raised nothing under sync debug mode "
                "'error'; the legacy .tolist() path raised (negative control)"
            )
        return Verdict.FAIL, (
            "the legacy path raised nothing under sync debug mode 'error': "
            "the detector does not work here, so the check proves nothing"
        )
    finally:
        torch.cuda.set_sync_debug_mode(0)


def check_no_sync(stage: Stage, device: str | None) -> bool:
    if device != "cuda":
        return stage.add(
            CheckName.NO_DEVICE_SYNC,
            Verdict.SKIP,
            "no GPU: torch.cuda.set_sync_debug_mode needs a device",
        )
    from vllm.models.kimi_k3.amd.kda_metadata_launch import (
        prepare_chunk_metadata_device,
    )
    from vllm.third_party.flash_linear_attention.ops.index import (
        prepare_chunk_indices,
    )

    status, detail = sync_check(
        prepare_chunk_metadata_device,
        lambda cu, _cu_cpu: prepare_chunk_indices(cu, CHUNK_SIZE),
    )
    return stage.add(CheckName.NO_DEVICE_SYNC, status, detail)
