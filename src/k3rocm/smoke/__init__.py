"""Start-up smoke test: proves the stall-free prefill path is the one serving.

    python -m k3rocm.smoke            stage 1, then stage 2 (the container's)
    python -m k3rocm.smoke --stage 1  stage 1 only (no server needed)

Stage 1 runs before vLLM starts (the ``vllm`` program waits for its gate
file): the patch marker matches the series this k3rocm carries; on ROCm the
Kimi KDA layer resolves to ``KIMI_K3_KDA_ROCM``; the device kernel equals the
reference on a fixed battery of batches (on the GPU, or on the CPU under
``TRITON_INTERPRET=1``); a small mixed step through the Kimi KDA kernels
(decodes through the recurrent kernel, prefills through chunk KDA) matches
the float64 reference, finite and within its tolerance; and under
``torch.cuda.set_sync_debug_mode("error")`` our metadata build raises
nothing while the legacy path does (GPU only).

Stage 2 runs once ``/health`` answers: a real completion whose prompt spans
several 64-token chunks, then ``/metrics`` shows new prefill step samples from
the k3rocm metrics plugin.

Outputs: the JSON report (``K3_SMOKE_REPORT``; the metrics plugin's verdict
gauge reads it), the ready mark (``$K3_RUN_DIR/ready``) and one summary line.
``K3_SMOKE_ON_FAILURE=stop`` (default) exits 1 on failure, and the container
stops; ``warn`` logs loudly, writes the ready mark and keeps serving. Every
stage runs under a timeout.

One job per module: ``settings`` (the environment), ``stage1`` (patch
marker, Kimi backend), ``kernel_checks`` (the device kernel against the
reference, no device sync), ``kda_numerics`` (the KDA ops against
``kda_reference``, the float64 reference; ``interpreter`` lets them run in
the Triton interpreter), ``chunk_reference`` (the chunk metadata written
out in plain Python, which the device kernel is checked against),
``http`` (the API client), ``stage2`` (completion and prefill metrics),
``timeouts`` (each stage under its timeout), ``policy`` (verdict, ready mark
and exit code by ``K3_SMOKE_ON_FAILURE``) and ``__main__`` (the command).
"""

# What docs/benchmarks.md runs on a GPU host (`from k3rocm import smoke`).
from k3rocm.smoke.chunk_reference import CHUNK_SIZE
from k3rocm.smoke.kernel_checks import (
    KERNEL_BATTERY,
    compare_with_reference,
    sync_check,
)

__all__ = ["CHUNK_SIZE", "KERNEL_BATTERY", "compare_with_reference", "sync_check"]
