# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.27.1).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_launch_warm_up.py by
# `k3rocm patchgen`: edit that file, not this one.
"""The warm-ups that make the precompiled launches' plans before serving.

``warm_up_chunk_kda`` makes, for each Kimi KDA layer, the chunk plans of
every token count's specialization, through the launch's own entry point
(kda_launch_entry.py), so a kind is planned exactly as a serving call would
plan it; the ROCm builder (patch 0002) calls it when it is built.
``warm_up_recurrent_kda`` plans the layers' recurrent decode calls for
their real state pools and block table, and ``warm_up_spec_recurrent_kda``
compiles their speculative calls, which the builder does at its first
build. They lay their calls out as the layer (patch 0004) lays out its own.
"""

import time
from dataclasses import dataclass

import torch
from einops import rearrange
from vllm.third_party.flash_linear_attention.ops.utils import FLA_CHUNK_SIZE

from .kda_chunk_plans import call_kind
from .kda_direct_launch import DIRECT
from .kda_launch_entry import (
    _PLANS,
    _RECURRENT_PLANS,
    RECURRENT_STATS,
    STATS,
    chunk_kda_launched,
)
from .kda_recurrent_plans import (
    _compile_recurrent,
    _decode_rows,
    _on_gpu,
    _plan_recurrent,
    _recurrent_arguments,
    _recurrent_key,
    recurrent_call_kind,
)

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


# A speculative step's recurrent call goes through vLLM's wrapper, no plan
# (the layer's spec path is 0.27.1's), and the kernel compiles the token
# strides in. The layer lays the call out one way in a step of spec decodes
# only (slices of the step's buffers) and another beside other requests
# (index_select copies; the wrapper allocates the output). Both of 0.27.1's
# runners make a request a spec decode only when it has drafts, so a call
# has two tokens or more (no stride of a dimension of size 1).
SPEC_STEP = "speculative step"
SPEC_BESIDE_OTHERS = "speculative requests beside others"
SPEC_LAYOUTS = (SPEC_STEP, SPEC_BESIDE_OTHERS)


def spec_warm_up_call(layer, state: torch.Tensor, num_spec: int,
                      layout: str) -> tuple:  # fmt: skip
    """The kernel's arguments for one spec request of ``num_spec`` + 1
    tokens, laid out as ``layer`` lays out its spec call in ``layout``: q, k,
    v the convolution update's output (three projections a row, viewed with
    the layer's own rearrange), raw_g the gate projection's rows, raw_beta
    the fused projection's view cut by ``split_projection``, out
    core_attn_out's rows; beside others raw_g and raw_beta gathered, out the
    wrapper's ``empty_like(v)``. The state indices are a row of the
    builder's spec indices (num_spec + 1 columns); ``state`` the layer's
    pool. Nothing is written: the tensors are only laid out."""
    heads, dim = layer.local_num_heads, layer.head_dim
    width = heads * dim
    tokens = num_spec + 1
    dtype = layer.in_proj_qkvgfab.params_dtype
    device = state.device

    def empty(*size, dtype=dtype):
        return torch.empty(*size, dtype=dtype, device=device)

    q, k, v = (
        rearrange(x, "n (h d) -> 1 n h d", d=dim)
        for x in empty(tokens, 3 * width).split(width, dim=-1)
    )
    raw_g = rearrange(empty(tokens, width), "n (h d) -> 1 n h d", d=dim)
    projected = empty(tokens, layer.in_proj_qkvgfab.output_size_per_partition)
    raw_beta = layer.split_projection(projected)[3].unsqueeze(0)
    if layout == SPEC_STEP:  # the first rows of a (padded) forward's output
        out = empty(1, tokens + 1, heads, dim)[:, :tokens]
    else:
        index = torch.arange(tokens, device=device)
        raw_g, raw_beta = raw_g.index_select(1, index), raw_beta.index_select(1, index)
        out = torch.empty_like(v)
    return _recurrent_arguments(
        q, k, v, raw_g, raw_beta, layer.A_log, layer.dt_bias,
        layer.gate_lower_bound, state,
        torch.tensor([0, tokens], dtype=torch.int32, device=device),
        torch.zeros(1, tokens, dtype=torch.int32, device=device), out,
        num_accepted_tokens=torch.ones(1, dtype=torch.int32, device=device),
    )  # fmt: skip


@dataclass(frozen=True)
class SpecWarmUp:
    """What warm_up_spec_recurrent_kda did."""

    layers: int  # layers warmed up
    kinds: int  # kinds of spec call they make: a binary each
    seconds: float


def warm_up_spec_recurrent_kda(layers, states, num_spec: int) -> SpecWarmUp:
    """Compile, before serving, the recurrent kernel's binary for each kind
    of speculative call Kimi KDA ``layers`` make (each layout of
    SPEC_LAYOUTS with each layer's state pool ``states``); nothing is
    launched. Elsewhere than on a GPU nothing is compiled; the kinds are
    still counted. As the other warm-ups, it compiles AMD's 2 GiB pointer
    class of its own calls only: a spec step whose own tensors pass 2 GiB
    (spec decodes only, past about 21,700 tokens at 96 heads: 2,700
    requests, over 20 times the recipe's --max-num-seqs) compiles once."""
    start = time.perf_counter()
    kinds: dict[tuple, tuple] = {}
    for layer, state in zip(layers, states, strict=True):
        for layout in SPEC_LAYOUTS:
            args = spec_warm_up_call(layer, state, num_spec, layout)
            kinds.setdefault(_recurrent_key(args), args)
    for args in kinds.values():
        if _on_gpu(args[0]):
            _compile_recurrent(args)
    return SpecWarmUp(len(states), len(kinds), time.perf_counter() - start)
