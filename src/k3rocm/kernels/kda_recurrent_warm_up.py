# SPDX-License-Identifier: Apache-2.0
# Added by the kimi-k3-rocm patch series (not part of upstream vLLM 0.32.0).
# Generated from kimi-k3-rocm's src/k3rocm/kernels/kda_recurrent_warm_up.py by
# `k3rocm patchgen`: edit that file, not this one.
"""Compile, before serving, every binary vLLM 0.32.0's recurrent KDA kernel
can be asked for while serving.

0.32.0's wrapper (``fused_recurrent_kda_fwd``) picks a launch configuration
per call: the value block and the pipeline stages from the head-sequence
count, and for speculative steps the requests' common length, compiled in
as a constant (``SEQUENCE_LENGTH``, ``IS_SINGLE_SEQUENCE``); the request
and token counts themselves are opted out of Triton's integer classes
(``do_not_specialize``). Each new configuration is a compile in the middle
of a step:
on an H100, 9 binaries after a 50-step warm-up over 3,000 dspark steps
(kimi-k3-rocm docs/benchmarks.md, run M). The ROCm builder calls
``warm_up_recurrent_kda`` at its first build, when the layers' state pools
exist and before the server reports ready. It hands the wrapper, to compile
only (``compile_only``: nothing is launched or written), every batch the
cover below reaches, laid out as the Kimi KDA layer (amd/kda.py) lays out
each of its recurrent calls, with the layer's own parameters and state pool.

The cover: the launch configuration follows the head-sequence count up to
``LAST_GATE`` (the largest bound in 0.32.0's two gates, a test reads them)
and no further, so every request count up to one past it, each with every
token count a speculative batch of it can have (1 to num_spec + 1 tokens a
request), with and without a common length. On AMD, Triton also
compiles a pointer apart when its tensor's storage passes 2 GiB: a long
step's projections do (at 96 heads a rank the fused projection's past about
21,700 tokens), so each batch is handed again with each set of tensors
that can pass it together at the scheduler's largest step (``over_2gib``),
marked rather than allocated (``Over2GiB``).
"""

import time
from dataclasses import dataclass

import torch

from .kda_direct_launch import POINTER_RANGE
from .ops.third_party.kda.fused_recurrent import fused_recurrent_kda

# 0.32.0's _get_static_sequence_length and _select_kda_launch_config compare
# the head-sequence count with 24, 48 and 192.
LAST_GATE = 192
# Triton compiles a pointer apart when it is 16-byte aligned.
ALIGNMENT = 16


class Over2GiB(torch.Tensor):
    """A tensor that tells Triton its storage passes 2 GiB without holding
    it: is_within_2gb asks ``ptr_range`` before the storage's size. Other
    backends ask nothing: there it compiles as the tensor it is."""

    def ptr_range(self) -> int:
        return POINTER_RANGE + 1


@dataclass(frozen=True)
class RecurrentLayout:
    """How one of the layer's recurrent calls lays its inputs out.

    ``packed``: q, k, v are the three column blocks of one row-major
    buffer (the spec path's convolution output), else three dense buffers
    (the prefill convolution's). raw_beta is ``heads`` columns at
    ``beta_column`` of rows ``beta_row`` elements wide. raw_g and out are
    dense. The state indices are rows ``indices_row`` apart: a block of
    num_spec + 1 columns for a speculative call, one column otherwise."""

    call: str
    spec: bool
    packed: bool
    beta_row: int
    beta_column: int
    indices_row: int


def layer_layouts(
    layer, indices_row: int, num_spec: int
) -> tuple[RecurrentLayout, ...]:
    """The layouts of ``layer``'s recurrent calls (0.32.0's amd/kda.py).

    ``forward`` splits the fused projection into [3 x projection (q, k,
    v), projection (output gate), head_dim (gate input), heads (beta)] and
    keeps beta as a view; ``indices_row`` is the row stride of the block
    table the GDN builder cuts the state indices from. A speculative step
    alone hands the wrapper those views and block-table rows (or the
    builder's persistent [*, num_spec + 1] buffer); beside other requests
    its rows are gathered (index_select: dense beta, [*, num_spec + 1]
    indices). Plain decodes beside prefills take the prefill convolution's
    outputs, the beta view and one block-table column."""
    width = layer.local_projection_size
    beta_column = 4 * width + layer.head_dim
    projected = layer.in_proj_qkvgfab.output_size_per_partition
    layouts = [
        RecurrentLayout(
            "plain decodes beside prefills",
            False,
            False,
            projected,
            beta_column,
            indices_row,
        ),
    ]
    if num_spec:
        spec_row = num_spec + 1
        layouts.append(
            RecurrentLayout(
                "speculative step", True, True, projected, beta_column, indices_row
            )
        )
        if indices_row != spec_row:
            layouts.append(
                RecurrentLayout(
                    "speculative step, persistent indices",
                    True,
                    True,
                    projected,
                    beta_column,
                    spec_row,
                )
            )
        layouts.append(
            RecurrentLayout(
                "speculative requests beside others",
                True,
                True,
                layer.local_num_heads,
                0,
                spec_row,
            )
        )
    return tuple(layouts)


def batch_sizes(spec: bool, num_spec: int, heads: int, max_num_seqs: int,
                max_num_batched_tokens: int):  # fmt: skip
    """(requests, tokens, common length or None) of every call the cover
    makes for one layout."""
    last = min(max_num_seqs, LAST_GATE // heads + 1)
    for n in range(1, last + 1):
        if not spec:
            if n <= max_num_batched_tokens:
                yield n, n, None
            continue
        most = min(n * (num_spec + 1), max_num_batched_tokens)
        for t in range(n, most + 1):
            if t % n == 0:
                yield n, t, t // n
            if n < t < n * (num_spec + 1):  # requests of different lengths
                yield n, t, None


def _dtype(layer):
    """What the fused projection (so the convolutions, beta, core_attn_out)
    outputs."""
    return layer.in_proj_qkvgfab.params_dtype


def over_2gib(layer, layout: RecurrentLayout, num_spec: int, max_num_seqs: int,
              max_num_batched_tokens: int) -> list[frozenset[str]]:  # fmt: skip
    """Which of a call's tensors can have storages past 2 GiB together, for
    steps up to the scheduler's limits: the empty set first. The step's
    tensors grow with its tokens, each by its storage's row: the fused
    projection's (beta's view), the gate projection's and core_attn_out's
    (raw_g, out: the step's padded tokens), the convolution outputs' (q, k,
    v: its actual tokens, 3 projections wide where packed); gathered rows
    hold the speculative tokens alone."""
    size = _dtype(layer).itemsize
    width, heads = layer.local_projection_size, layer.local_num_heads
    projected = layer.in_proj_qkvgfab.output_size_per_partition
    qkv = frozenset("qkv")
    gate_out = frozenset({"raw_g", "out"})
    beta = frozenset({"raw_beta"})
    if not layout.spec:
        rows = max_num_batched_tokens
        groups = [(beta, projected), (gate_out, width), (qkv, width)]
    else:
        rows = min(max_num_seqs * (num_spec + 1), max_num_batched_tokens)
        if layout.beta_row == heads:  # gathered beside other requests
            groups = [(qkv, 3 * width), (gate_out, width), (beta, heads)]
        else:
            groups = [(beta, projected), (qkv, 3 * width), (gate_out, width)]
    sets, over = [frozenset()], frozenset()
    for names, row in groups:  # widest rows first: they pass 2 GiB first
        if rows * row * size > POINTER_RANGE:
            over |= names
            sets.append(over)
    return sets


def _compile_layout(layer, state: torch.Tensor, layout: RecurrentLayout,
                    num_spec: int, max_num_seqs: int,
                    max_num_batched_tokens: int) -> int:  # fmt: skip
    """Hand the wrapper every batch of ``batch_sizes`` in ``layout`` to
    compile, with each set of ``over_2gib`` tensors; the number of calls."""
    heads, dim = layer.local_num_heads, layer.head_dim
    width = layer.local_projection_size
    limits = (num_spec, max_num_seqs, max_num_batched_tokens)
    sizes = list(batch_sizes(layout.spec, num_spec, heads, max_num_seqs,
                             max_num_batched_tokens))  # fmt: skip
    rows = max(t for _, t, _ in sizes)
    requests = max(n for n, _, _ in sizes)
    dtype, device = _dtype(layer), state.device

    def buffer(*shape, kind=dtype):
        return torch.empty(*shape, dtype=kind, device=device)

    if layout.packed:
        qkv = buffer(rows, 3 * width)
        q, k, v = (qkv[:, i * width : (i + 1) * width] for i in range(3))
    else:
        q, k, v = (buffer(rows, width) for _ in range(3))
    beta = buffer(rows, layout.beta_row)[:, layout.beta_column :][:, :heads]
    tensors = {
        "q": q, "k": k, "v": v, "raw_g": buffer(rows, width), "raw_beta": beta,
        "out": buffer(rows, width),
    }  # fmt: skip

    def first(name: str, x: torch.Tensor, t: int) -> torch.Tensor:
        """A call's first ``t`` rows, viewed as the layer's rearrange views
        them: a call of one token gets the token stride torch gives a size-1
        dimension (for the spec path's q, k, v one projection, not three),
        and the kernel compiles that stride in."""
        if name == "raw_beta":
            return x[None, :t]
        return x[:t].unflatten(-1, (heads, dim))[None]

    cu_seqlens = torch.zeros(requests + 1, dtype=torch.int32, device=device)
    accepted = torch.ones(requests, dtype=torch.int32, device=device)
    table = torch.zeros(requests, layout.indices_row, dtype=torch.int32, device=device)
    indices = table[:, : num_spec + 1] if layout.spec else table[:, 0]
    sets = over_2gib(layer, layout, *limits)
    for over in sets:
        given = {
            name: x.as_subclass(Over2GiB) if name in over else x
            for name, x in tensors.items()
        }
        for n, t, common in sizes:
            fused_recurrent_kda(
                **{name: first(name, x, t) for name, x in given.items()},
                A_log=layer.A_log, dt_bias=layer.dt_bias,
                lower_bound=layer.gate_lower_bound, initial_state=state,
                cu_seqlens=cu_seqlens[: n + 1], ssm_state_indices=indices[:n],
                num_accepted_tokens=accepted[:n] if layout.spec else None,
                uniform_sequence_length=common, compile_only=True,
            )  # fmt: skip
    return len(sizes) * len(sets)


@dataclass(frozen=True)
class RecurrentWarmUp:
    """What warm_up_recurrent_kda did."""

    layers: int  # layers with a state pool
    layouts: int  # distinct (layer kind, layout) pairs compiled for
    calls: int  # calls handed to the wrapper to compile
    seconds: float


def _kind(layer, state: torch.Tensor, layout: RecurrentLayout) -> tuple:
    """Everything a layer adds to a layout's binaries: layers alike share them."""
    optional = (layer.dt_bias, layer.gate_lower_bound)
    return (
        layout, layer.local_num_heads, layer.head_dim, layer.local_projection_size,
        _dtype(layer), layer.A_log.dtype, state.dtype, state.shape[1:],
        state.stride(), str(state.device), state.data_ptr() % ALIGNMENT,
        tuple(None if x is None else type(x) for x in optional),
        None if layer.dt_bias is None else layer.dt_bias.dtype,
    )  # fmt: skip


def state_pool(layer) -> torch.Tensor | None:
    """The layer's recurrent state pool once the KV cache is bound, else None."""
    cache = getattr(layer, "kv_cache", None)
    if not isinstance(cache, list | tuple) or len(cache) != 2:
        return None
    state = cache[1]
    return state if torch.is_tensor(state) and state.dim() == 4 else None


def warm_up_recurrent_kda(layers, indices_row: int, num_spec: int, max_num_seqs: int,
                          max_num_batched_tokens: int) -> RecurrentWarmUp:  # fmt: skip
    """Compile the recurrent binaries ``layers`` (Kimi KDA layers whose KV
    cache is bound) can need while serving; layers of one kind share them."""
    start = time.perf_counter()
    done: set[tuple] = set()
    calls = count = 0
    for layer in layers:
        state = state_pool(layer)
        if state is None:
            continue
        count += 1
        for layout in layer_layouts(layer, indices_row, num_spec):
            kind = _kind(layer, state, layout)
            if kind not in done:
                done.add(kind)
                calls += _compile_layout(layer, state, layout, num_spec, max_num_seqs,
                                         max_num_batched_tokens)  # fmt: skip
    return RecurrentWarmUp(count, len(done), calls, time.perf_counter() - start)
