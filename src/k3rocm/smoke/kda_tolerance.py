"""How far a KDA kernel's results may be from the float64 reference
(``kda_reference``): the bound for a dtype and a path (``tolerance``),
derived below, and a kernel's errors in units of it (``excess``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from k3rocm.smoke.kda_recurrence import F64

# How the bound is built (first-order rounding error analysis; u is a
# format's unit roundoff: bfloat16 2^-8, float16 2^-11, float32 2^-24).
#
# The reference is exact for our purposes (float64, 2^-53) and reads the
# very values the kernel reads (bf16 inputs convert to float64 exactly), so
# input rounding is no error source; what differs is every later rounding:
#
# - storing in the input dtype: the output, and on the chunk path the
#   normalized q/k (l2norm_fwd writes the input dtype), Aqk/Akk, w, u, kg,
#   the per-chunk states h and v_new. One store errs by at most u where
#   casts round to nearest even (compiled Triton) and by less than 2u where
#   they truncate (the Triton interpreter's plain casts: ``truncating``).
#   The recurrent path keeps everything but the output in fp32 registers
#   and an fp32 state pool.
# - fp32 arithmetic: dot products of length n <= 128 (K <= 64 channels, a
#   64-token chunk): n * u32 worst case, sqrt(n) * u32 for independent
#   rounding errors, so eps_arith = sqrt(128) * 2^-24.
#
# Sizes: |q^| <= 1 and |k^| <= 1 (x / sqrt(|x|^2 + 1e-6)), beta in (0, 1),
# decay a = exp(g) in (0, 1]. One token maps each row s of the state (row v
# meets only element v of the values) by s -> s D (I - beta k k^T) +
# beta v[v] k^T, and s -> s D (I - beta k k^T) is non-expansive (|D| <= 1;
# I - beta k k^T has eigenvalues 1 and 1 - beta in (0, 1)), so
# |s_t| <= |s_0| + sum |v[v]|, and an error made at one token is never
# amplified by later ones: errors add. Every rounded quantity of a row is a
# product of factors bounded by 1 with a state row or a value, so at most
# ``peak`` (the largest |S_t[h, v, :]|_2 and |v_t[h, v]| the reference
# meets). A token's
# path through the kernels crosses about 8 rounded quantities (q^, k^ twice,
# A, w or u, kg, h, v_new); over m tokens the errors of the state add up to
# m * 8 * eps * peak in the worst case and to about sqrt(m) * 8 * eps * peak
# for independent roundings (probabilistic rounding error analysis, Higham
# and Mary 2019): we use lam = 8 for the count and take the sqrt(m) growth.
# The output reads the state through scale * q^: its error is its own store
# (relative) plus scale times the state's.
#
# So, for a sequence of at most m tokens:
#   |o - o_ref| <= out_rel * |o_ref row|_inf + out_abs   (per token and head)
#   |S - S_ref| <= state_abs                              (every element)
# with r = u_dtype (2 u_dtype truncating), eps = r + eps_arith on the chunk
# path and eps_arith on the recurrent path, out_rel = r + eps_arith,
# out_abs = lam * eps * sqrt(m + 1) * scale * peak and state_abs = lam * eps
# * sqrt(m + 1) * peak. Float32 inputs: eps ~ 7e-7, bounds ~1e-4 of the
# output's size (the interpreter's errors are ~100x below). bf16 on the
# chunk path (GPU only: the interpreter has no bf16 arithmetic): for m = 65,
# out_abs = 0.25 * scale * peak, a worst-case-leaning bound of the order
# of the outputs themselves; it still catches O(|o|) errors (a wrong gate,
# a lost or transposed state, a NaN) but not subtle ones, so a GPU check
# should report the measured ratio beside the verdict. Measured on the lent
# H200 (vLLM 0.27.1's chunk path as patched, head size 128, 2 heads,
# lengths 1 to 1,000 with empty sequences, both gates, caching allocator
# poisoned with NaN): largest output error 2.6e-4 to 7.2e-4 (outputs up to
# 0.18), 0.0003 to 0.009 of this bound, state errors 0.0002 to 0.005 of
# it; normwise ||o - o_ref|| / ||o_ref|| 3.3e-3 to 4.4e-3, i.e. 0.85 to
# 1.13 u. The errors did not grow with m there (the gates forget), the
# bound's sqrt(m) does.

UNIT_ROUNDOFF = {
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
    torch.float32: 2.0**-24,
}
EPS_ARITH = math.sqrt(128) * 2.0**-24
LAMBDA = 8.0
PATHS = ("chunk", "recurrent")


@dataclass(frozen=True)
class Tolerance:
    out_rel: float
    out_abs: float
    state_abs: float


def tolerance(
    dtype: torch.dtype,
    path: str,
    *,
    scale: float,
    peak: float,
    max_len: int,
    truncating: bool = False,
) -> Tolerance:
    """The bound above for inputs of ``dtype`` (q/k/v and the output; the
    states are float32) on ``path`` ('chunk' or 'recurrent'), with the
    reference's ``peak`` (see ``kda_sequence``), the longest sequence's
    length ``max_len``, and ``truncating`` casts (the Triton interpreter)."""
    if path not in PATHS:
        raise ValueError(f"path {path!r}, expected one of {PATHS}")
    store = UNIT_ROUNDOFF[dtype] * (2 if truncating else 1)
    eps = EPS_ARITH + (store if path == "chunk" else 0.0)
    state_abs = LAMBDA * eps * math.sqrt(max_len + 1) * peak
    return Tolerance(store + EPS_ARITH, state_abs * scale, state_abs)


def excess(
    out: torch.Tensor,
    out_ref: torch.Tensor,
    tol: Tolerance,
    state: torch.Tensor | None = None,
    state_ref: torch.Tensor | None = None,
) -> dict[str, float]:
    """How far a kernel's results are from the reference, in units of the
    tolerance: {'out': ..., 'state': ...}, each the largest error over its
    allowed error (<= 1 passes; NaN or inf where expected is finite gives
    inf). Rows of ``out_ref`` that are NaN (left unwritten by the kernel)
    are skipped. Outputs are [..., V] rows (token and head)."""
    out_ref = out_ref.to(F64)
    written = ~torch.isnan(out_ref).any(-1)
    error = (out.to(F64) - out_ref).abs().amax(-1)
    allowed = tol.out_rel * out_ref.abs().amax(-1) + tol.out_abs
    result = {"out": _worst(error[written], allowed[written])}
    if state is not None:
        state_error = (state.to(F64) - state_ref.to(F64)).abs()
        result["state"] = _worst(
            state_error, torch.full_like(state_error, tol.state_abs)
        )
    return result


def _worst(error: torch.Tensor, allowed: torch.Tensor) -> float:
    if error.numel() == 0:
        return 0.0
    error = torch.where(torch.isfinite(error), error, math.inf)
    return float((error / allowed).max())
