# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.27.1).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_chunk_launch.py by
# `k3rocm patchgen`: edit that file, not this one.
"""Chunk KDA forward, and the recurrent decode kernel, through precompiled
launches: what the rest of the series imports.

vLLM 0.27.1's vendored ``chunk_kda_with_fused_gate`` (AMD copy) issues eight
Triton kernels a call, each through Triton's Python dispatcher (heuristics,
autotuner key, argument binding and specialization, launch metadata), plus
the tensor work between them. The series issues the same kernels, in the
same order, on the same buffers, with the same configurations, by calling
each kernel's compiled binary directly; the recurrent kernel that takes a
mixed batch's decodes (patch 0004) likewise. Outputs are bitwise those of
the vendored path: same binaries, same grids, same arguments (but the flag
with which the inter + solve kernel writes Akk's upper zeros, patch 0007,
and the binary it selects). Without the Triton internals used (another
Triton, or ``TRITON_INTERPRET=1``) every call runs the vendored path.

One job a module, in the order they build on each other:

- kda_direct_launch.py: launching a compiled binary without the
  dispatcher, and what Triton specializes arguments on;
- kda_chunk_forward.py: the vendored chunk forward, kernel for kernel;
- kda_chunk_plans.py: the kind of a chunk call, its plan read back from
  Triton's caches, and the guard on the plan's configurations;
- kda_recurrent_plans.py: the same for the recurrent decode kernel;
- kda_launch_entry.py: the entry points, which launch through the plans
  they hold or run vLLM's path and plan after it;
- kda_launch_warm_up.py: the warm-ups that make the plans before serving,
  and compile the speculative calls' binaries.

This module re-exports what the series' other patches and the smoke test
use, so they import one module whatever the split.
"""

from .kda_chunk_forward import SITES, site_kernel
from .kda_direct_launch import DIRECT, unwrap
from .kda_launch_entry import (
    RECURRENT_STATS,
    STATS,
    chunk_kda_launched,
    recurrent_kda_launched,
)
from .kda_launch_warm_up import (
    RecurrentWarmUp,
    SpecWarmUp,
    WarmUp,
    warm_up_chunk_kda,
    warm_up_recurrent_kda,
    warm_up_spec_recurrent_kda,
)

__all__ = [
    "DIRECT",
    "RECURRENT_STATS",
    "SITES",
    "STATS",
    "RecurrentWarmUp",
    "SpecWarmUp",
    "WarmUp",
    "chunk_kda_launched",
    "recurrent_kda_launched",
    "site_kernel",
    "unwrap",
    "warm_up_chunk_kda",
    "warm_up_recurrent_kda",
    "warm_up_spec_recurrent_kda",
]
