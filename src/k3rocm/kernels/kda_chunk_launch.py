# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.27.1).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_chunk_launch.py by
# `k3rocm patchgen`: edit that file, not this one.
"""Chunk KDA forward through precompiled launches.

vLLM 0.27.1's vendored ``chunk_kda_with_fused_gate`` (AMD copy) issues eight
Triton kernels a call, each through Triton's Python dispatcher (heuristics,
autotuner key, argument binding and specialization, launch metadata), plus
the tensor work between them. This module issues the same kernels, in the
same order, on the same buffers, with the same configurations, by calling
each kernel's compiled binary directly. One thing differs: the fused
inter + solve kernel writes Akk's zeros above the diagonal itself (patch
0007), so Akk is not zero-filled first (a fill kernel fewer a call).

A *plan* holds, for one kind of call, the compiled binary of every kernel
the call runs and the autotuned configuration it was compiled with. The
kind of call (``_call_key``) is everything Triton's choice of binary can
depend on: devices, dtypes, the fixed dimensions, which optional inputs are
given, the 16-byte alignment of every input pointer, and the specialization
class (1, a multiple of 16, other) of every integer argument Triton
specializes. A call of a kind without a plan runs vLLM's own path, which
autotunes and compiles as 0.27.1 always did; the plan is then read back from
Triton's own caches, for exactly the arguments that call used
(``JITFunction.run(..., warmup=True)``: the binary the dispatcher launched),
so no binary of a plan was chosen by anything but Triton. ``warm_up_chunk_kda``
makes the plans of every token count's specialization before serving.

Outputs are bitwise those of the vendored path: same binaries, same grids,
same arguments (but that one flag, and the binary it selects). Without
the Triton internals used here (another Triton, or ``TRITON_INTERPRET=1``)
every call runs the vendored path.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from vllm.logger import init_logger
from vllm.third_party.flash_linear_attention.ops import l2norm as _l2norm_module
from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE
from vllm.triton_utils import triton
from vllm.utils.math_utils import RCP_LN2

# The kernels, in the order one call launches them ("intra" is one of two:
# the sub-chunk kernel with a gate lower bound, token-parallel without).
SITES = (
    "l2norm_q",
    "l2norm_k",
    "gate",
    "intra",
    "inter_solve",
    "recompute_w_u",
    "delta_h",
    "output",
)
_BC = 16  # sub-chunk size of chunk_kda_fwd_intra
_L2NORM_EPS = 1e-6  # l2norm_fwd's default, as chunk_kda_with_fused_gate calls it
_L2NORM_MBLOCK = 32
_I32 = 1 << 31

# launch(site, grid, *arguments in the kernel's parameter order)
Launch = Callable[..., None]
logger = init_logger(__name__)


def _kernels() -> dict[str, object]:
    """Each site's kernel as the vendored code calls it (imported late: the
    vendored chunk module imports this one)."""
    from vllm.models.kimi_k3.amd.ops.third_party.kda import (
        chunk,
        chunk_intra,
        chunk_intra_token_parallel,
    )
    from vllm.third_party.flash_linear_attention.ops import chunk_delta_h

    return {
        "l2norm": _l2norm_module.l2norm_fwd_kernel2,
        "gate": chunk.kda_gate_chunk_cumsum_vector_kernel,
        "intra_sub_chunk": chunk_intra.chunk_kda_fwd_kernel_intra_sub_chunk,
        "intra_token_parallel": (
            chunk_intra_token_parallel.chunk_kda_fwd_kernel_intra_token_parallel
        ),
        "inter_solve": chunk_intra.chunk_kda_fwd_kernel_inter_solve_fused,
        "recompute_w_u": chunk.recompute_w_u_fwd_kernel,
        "delta_h": chunk_delta_h.chunk_gated_delta_rule_fwd_kernel_h_blockdim64,
        "output": chunk.chunk_gla_fwd_kernel_o,
    }


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


def _platform_constants() -> dict[str, object]:
    """What the vendored code reads from the platform on every call."""
    from vllm.models.kimi_k3.amd.ops.third_party.kda import chunk_intra
    from vllm.platforms import current_platform

    return {
        "use_gather": chunk_intra.is_gather_supported,
        "solve_tril_precision": (
            "tf32"
            if current_platform.is_cuda() and current_platform.has_device_capability(80)
            else "ieee"
        ),
    }


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


# Every intermediate of a call starts on a multiple of this many bytes of
# the call's one allocation (the compiled binaries assume 16-byte-aligned
# pointers, as fresh allocations are).
_PIECE_BYTES = 256


def _carve(device: torch.device, pieces, pointers: bool) -> tuple[torch.Tensor, list]:
    """(one allocation, room in it for uninitialized contiguous tensors of
    the given ``(shape, dtype)``): one call into the caching allocator where
    the vendored path makes eleven or thirteen. With ``pointers`` each
    piece is its device address (an int, which Triton's launchers take as a
    pointer as it is); else a tensor with the strides torch.empty gives."""
    starts, end = [], 0
    for shape, dtype in pieces:
        starts.append(end)
        end += -(-math.prod(shape) * dtype.itemsize // _PIECE_BYTES) * _PIECE_BYTES
    memory = torch.empty(end, dtype=torch.uint8, device=device)
    if pointers:
        base = memory.data_ptr()
        return memory, [base + start for start in starts]
    return memory, [
        memory[start:].view(dtype)[: math.prod(shape)].view(shape)
        for (shape, dtype), start in zip(pieces, starts, strict=True)
    ]


def _forward(launch, consts, pointers, q, k, v, raw_g, raw_beta, A_log, g_bias,
             scale, initial_state, output_final_state, lower_bound, use_l2norm,
             cu_seqlens, chunk_indices, chunk_offsets):  # fmt: skip
    """vLLM 0.27.1's chunk_kda_with_fused_gate after its argument handling
    (l2norm_fwd of q and k, then chunk_kda_with_fused_gate_fwd), kernel for
    kernel, every launch through ``launch(site, grid, *args)`` with the
    arguments in the kernel's parameter order, constexprs included.
    ``consts`` holds the pinned configurations' values and the platform's.
    The intermediates have the vendored path's shapes and dtypes and are cut
    from one allocation (``_carve``). With ``pointers``, every tensor
    argument goes to the launch as its device address, which is what the
    compiled binary receives either way (Triton's launcher then neither
    calls data_ptr() nor asks the driver about the pointer, argument by
    argument); else as the tensor (what Triton's dispatcher specializes on).
    Returns the output (written over v) and the final state."""
    BT = FLA_CHUNK_SIZE
    num_chunks = chunk_indices.shape[0]
    num_seqs = cu_seqlens.shape[0] - 1
    B, T, H, K = k.shape  # the l2norm outputs have the inputs' shapes
    Bq, Tq, Hq, Kq = q.shape
    HV = raw_g.shape[2]  # g has raw_g's shape
    Bg, Tg, _, S = raw_g.shape
    HU, V = v.shape[2], v.shape[3]  # u and v_new have v's
    beta_strides = raw_beta.stride()
    f32 = torch.float32
    # In the order the vendored path allocates them.
    memory, carved = _carve(q.device, (
        *(((q.shape, q.dtype), (k.shape, k.dtype)) if use_l2norm else ()),
        (raw_g.shape, f32),  # g
        (raw_beta.shape, f32),  # beta
        ((B, T, HV, BT), k.dtype),  # Aqk
        ((B, T, HV, BT), k.dtype),  # Akk (torch.zeros there; see below)
        ((B, T, HV, _BC), f32),  # Akkd
        (k.shape, k.dtype),  # w
        (v.shape, v.dtype),  # u
        (k.shape, k.dtype),  # kg
        ((B, num_chunks, HU, V, K), k.dtype),  # h (kg's dtype)
        (v.shape, v.dtype),  # v_new
    ), pointers)  # fmt: skip
    normed = carved[:2] if use_l2norm else ()
    g, beta, Aqk, Akk, Akkd, w, u, kg, h, v_new = carved[len(normed) :]
    final_state = (
        torch.empty((num_seqs, HU, V, K), dtype=f32, device=q.device)
        if output_final_state
        else None
    )
    out, state = v, final_state
    if pointers:
        q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state, state = (
            None if x is None else x.data_ptr()
            for x in (q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state,
                      state)
        )  # fmt: skip
        cu_seqlens, chunk_indices, chunk_offsets = (
            x.data_ptr() for x in (cu_seqlens, chunk_indices, chunk_offsets)
        )

    if use_l2norm:  # l2norm_fwd (its fused-kernel branch)
        q_in, q, k_in, k = q, normed[0], k, normed[1]
        rows = Bq * Tq * Hq
        launch("l2norm_q", (-(-rows // _L2NORM_MBLOCK), 1, 1),
               q_in, q, _L2NORM_EPS, rows, Kq, consts["l2norm_q_BD"],
               _L2NORM_MBLOCK)  # fmt: skip
        rows = B * T * H
        launch("l2norm_k", (-(-rows // _L2NORM_MBLOCK), 1, 1),
               k_in, k, _L2NORM_EPS, rows, K, consts["l2norm_k_BD"],
               _L2NORM_MBLOCK)  # fmt: skip

    # fused_kda_gate_chunk_cumsum (raw_g's dims)
    gate_bs = consts["gate_BS"]
    launch("gate", (-(-S // gate_bs) + 1, num_chunks, Bg * HV),
           raw_g, raw_beta, A_log, g_bias, g, beta, cu_seqlens, chunk_indices,
           RCP_LN2, lower_bound or 0.0, 1.0, 20.0, Tg, *beta_strides,
           HV, S, BT, gate_bs, g_bias is not None, True,
           lower_bound is not None)  # fmt: skip

    # chunk_kda_fwd_intra (k's dims; HV from g). Its Akk = torch.zeros(...)
    # is not repeated: the fused inter + solve kernel, told to, writes the
    # zeros above the diagonal itself (patch 0007), every element the
    # later kernels read of Akk, so a fill kernel and a torch call go.
    if lower_bound is not None:  # chunk_kda_fwd_kernel_intra_sub_chunk
        launch("intra", (num_chunks, -(-BT // _BC), B * HV),
               q, k, g, beta, Aqk, Akkd, scale, cu_seqlens, chunk_indices, T,
               H, HV, K, BT, _BC, consts["intra_BK"], True,
               consts["use_gather"])  # fmt: skip
    else:  # chunk_kda_fwd_intra_token_parallel (q's dims)
        launch("intra", (Bq * Tq, -(-HV // consts["intra_BH"]), 1),
               q, k, g, beta, Aqk, Akkd, scale, cu_seqlens, num_seqs, Tq,
               Hq, HV, Kq, BT, _BC, consts["intra_BH"], True)  # fmt: skip
    launch("inter_solve", (num_chunks, B * HV, 1),
           q, k, g, beta, Aqk, Akkd, Akk, scale, cu_seqlens, chunk_indices, T,
           H, HV, K, BT, _BC, consts["inter_solve_BK"], True,
           lower_bound is not None, consts["solve_tril_precision"],
           True)  # fmt: skip

    # recompute_w_u_fwd (A is Akk; k's dims)
    launch("recompute_w_u", (num_chunks, B * H, 1),
           None, k, None, kg, v, beta, w, u, Akk, g, cu_seqlens, chunk_indices,
           T, H, K, V, BT, 64, 64, False, True, True, "ieee")  # fmt: skip

    # chunk_gated_delta_rule_fwd_h (k is kg, v is u)
    delta_bv = consts["delta_h_BV"]
    launch("delta_h", (-(-V // delta_bv), num_seqs * HU, 1),
           kg, u, w, v_new, None, g, h, initial_state, state, cu_seqlens,
           chunk_offsets, T, HU, H, K, V, BT, delta_bv, False, True,
           initial_state is not None, state is not None, True, True,
           True)  # fmt: skip

    # chunk_gla_fwd_o_gk, written over v (q's dims)
    out_bv = consts["output_BV"]
    launch("output", (-(-V // out_bv), num_chunks, Bq * Hq),
           q, v_new, g, h, v, Aqk, cu_seqlens, chunk_indices, scale, Tq, Hq, Kq,
           V, BT, consts["output_BK"], out_bv, True)  # fmt: skip
    # Held until here: the launches got only addresses in it, so this name
    # is all that keeps it from the allocator until they are issued.
    del memory
    return out, final_state


# The values _forward takes from each autotuned site's configuration.
_CONFIG_VALUES = {
    "gate": ("BS",),
    "inter_solve": ("BK",),
    "delta_h": ("BV",),
    "output": ("BK", "BV"),
}


def site_kernel(site: str, lower_bound: float | None) -> object:
    """The kernel (as the vendored code calls it) launched at ``site``."""
    kernels = _kernels()
    if site.startswith("l2norm"):
        return kernels["l2norm"]
    if site == "intra":
        name = "intra_sub_chunk" if lower_bound is not None else "intra_token_parallel"
        return kernels[name]
    return kernels[site]


def _options(config) -> dict:
    """A configuration's compile options (num_warps, num_stages, ...), which
    the autotuner passes to the JIT function beside its constexpr values."""
    if config is None:
        return {}
    return {k: v for k, v in config.all_kwargs().items() if k not in config.kwargs}


def chosen_configs(lower_bound: float | None) -> dict[str, object]:
    """Each autotuned site's configuration in its last run (the autotuner's
    ``best_config``; the only one where it has one)."""
    configs = {}
    for site in SITES:
        _, tuner = unwrap(site_kernel(site, lower_bound))
        if tuner is not None:
            configs[site] = (
                tuner.configs[0] if len(tuner.configs) == 1 else tuner.best_config
            )
    return configs


def _consts(configs: dict, lower_bound, q: torch.Tensor, k: torch.Tensor) -> dict:
    consts = _platform_constants()
    for name, x in (("l2norm_q_BD", q), ("l2norm_k_BD", k)):
        consts[name] = min(
            65536 // x.element_size(), triton.next_power_of_2(x.shape[-1])
        )
    for site, names in _CONFIG_VALUES.items():
        for name in names:
            consts[f"{site}_{name}"] = configs[site].kwargs[name]
    if lower_bound is not None:
        consts["intra_BK"] = triton.next_power_of_2(k.shape[-1])
    else:
        consts["intra_BH"] = configs["intra"].kwargs["BH"]
    return consts


@dataclass
class Plan:
    """One kind of call's binaries (as direct launches) and the pinned
    configuration values they were compiled with."""

    launches: dict[str, tuple]  # site -> (launcher, function, packed metadata)
    binaries: dict[str, object]  # site -> Triton's CompiledKernel
    configs: dict[str, dict]  # site -> the configuration's kwargs and options
    consts: dict[str, object]


def resolve_binaries(prepared: tuple, configs: dict) -> tuple[dict, dict]:
    """(site -> the binary Triton's dispatcher launches for this call's
    arguments with ``configs``, the constants used). Once the vendored path
    has run a call of the same kind, compiles only the inter + solve
    kernel's binary that writes Akk's upper zeros (the vendored call runs
    the one that does not)."""
    lower_bound = prepared[10]
    consts = _consts(configs, lower_bound, prepared[0], prepared[1])
    binaries: dict[str, object] = {}

    def resolve(site, grid, *kernel_args):
        jit, _ = unwrap(site_kernel(site, lower_bound))
        if len(kernel_args) != len(jit.arg_names):
            raise TypeError(f"{site}: {len(kernel_args)} arguments, {jit.arg_names}")
        binaries[site] = jit.run(
            *kernel_args, grid=grid, warmup=True, **_options(configs.get(site))
        )

    _forward(resolve, consts, False, *prepared)
    return binaries, consts


def outside_allowed_configs(configs: dict, lower_bound: float | None) -> list[str]:
    """The sites whose configuration is not one of their kernel's autotune
    list (patch 0008 took recompute_w_u's racy num_stages=4 out of it; an
    autotuner's answer from elsewhere, such as an older cache, could still
    hold it), each as "site: configuration"."""
    outside = []
    for site, config in configs.items():
        _, tuner = unwrap(site_kernel(site, lower_bound))
        allowed = [c.all_kwargs() for c in tuner.configs]
        if config.all_kwargs() not in allowed:
            outside.append(f"{site}: {config}")
    return outside


def _make_plan(prepared: tuple) -> Plan | None:
    """The plan of this call's kind, read back from Triton right after the
    vendored path ran the same call; None where a configuration is outside
    its kernel's list (logged) or this Triton lacks the internals."""
    configs = chosen_configs(prepared[10])
    outside = outside_allowed_configs(configs, prepared[10])
    if outside:
        logger.warning(
            "chunk KDA: no precompiled plan for a kind of call, its autotuned "
            "configuration is outside the kernel's list (%s); calls of that "
            "kind run vLLM's own path",
            "; ".join(outside),
        )
        return None
    binaries, consts = resolve_binaries(prepared, configs)
    launches = {site: _direct(binaries[site]) for site in SITES}
    if not all(launches.values()):
        return None
    return Plan(
        launches=launches,
        binaries=binaries,
        configs={site: config.all_kwargs() for site, config in configs.items()},
        consts=consts,
    )


def _direct(binary) -> tuple | None:
    """What launching one compiled binary without Triton's dispatcher takes
    (its launcher, function handle and packed metadata), or None where this
    Triton lacks the internals."""
    try:
        binary._init_handles()
        return binary.run, binary.function, binary.packed_metadata
    except AttributeError:
        return None


def prepare(q, k, v, raw_g, raw_beta, A_log, g_bias, scale, initial_state,
            output_final_state, lower_bound, use_qk_l2norm_in_kernel,
            cu_seqlens, chunk_indices, chunk_offsets) -> tuple:  # fmt: skip
    """The call's arguments as the vendored path hands them to its kernels
    (contiguous copies, flattened gate parameters, the default scale)."""
    if use_qk_l2norm_in_kernel:
        q, k = q.contiguous(), k.contiguous()
    return (
        q, k, v.contiguous(), raw_g.contiguous(), raw_beta, A_log.reshape(-1),
        None if g_bias is None else g_bias.reshape(-1),
        k.shape[-1] ** -0.5 if scale is None else scale,
        None if initial_state is None else initial_state.contiguous(),
        output_final_state, lower_bound, use_qk_l2norm_in_kernel, cu_seqlens,
        chunk_indices, chunk_offsets,
    )  # fmt: skip


def _handled(prepared: tuple) -> bool:
    """Calls the plans cover: one varlen batch on a GPU, float scale and
    bound, raw_beta shaped as the vendored path requires, the fused l2norm."""
    q, raw_g, raw_beta, scale, lower_bound = (
        prepared[0], prepared[3], prepared[4], prepared[7], prepared[10]
    )  # fmt: skip
    return (
        q.is_cuda
        and q.shape[0] == 1
        and raw_g.shape[0] == 1
        and raw_beta.shape == raw_g.shape[:3]
        and type(scale) is float
        and (lower_bound is None or type(lower_bound) is float)
        and not (prepared[11] and _l2norm_module.USE_DEFAULT_FLA_NORM)
    )


def _call_key(q, k, v, raw_g, raw_beta, A_log, g_bias, scale, initial_state,
              output_final_state, lower_bound, use_l2norm, cu_seqlens,
              chunk_indices, chunk_offsets) -> tuple:  # fmt: skip
    """Everything Triton's choice of binary and configuration depends on, for
    prepared arguments: the device, dtypes, fixed dimensions, which optional
    inputs are given, every input pointer's 16-byte alignment, and the
    specialization class of every integer argument (the token count only
    through these classes: T is never specialized itself)."""
    T = q.shape[1]
    beta_strides = raw_beta.stride()
    return (
        q.get_device(),
        q.dtype, k.dtype, v.dtype, raw_g.dtype, raw_beta.dtype, A_log.dtype,
        None if g_bias is None else g_bias.dtype,
        None if initial_state is None else initial_state.dtype,
        cu_seqlens.dtype, chunk_indices.dtype, chunk_offsets.dtype,
        q.shape[2:], k.shape[2:], v.shape[2:], raw_g.shape[2:], A_log.shape,
        None if g_bias is None else g_bias.shape,
        None if initial_state is None else initial_state.shape[1:],
        lower_bound is None, bool(output_final_state), use_l2norm,
        _misaligned(q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state,
                    cu_seqlens, chunk_indices, chunk_offsets),
        int_class(q.numel() // q.shape[-1]), int_class(k.numel() // k.shape[-1]),
        int_class(beta_strides[0]), int_class(beta_strides[1]),
        int_class(beta_strides[2]), int_class(T, specialized=False),
        int_class(cu_seqlens.shape[0] - 1, specialized=False),
    )  # fmt: skip


def _direct_forward_available() -> bool:
    jit, _ = unwrap(_l2norm_module.l2norm_fwd_kernel2)
    return isinstance(jit, triton.runtime.jit.JITFunction)


def _current_stream(device_index: int):
    return triton.runtime.driver.active.get_current_stream(device_index)


# One plan per kind of call (_call_key), and the kinds refused one.
_PLANS: dict[tuple, Plan] = {}
_REFUSED: set[tuple] = set()
# vendored_calls: calls that ran the vendored path (no plan for their kind
# yet, a call the plans do not cover, or a refused kind); plans_made: plans
# made after one; plans_refused: kinds given none (outside_allowed_configs).
STATS = {"vendored_calls": 0, "plans_made": 0, "plans_refused": 0}
# Under TRITON_INTERPRET=1 nothing is compiled: every call is vendored.
DIRECT = _direct_forward_available()


def chunk_kda_launched(vendored, q, k, v, raw_g, raw_beta, A_log, g_bias,
                       scale, initial_state, output_final_state, lower_bound,
                       use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices,
                       chunk_offsets):  # fmt: skip
    """``chunk_kda_with_fused_gate`` for a call that brings its chunk
    metadata: through the plan of its kind; else through ``vendored`` (the
    vendored function, same arguments), making the plan after it."""
    prepared = prepare(q, k, v, raw_g, raw_beta, A_log, g_bias, scale,
                       initial_state, output_final_state, lower_bound,
                       use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices,
                       chunk_offsets)  # fmt: skip
    key = _call_key(*prepared) if DIRECT and _handled(prepared) else None
    if key is not None:
        plan = _PLANS.get(key)
        if plan is not None:
            launches = plan.launches
            stream = _current_stream(key[0])

            def launch(site, grid, *kernel_args):
                # No launch metadata and no enter/exit hooks (profilers
                # only); the launcher skips constexprs but takes them in place.
                run, function, packed_metadata = launches[site]
                run(grid[0], grid[1], grid[2], stream, function, packed_metadata,
                    None, None, None, *kernel_args)  # fmt: skip

            return _forward(launch, plan.consts, True, *prepared)
    STATS["vendored_calls"] += 1
    out = vendored(q, k, v, raw_g, raw_beta, A_log, g_bias, scale,
                   initial_state, output_final_state, lower_bound,
                   use_qk_l2norm_in_kernel, cu_seqlens, chunk_indices,
                   chunk_offsets)  # fmt: skip
    if key is not None and key not in _REFUSED:
        plan = _make_plan(prepared)
        if plan is None:
            _REFUSED.add(key)
            STATS["plans_refused"] += 1
        else:
            _PLANS[key] = plan
            STATS["plans_made"] += 1
    return out


# The warm-up's first call of a layer is the one that autotunes (the
# vendored path's first call of an autotune key picks the configuration that
# every later call, of any size, runs with: no key holds the token count):
# a full step's tokens, as a busy server's first prefill has, at most this.
AUTOTUNE_TOKENS_MAX = 8192
# Then every token count 1 to 32, in a forward of as many tokens and of one
# more (padding): the integers Triton specializes that move with the token
# count (the rows of q and k, raw_beta's outer stride) are multiples of the
# token count or of the padded count, so these meet every combination of
# their classes that any counts can reach (below 2**31 elements).
CLASS_TOKENS = range(1, 33)
PADDINGS = (0, 1)
# A mixed batch's prefill slice starts after its decodes (patch 0004 peels
# them off), which moves every input pointer by whole rows: a row is at
# least two bytes, so 1 to 8 decodes meet every 16-byte alignment (what
# Triton specializes pointers on) that any decode count can reach. Behind
# decodes the padded count no longer follows the token count, so each
# slice is met in a forward padded by none, one, and up to a multiple of 16.
DECODE_OFFSETS = range(1, 9)
_PAD_TO = 16


class LayerCalls:
    """chunk_kda_with_fused_gate calls laid out as a Kimi KDA layer
    (``KimiGatedDeltaNetAttention`` with the series) makes them, on buffers
    made once: raw_beta a view of the fused input projection's output cut by
    the layer's own ``split_projection``, then ``unsqueeze(0)``, the first
    tokens (``forward``, ``_forward``) and the prefill slice after the
    decodes; raw_g the same rows of the gate projection's output; q, k, v
    dense (the convolution's outputs) from the slice on; the layer's own
    A_log, dt_bias and gate_lower_bound."""

    def __init__(self, layer, max_tokens: int, device: torch.device):
        self.layer = layer
        heads, dim = layer.local_num_heads, layer.head_dim
        # What the projections (and so the convolutions) output.
        dtype = layer.in_proj_qkvgfab.params_dtype
        width = layer.in_proj_qkvgfab.output_size_per_partition
        # Not the global generator: the warm-up must not move a seeded run.
        generator = torch.Generator(device=device).manual_seed(0)

        def randn(*size, dtype=dtype):
            return torch.randn(*size, dtype=dtype, device=device, generator=generator)

        rows = max_tokens + DECODE_OFFSETS[-1]
        padded = rows + _PAD_TO
        self.device = device
        self.projected = randn(padded, width)
        self.q, self.k, self.v = (randn(1, rows, heads, dim) for _ in "qkv")
        self.gate = randn(1, padded, heads, dim)
        self.state = randn(1, heads, dim, dim, dtype=torch.float32)

    def __call__(self, tokens: int, padded: int, gathered: bool, decodes=0) -> tuple:
        """The arguments of the layer's call for one prefill of ``tokens``
        tokens after ``decodes`` decodes, in a forward of ``padded`` tokens.
        ``gathered``: a batch with speculative decodes, whose other tokens
        the layer gathers with ``index_select`` (dense copies) before the
        call."""
        layer, device = self.layer, self.device
        end = decodes + tokens
        beta = layer.split_projection(self.projected[:padded])[3]
        beta = beta.unsqueeze(0)[:, :end][:, decodes:]
        raw_g = self.gate[:, :padded][:, :end][:, decodes:]
        if gathered:
            index = torch.arange(tokens, device=device)
            beta, raw_g = beta.index_select(1, index), raw_g.index_select(1, index)
        chunks = -(-tokens // FLA_CHUNK_SIZE)
        chunk_indices = torch.zeros(chunks, 2, dtype=torch.int32)
        chunk_indices[:, 1] = torch.arange(chunks)
        q, k, v = (x[:, :end][:, decodes:] for x in (self.q, self.k, self.v))
        return (
            q, k, v, raw_g, beta, layer.A_log, layer.dt_bias, None, self.state,
            True, layer.gate_lower_bound, True,
            torch.tensor([0, tokens], dtype=torch.int32, device=device),
            chunk_indices.to(device),
            torch.tensor([0, chunks], dtype=torch.int64, device=device),
        )  # fmt: skip


def _paddings(rows: int) -> set[int]:
    """Paddings of a forward of ``rows`` tokens: none, one, and up to the
    next multiple of _PAD_TO."""
    return {0, 1, -rows % _PAD_TO}


def warm_up_calls(layer, max_num_batched_tokens: int, device):
    """The calls the warm-up makes for one layer, the autotuning one first."""
    device = torch.device(device)
    first = max(1, min(max_num_batched_tokens, AUTOTUNE_TOKENS_MAX))
    calls = LayerCalls(layer, max(first, CLASS_TOKENS[-1]), device)
    yield calls(first, first, False)
    for tokens in CLASS_TOKENS:
        for padding in PADDINGS:
            yield calls(tokens, tokens + padding, False)
        yield calls(tokens, tokens, True)
        for decodes in DECODE_OFFSETS:
            rows = decodes + tokens
            for padding in sorted(_paddings(rows)):
                yield calls(tokens, rows + padding, False, decodes)


def call_kind(args: tuple) -> tuple:
    """The kind (plan key) of a chunk_kda_with_fused_gate call, from its
    arguments in the function's parameter order."""
    return _call_key(*prepare(*args))


@dataclass(frozen=True)
class WarmUp:
    """What warm_up_chunk_kda did."""

    layers: int  # layers warmed up
    kinds: int  # kinds of call those layers' warm-up calls are of
    plans: int  # plans ready now (any layer)
    made: int  # of those, made by this call
    seconds: float


def warm_up_chunk_kda(
    layers, max_num_batched_tokens: int, device: torch.device | str, vendored=None
) -> WarmUp:
    """Make the plans that Kimi KDA layers' prefill calls reach, before
    serving: for each layer the calls of ``warm_up_calls``; a kind of call
    without a plan runs the vendored path once (autotuning and compiling
    as 0.27.1 would on its first prefill), and its plan is made. Elsewhere
    than on a GPU with direct launches nothing runs; the kinds are still
    counted."""
    start = time.perf_counter()
    before = STATS["plans_made"]
    device = torch.device(device)
    run = DIRECT and device.type == "cuda"
    if run and vendored is None:
        from .chunk import vendored_chunk_kda_with_fused_gate as vendored
    kinds: set[tuple] = set()
    tried: set[tuple] = set()
    count = 0
    for layer in layers:
        count += 1
        for args in warm_up_calls(layer, max_num_batched_tokens, device):
            kind = call_kind(args)
            kinds.add(kind)
            if run and kind not in _PLANS and kind not in tried:
                tried.add(kind)
                chunk_kda_launched(vendored, *args)
    if run:
        torch.cuda.synchronize(device)
    return WarmUp(
        count,
        len(kinds),
        len(_PLANS),
        STATS["plans_made"] - before,
        time.perf_counter() - start,
    )


# ------------------------------------------------------------------------
# The recurrent kernel that takes a mixed batch's decodes (patch 0004 peels
# them off chunk KDA): fused_recurrent_kda as the layer calls it there (gate
# and beta sigmoid fused, q/k L2-normalized in the kernel, one token per
# sequence), through a plan of its kind as well. Its wrapper and Triton's
# dispatcher cost more host time than the kernel runs (docs/benchmarks.md),
# and so would checking every call in full: a call is matched to its plan
# by a signature of its tensors' layouts (``_recurrent_signature``), and a
# signature is checked in full once, the first time it is met. The kernel
# bakes the state pool's and the state indices' row strides in, which exist
# once the KV cache and the block table do: the ROCm builder plans the
# layers' calls (``warm_up_recurrent_kda``) at its first build, which vLLM
# makes while it captures CUDA graphs, before the server is ready.
_RECURRENT_BV = 32  # the wrapper's block with the gate in the kernel
_RECURRENT_WARPS = 4
_RECURRENT_STAGES = 2


def _recurrent_kernel():
    from vllm.models.kimi_k3.amd.ops.third_party.kda import fused_recurrent

    return fused_recurrent.fused_recurrent_kda_fwd_kernel


def _recurrent_arguments(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                         state, cu_seqlens, state_indices, out) -> tuple:  # fmt: skip
    """The kernel's arguments in its parameter order, as the wrapper
    (fused_recurrent_kda_fwd) and the kernel's heuristics make them."""
    T, H, K = q.shape[1], q.shape[2], q.shape[3]
    V = v.shape[-1]
    return (
        q, k, v, raw_g, raw_beta, A_log, dt_bias, out, state, cu_seqlens,
        state_indices, None, lower_bound, K**-0.5, cu_seqlens.shape[0] - 1, T,
        H, K, V, triton.next_power_of_2(K), _RECURRENT_BV, q.stride(1),
        raw_g.stride(1), raw_beta.stride(1), out.stride(1), state.stride(0),
        state_indices.stride(0), False, True, True, True, dt_bias is not None,
        lower_bound is not None, _RECURRENT_STAGES,
    )  # fmt: skip


def _recurrent_layout(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                      state, cu_seqlens, state_indices, out) -> bool:  # fmt: skip
    """Calls the plans cover, on a GPU (``q.is_cuda`` too): what the wrapper
    asserts of them, one token per sequence."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    return (
        B == 1
        and k.shape == q.shape
        and v.shape == out.shape == (1, T, H, V)
        and raw_g.shape == (1, T, H, K)
        and raw_beta.shape == (1, T, H)
        and q.stride()[2:] == k.stride()[2:] == raw_g.stride()[2:] == (K, 1)
        and v.stride()[2:] == out.stride()[2:] == (V, 1)
        and raw_beta.stride(2) == 1
        and q.stride(1) == k.stride(1) == v.stride(1)
        and state.shape[1:] == (H, V, K)
        and state.stride()[1:] == (V * K, K, 1)
        and state_indices.ndim == 1
        and cu_seqlens.shape[0] - 1 == T == state_indices.shape[0]
        and cu_seqlens.is_contiguous()
        and A_log.is_contiguous()
        and (dt_bias is None or dt_bias.is_contiguous())
        and (lower_bound is None or type(lower_bound) is float)
    )


def _recurrent_key(args: tuple) -> tuple:
    """Everything the kernel's binary depends on: the device, every
    tensor's dtype and 16-byte alignment, the constexprs (the dimensions,
    strides and flags), which optional inputs are given."""
    tensors = [a for a in args if torch.is_tensor(a)]
    constexprs = args[13:14] + args[16:]  # scale; H, K, V, blocks, strides, flags
    return (
        tensors[0].get_device(),
        tuple(t.dtype for t in tensors),
        _misaligned(*tensors),
        tuple(a is None for a in args[:13]),
        constexprs,
    )


def _recurrent_signature(q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
                         state, cu_seqlens, state_indices, out,
                         misaligned: int) -> tuple:  # fmt: skip
    """What the plan lookup compares, for the whole batch's tensors (the
    decodes are their first rows): every tensor's dtype, its strides and
    its shape but those that follow the token count (the batch's and the
    padded forward's: the token dimension, and the stride of the batch
    dimension of size 1, which nothing reads), the device, the pointers'
    alignment, which optional inputs are given. Two calls of one signature
    (and enough rows) pass or fail ``_recurrent_layout`` alike and have one
    ``_recurrent_key``: all either depends on is in it (tested)."""
    qs, ks, vs, gs, bs, os_ = (
        q.shape, k.shape, v.shape, raw_g.shape, raw_beta.shape, out.shape
    )  # fmt: skip
    return (
        q.get_device(), misaligned, type(lower_bound),
        q.dtype, qs[0], qs[2:], q.stride()[1:],
        k.dtype, ks[0], ks[2:], k.stride()[1:],
        v.dtype, vs[0], vs[2:], v.stride()[1:],
        raw_g.dtype, gs[0], gs[2:], raw_g.stride()[1:],
        raw_beta.dtype, bs[0], bs[2:], raw_beta.stride()[1:],
        out.dtype, os_[0], os_[2:], out.stride()[1:],
        state.dtype, state.shape[1:], state.stride(),
        cu_seqlens.dtype, cu_seqlens.stride(),
        state_indices.dtype, state_indices.stride(),
        A_log.dtype, A_log.is_contiguous(),
        None if dt_bias is None else (dt_bias.dtype, dt_bias.is_contiguous()),
    )  # fmt: skip


@dataclass(frozen=True)
class RecurrentPlan:
    """One kind of recurrent call's binary as a direct launch, and the
    arguments it takes that are the same for every call of the kind."""

    run: object
    function: object
    packed_metadata: object
    scale: float
    constexprs: tuple  # the arguments after T: dimensions, strides, flags
    programs_per_sequence: int  # the wrapper's grid: value blocks x heads


def _plan_recurrent(args: tuple) -> RecurrentPlan | None:
    """The plan of the call with these kernel arguments: the binary Triton's
    dispatcher launches for them (compiled now unless Triton has it: its
    warm-up run launches nothing), or None where this Triton lacks the
    internals. num_stages is a constexpr of the kernel and its compile
    option both; given by name it is both, as the wrapper gives it."""
    jit, _ = unwrap(_recurrent_kernel())
    binary = jit.run(
        *args[:-1], grid=(1,), warmup=True, num_warps=_RECURRENT_WARPS,
        num_stages=args[-1],
    )  # fmt: skip
    direct = _direct(binary)
    if direct is None:
        return None
    H, V = args[16], args[18]
    return RecurrentPlan(
        *direct, scale=args[13], constexprs=args[16:],
        programs_per_sequence=-(-V // _RECURRENT_BV) * H,
    )  # fmt: skip


# Plans by kind (_recurrent_key), and the same plans by the signatures
# checked so far (_recurrent_signature).
_RECURRENT_PLANS: dict[tuple, RecurrentPlan] = {}
_RECURRENT_SIGNATURES: dict[tuple, RecurrentPlan] = {}
# vendored_calls: calls that ran vLLM's wrapper; plans_made: plans made
# after one or by the warm-up.
RECURRENT_STATS = {"vendored_calls": 0, "plans_made": 0}


def recurrent_kda_launched(vendored, decodes, decode_tokens, q, k, v, raw_g,
                           raw_beta, A_log, dt_bias, lower_bound,
                           initial_state, cu_seqlens, ssm_state_indices,
                           out) -> None:  # fmt: skip
    """``vendored(...)`` (fused_recurrent_kda) for the ``decodes``
    sequences of ``decode_tokens`` tokens that open a mixed batch, given
    the whole batch's tensors (q, k, v, raw_g, raw_beta and out by token,
    cu_seqlens and ssm_state_indices by sequence; the calls read and write
    their first rows only, so no views are cut for them): through the plan
    of the call's kind; else through ``vendored`` with those rows
    (keyword arguments as the wrapper takes them), planning the kind after
    it. Writes the outputs into ``out`` and the states into
    ``initial_state`` in place, as the wrapper does."""
    if DIRECT and decodes == decode_tokens > 0:
        # The pointers are the launch's arguments and the alignment's source.
        d = None if dt_bias is None else dt_bias.data_ptr()
        pointers = (
            q.data_ptr(), k.data_ptr(), v.data_ptr(), raw_g.data_ptr(),
            raw_beta.data_ptr(), A_log.data_ptr(), d, out.data_ptr(),
            initial_state.data_ptr(), cu_seqlens.data_ptr(),
            ssm_state_indices.data_ptr(),
        )  # fmt: skip
        misaligned = 0
        if (pointers[0] | pointers[1] | pointers[2] | pointers[3] | pointers[4]
                | pointers[5] | (d or 0) | pointers[7] | pointers[8]
                | pointers[9] | pointers[10]) & 15:  # fmt: skip
            misaligned = _misaligned(q, k, v, raw_g, raw_beta, A_log, dt_bias,
                                     out, initial_state, cu_seqlens,
                                     ssm_state_indices)  # fmt: skip
        signature = _recurrent_signature(
            q, k, v, raw_g, raw_beta, A_log, dt_bias, lower_bound,
            initial_state, cu_seqlens, ssm_state_indices, out, misaligned,
        )  # fmt: skip
        plan = _RECURRENT_SIGNATURES.get(signature)
        if plan is not None and _rows(decodes, q, k, v, raw_g, raw_beta, out,
                                      cu_seqlens, ssm_state_indices):  # fmt: skip
            plan.run(
                decodes * plan.programs_per_sequence, 1, 1,
                _current_stream(signature[0]), plan.function,
                plan.packed_metadata, None, None, None, *pointers, None,
                lower_bound, plan.scale, decodes, decode_tokens,
                *plan.constexprs,
            )  # fmt: skip
            return
    else:
        signature = None
    call = _decode_rows(
        decodes, decode_tokens, q, k, v, raw_g, raw_beta, A_log, dt_bias,
        lower_bound, initial_state, cu_seqlens, ssm_state_indices, out,
    )  # fmt: skip
    key = None
    if signature is not None and _on_gpu(q) and _recurrent_layout(*call):
        args = _recurrent_arguments(*call)
        key = _recurrent_key(args)
        plan = _RECURRENT_PLANS.get(key)
        if plan is not None:  # a kind planned already (the warm-up's)
            _RECURRENT_SIGNATURES[signature] = plan
            pointers = (a.data_ptr() if torch.is_tensor(a) else a for a in args)
            plan.run(
                decodes * plan.programs_per_sequence, 1, 1,
                _current_stream(key[0]), plan.function, plan.packed_metadata,
                None, None, None, *pointers,
            )  # fmt: skip
            return
    RECURRENT_STATS["vendored_calls"] += 1
    vendored(
        q=call[0], k=call[1], v=call[2], raw_g=call[3], raw_beta=call[4],
        A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
        initial_state=initial_state, cu_seqlens=call[9],
        ssm_state_indices=call[10], out=call[11],
    )  # fmt: skip
    if key is not None:
        plan = _plan_recurrent(args)
        if plan is not None:
            _RECURRENT_PLANS[key] = _RECURRENT_SIGNATURES[signature] = plan
            RECURRENT_STATS["plans_made"] += 1


def _on_gpu(tensor: torch.Tensor) -> bool:
    """Where plans are made (a test stands in for it on the CPU)."""
    return tensor.is_cuda


def _decode_rows(decodes, tokens, q, k, v, raw_g, raw_beta, A_log, dt_bias,
                 lower_bound, state, cu_seqlens, state_indices,
                 out) -> tuple:  # fmt: skip
    """The wrapper's arguments (in _recurrent_arguments' order) for the
    batch's first ``decodes`` sequences, ``tokens`` tokens."""
    return (
        q[:, :tokens], k[:, :tokens], v[:, :tokens], raw_g[:, :tokens],
        raw_beta[:, :tokens], A_log, dt_bias, lower_bound, state,
        cu_seqlens[: decodes + 1], state_indices[:decodes], out[:, :tokens],
    )  # fmt: skip


def _rows(decodes, q, k, v, raw_g, raw_beta, out, cu_seqlens, state_indices) -> bool:
    """Every tensor has the rows the decodes' launch reads or writes."""
    return (
        min(q.shape[1], k.shape[1], v.shape[1], raw_g.shape[1], raw_beta.shape[1],
            out.shape[1], state_indices.shape[0], cu_seqlens.shape[0] - 1)
        >= decodes
    )  # fmt: skip


def _recurrent_grid(args: tuple) -> int:
    """The wrapper's grid: a program per value block, sequence and head."""
    H, V = args[16], args[18]
    return -(-V // _RECURRENT_BV) * args[14] * H


def recurrent_warm_up_call(layer, state: torch.Tensor,
                           state_indices: torch.Tensor) -> tuple:  # fmt: skip
    """recurrent_kda_launched's arguments (after ``vendored``) for one
    decode of a mixed batch, laid out as ``layer`` (a Kimi KDA layer with
    the series) lays out its own call: q, k, v dense (the convolution's
    outputs), raw_g rows of the gate projection's output, raw_beta the
    fused projection's view cut by the layer's ``split_projection``, out
    rows of core_attn_out; ``state`` the layer's state pool and
    ``state_indices`` the step's (a column of the block table), as given."""
    calls = LayerCalls(layer, 1, state.device)
    beta = layer.split_projection(calls.projected)[3].unsqueeze(0)
    out = torch.empty_like(calls.q)
    cu_seqlens = torch.tensor([0, 1], dtype=torch.int32, device=state.device)
    return (
        1, 1, calls.q, calls.k, calls.v, calls.gate, beta, layer.A_log,
        layer.dt_bias, layer.gate_lower_bound, state, cu_seqlens,
        state_indices, out,
    )  # fmt: skip


def recurrent_call_kind(call: tuple) -> tuple | None:
    """The kind (plan key) of a recurrent_kda_launched call, from its
    arguments after ``vendored``; None for one no plan covers (it runs the
    wrapper)."""
    sliced = _decode_rows(*call)
    if call[0] != call[1] or not _recurrent_layout(*sliced):
        return None
    return _recurrent_key(_recurrent_arguments(*sliced))


@dataclass(frozen=True)
class RecurrentWarmUp:
    """What warm_up_recurrent_kda did."""

    layers: int  # layers warmed up
    kinds: int  # kinds of call those layers' decode calls are of
    plans: int  # recurrent plans ready now (any layer)
    made: int  # of those, made by this call
    seconds: float


def warm_up_recurrent_kda(
    layers, states, state_indices: torch.Tensor
) -> RecurrentWarmUp:
    """Plan the recurrent kernel for the decode calls Kimi KDA ``layers``
    make in mixed batches, before serving: ``states`` are their state pools
    (the KV cache's views), ``state_indices`` the step's state indices as
    the GDN builder cuts them (a column of the block table); their row
    strides are constexprs of the kernel. Triton compiles each kind's binary
    without launching it (nothing is written). Elsewhere than on a GPU with
    direct launches nothing is compiled; the kinds are still counted."""
    start = time.perf_counter()
    before = RECURRENT_STATS["plans_made"]
    kinds: set[tuple] = set()
    count = 0
    for layer, state in zip(layers, states, strict=True):
        count += 1
        call = recurrent_warm_up_call(layer, state, state_indices)
        kind = recurrent_call_kind(call)
        if kind is None:
            continue
        kinds.add(kind)
        if DIRECT and _on_gpu(state) and kind not in _RECURRENT_PLANS:
            plan = _plan_recurrent(_recurrent_arguments(*_decode_rows(*call)))
            if plan is not None:
                _RECURRENT_PLANS[kind] = plan
                RECURRENT_STATS["plans_made"] += 1
    return RecurrentWarmUp(
        count,
        len(kinds),
        len(_RECURRENT_PLANS),
        RECURRENT_STATS["plans_made"] - before,
        time.perf_counter() - start,
    )
