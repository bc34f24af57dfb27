# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.27.1).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_chunk_plans.py by
# `k3rocm patchgen`: edit that file, not this one.
"""The plans of the precompiled chunk KDA launches, and their guard.

A *plan* holds, for one kind of call, the compiled binary of every kernel
the call runs and the autotuned configuration it was compiled with. The
kind of call (``_call_key``) is everything Triton's choice of binary can
depend on: devices, dtypes, the fixed dimensions, which optional inputs are
given, the 16-byte alignment of every input pointer, and the specialization
class (1, a multiple of 16, other) of every integer argument Triton
specializes. A plan is read back from Triton's own caches right after
vLLM's own path ran a call of its kind, for exactly the arguments that call
used (``JITFunction.run(..., warmup=True)``: the binary the dispatcher
launched), so no binary of a plan was chosen by anything but Triton. The
guard (``outside_allowed_configs``) refuses a plan whose configuration is
not on its kernel's autotune list (patch 0008).

Nothing here keeps plans or launches them: kda_launch_entry.py does both.
"""

import math
from dataclasses import dataclass

import torch
from vllm.logger import init_logger
from vllm.third_party.flash_linear_attention.ops import l2norm as _l2norm_module
from vllm.triton_utils import triton

from .kda_chunk_forward import (
    SITES,
    _forward,
    _platform_constants,
    carved_bytes,
    final_state_shape,
    prepare,
    site_kernel,
)
from .kda_direct_launch import (
    POINTER_RANGE,
    _direct,
    _far,
    _misaligned,
    int_class,
    unwrap,
)

logger = init_logger(__name__)

# The values _forward takes from each autotuned site's configuration.
_CONFIG_VALUES = {
    "gate": ("BS",),
    "inter_solve": ("BK",),
    "delta_h": ("BV",),
    "output": ("BK", "BV"),
}


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
    inputs are given, every input pointer's 16-byte alignment, which
    storages pass 2 GiB (the inputs', the intermediates' one allocation,
    the final states': AMD's pointer class), and the specialization class
    of every integer argument (the token count only through these classes:
    T is never specialized itself)."""
    T = q.shape[1]
    beta_strides = raw_beta.stride()
    num_seqs = cu_seqlens.shape[0] - 1
    carved = carved_bytes(q, k, v, raw_g, raw_beta, use_l2norm, chunk_indices.shape[0])
    final_state = math.prod(final_state_shape(num_seqs, k, v)) * 4  # float32
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
        int_class(num_seqs, specialized=False),
        _far(q, k, v, raw_g, raw_beta, A_log, g_bias, initial_state, cu_seqlens,
             chunk_indices, chunk_offsets),
        carved > POINTER_RANGE,
        bool(output_final_state) and final_state > POINTER_RANGE,
    )  # fmt: skip


def call_kind(args: tuple) -> tuple:
    """The kind (plan key) of a chunk_kda_with_fused_gate call, from its
    arguments in the function's parameter order."""
    return _call_key(*prepare(*args))
