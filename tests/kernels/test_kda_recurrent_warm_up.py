"""The 0.32.0 series' recurrent warm-up (patches 0006-0007,
src/k3rocm/kernels/kda_recurrent_warm_up.py): every binary vLLM 0.32.0's
recurrent KDA wrapper asks Triton for while serving is one the warm-up
compiled before serving.

What a call compiles is told apart here as Triton tells it (its JIT cache
key, support.recurrent_launch_keys). The wrapper's kernel is
replaced by a recorder of those keys (no GPU here, and the interpreter
compiles nothing); the wrapper itself, its checks and its launch
configuration are 0.32.0's. Serving calls are random batches through the
real 0.32.0 GDN builder (its speculative and plain state indices, its
common length), laid out as each of the layer's recurrent calls; the Kimi
KDA layer is a stand-in with its attributes (a real one needs the model's
weights and a process group).
"""

import ast
import random
import types
from pathlib import Path

import pytest
import torch
from support.vllm_trees import ON_DEFAULT_LINE

pytestmark = pytest.mark.every_line
if ON_DEFAULT_LINE:  # the default line's series has no such module to import
    pytest.skip("the 0.32.0 line's recurrent warm-up", allow_module_level=True)

import vllm.models.kimi_k3.amd.ops.third_party.kda.fused_recurrent as fused_recurrent  # noqa: E402
from support.gdn_batches import Batch, build, make_builder  # noqa: E402
from support.recurrent_launch_keys import OPTED_OUT, Recorder  # noqa: E402
from vllm.models.kimi_k3.amd import kda_recurrent_warm_up as warm_up  # noqa: E402

from k3rocm.launcher.step_bound import PROVEN_TOKEN_HEADS  # noqa: E402

HEAD_DIM = 128
NUM_SPEC = 7  # dspark's draft tokens
MAX_NUM_SEQS = 256


def stand_in_layer(heads: int) -> types.SimpleNamespace:
    """A Kimi KDA layer's attributes as 0.32.0's amd/kda.py has them."""
    width = heads * HEAD_DIM
    projected = 4 * width + HEAD_DIM + heads  # qkv, output gate, gate input, beta
    state = torch.empty(64, heads, HEAD_DIM, HEAD_DIM)
    return types.SimpleNamespace(
        local_num_heads=heads, head_dim=HEAD_DIM, local_projection_size=width,
        in_proj_qkvgfab=types.SimpleNamespace(
            output_size_per_partition=projected, params_dtype=torch.bfloat16
        ),
        A_log=torch.zeros(heads), dt_bias=torch.zeros(width), gate_lower_bound=-5.0,
        kv_cache=(torch.empty(64, 3 * width, 3), state),
    )  # fmt: skip


def random_batch(rng: random.Random) -> Batch:
    spec = [rng.randint(1, NUM_SPEC + 1)] * rng.randint(1, MAX_NUM_SEQS // 2)
    if rng.random() < 0.3:  # a step no request drafted in: plain decodes
        spec = []
    if rng.random() < 0.5:  # requests of different lengths
        spec = [rng.randint(1, NUM_SPEC + 1) for _ in spec]
    decodes = rng.choice([0, 0, rng.randint(1, 64)])
    prefills = [rng.randint(2, 40) for _ in range(rng.choice([0, 0, 1, 3]))]
    if not spec and not decodes:
        decodes = 1
    return Batch(
        spec, decodes, prefills, 0, [50] * (len(spec) + decodes + len(prefills))
    )


def serving_calls(layer, builder, batch: Batch, layouts: dict, step: int) -> None:
    """The recurrent calls the layer makes for the batch's metadata, as
    amd/kda.py makes them: the speculative requests alone or gathered
    beside others, or plain decodes peeled off beside prefills; ``step``:
    the tokens of a step of plain decodes and prefills (its projections'
    rows), at least the batch's."""
    m = build(builder, batch, NUM_SPEC)
    state = layer.kv_cache[1]
    if m.spec_sequence_masks is not None:
        alone = m.num_prefills == 0 and m.num_decodes == 0
        name = "speculative step" if alone else "speculative requests beside others"
        indices = m.spec_state_indices_tensor
        n, t = m.num_spec_decodes, m.num_spec_decode_tokens
        common = m.uniform_spec_sequence_length
        args = (n, t, t, common, indices, m.num_accepted_tokens)
        call(layer, state, layouts[name], *args)
    if m.spec_sequence_masks is None and m.num_prefills and m.num_decodes:
        indices = m.non_spec_state_indices_tensor[: m.num_decodes]
        layout = layouts["plain decodes beside prefills"]
        n = m.num_decodes
        call(layer, state, layout, n, n, max(step, m.num_actual_tokens), None, indices)


def call(layer, state, layout, n, t, step, common, indices, accepted=None):
    """The wrapper called on the first ``t`` rows of storages as long as
    the layer's are in a step of ``step`` tokens (allocated, never touched:
    a long step's pass 2 GiB without using the memory)."""
    heads, width = layer.local_num_heads, layer.local_projection_size
    dtype = torch.bfloat16
    gathered = layout.beta_row == heads  # rows gathered beside other requests
    rows = t if gathered else step
    if layout.packed:  # the spec path's convolution output: its tokens alone
        qkv = torch.empty(t, 3 * width, dtype=dtype)
        q, k, v = (qkv[:, i * width : (i + 1) * width] for i in range(3))
    else:
        q, k, v = (torch.empty(step, width, dtype=dtype) for _ in range(3))
    q, k, v = (x[:t].unflatten(-1, (heads, HEAD_DIM))[None] for x in (q, k, v))
    beta = torch.empty(rows, layout.beta_row, dtype=dtype)[:t, layout.beta_column :]
    cu = torch.zeros(n + 1, dtype=torch.int32)
    fused_recurrent.fused_recurrent_kda(
        q=q, k=k, v=v,
        raw_g=torch.empty(1, rows, heads, HEAD_DIM, dtype=dtype)[:, :t],
        raw_beta=beta[None, :, :heads], A_log=layer.A_log, dt_bias=layer.dt_bias,
        lower_bound=layer.gate_lower_bound, initial_state=state, cu_seqlens=cu,
        ssm_state_indices=indices, num_accepted_tokens=accepted,
        uniform_sequence_length=common,
        out=torch.empty(1, rows, heads, HEAD_DIM, dtype=dtype)[:, :t],
    )  # fmt: skip


def missed(heads: int, monkeypatch, steps: int = 150) -> set:
    """Keys of serving calls the warm-up did not compile."""
    recorder = Recorder()
    monkeypatch.setattr(fused_recurrent, "fused_recurrent_kda_fwd_kernel", recorder)
    layer = stand_in_layer(heads)
    builder = make_builder(fused_recurrent_builder(), NUM_SPEC)
    builder.vllm_config.scheduler_config.max_num_seqs = MAX_NUM_SEQS
    first = build(builder, Batch([1], 0, [], 0, [50]), NUM_SPEC)
    indices_row = first.spec_state_indices_tensor.stride(0)
    # The launcher's largest step at this head count.
    largest = PROVEN_TOKEN_HEADS // heads
    done = warm_up.warm_up_recurrent_kda([layer], indices_row, NUM_SPEC, MAX_NUM_SEQS,
                                         largest)  # fmt: skip
    assert done.layers == 1 and done.calls > 0 and not recorder.launched
    layouts = {
        layout.call: layout
        for layout in warm_up.layer_layouts(layer, indices_row, NUM_SPEC)
    }
    layouts.setdefault(
        "speculative step", layouts.get("speculative step, persistent indices")
    )
    rng = random.Random(heads)
    # First a speculative request of one token alone and beside a decode
    # (the token stride of a size-1 dimension), then random batches.
    one_token = [Batch([1], 0, [], 0, [50]), Batch([1], 1, [], 0, [50, 50])]
    for batch in [*one_token, *(random_batch(rng) for _ in range(steps))]:
        step = rng.choice([0, 0, rng.randint(1, largest), largest])
        serving_calls(layer, builder, batch, layouts, step)
    assert recorder.launched
    return recorder.launched - recorder.compiled


def fused_recurrent_builder():
    from vllm.models.kimi_k3.amd.kda_metadata import KimiK3ROCmKDAMetadataBuilder

    return KimiK3ROCmKDAMetadataBuilder


@pytest.mark.parametrize("heads", (12, 6, 96))
def test_every_serving_launch_was_compiled_by_the_warm_up(heads, monkeypatch):
    assert missed(heads, monkeypatch) == set()


def uniform_only(batch_sizes):
    def sizes(*args):
        # The speculative calls without a common length dropped.
        return [(n, t, common) for n, t, common in batch_sizes(*args)
                if common is not None or n == t]  # fmt: skip

    return sizes


PLANTED = {
    "the cover stops at the first gate": ("LAST_GATE", 24),
    "no requests of different lengths": ("batch_sizes", uniform_only),
    "no storage past 2 GiB": ("over_2gib", lambda *args: [frozenset()]),
}


@pytest.mark.parametrize(
    ("planted", "heads"),
    (
        ("the cover stops at the first gate", 12),
        ("no requests of different lengths", 6),
        ("no storage past 2 GiB", 12),
    ),
)
def test_a_cover_short_of_serving_misses_launches(planted, heads, monkeypatch):
    name, value = PLANTED[planted]
    if value is uniform_only:
        value = uniform_only(warm_up.batch_sizes)
    monkeypatch.setattr(warm_up, name, value)
    assert missed(heads, monkeypatch)


def test_the_cover_reaches_0_32_0s_last_launch_configuration_gate():
    """LAST_GATE is the largest head-sequence bound of the wrapper's gates,
    and the kernel keeps the batch's sizes out of Triton's integer classes
    (what lets the cover stop one request past that gate)."""
    assert {"N", "T"} <= OPTED_OUT
    tree = ast.parse(Path(fused_recurrent.__file__).read_text())
    bounds = [
        node.comparators[0].value
        for function in tree.body
        if isinstance(function, ast.FunctionDef)
        and function.name
        in ("_get_static_sequence_length", "_select_kda_launch_config")
        for node in ast.walk(function)
        if isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Name)
        and node.left.id == "head_sequences"
    ]
    assert bounds and max(bounds) == warm_up.LAST_GATE


def test_the_rocm_builder_warms_up_at_its_first_build_with_each_state_pool(
    monkeypatch,
):
    recorder = Recorder()
    monkeypatch.setattr(fused_recurrent, "fused_recurrent_kda_fwd_kernel", recorder)
    builder = make_builder(fused_recurrent_builder(), NUM_SPEC)
    layer = stand_in_layer(12)
    pools, layer.kv_cache = layer.kv_cache, []  # the KV cache is not bound yet
    context = builder.vllm_config.compilation_config.static_forward_context
    [name] = builder.layer_names
    context[name] = layer
    step = Batch([NUM_SPEC + 1], 0, [], 0, [50])
    build(builder, step, NUM_SPEC)
    assert builder.recurrent_warm_up is None and not recorder.compiled
    layer.kv_cache = pools
    build(builder, step, NUM_SPEC)
    warmed, compiled = builder.recurrent_warm_up, len(recorder.compiled)
    assert warmed.layers == 1 and warmed.layouts >= 3 and compiled
    build(builder, step, NUM_SPEC)
    assert builder.recurrent_warm_up is warmed and len(recorder.compiled) == compiled
    # The KV cache bound again (vLLM's profiling run's, then the real one):
    # a pool with another row stride, warmed at the next build.
    state = pools[1]
    wider = torch.empty(state.shape[0], state[0].numel() + 64)
    layer.kv_cache = (pools[0], wider[:, : state[0].numel()].view(state.shape))
    build(builder, step, NUM_SPEC)
    assert builder.recurrent_warm_up is not warmed
    assert len(recorder.compiled) > compiled
    assert not recorder.launched  # compiled only: nothing ran, nothing written


def test_beta_sits_where_the_layers_forward_splits_it():
    """layer_layouts puts beta at 4 projections + head_dim into the fused
    projection's row: 0.32.0's forward splits [3 projections (q, k, v), a
    projection (output gate), head_dim (gate input), heads (beta)]."""
    import vllm.models.kimi_k3.amd.kda as kda

    tree = ast.parse(Path(kda.__file__).read_text())
    [forward] = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "forward"
        and "split_sizes" in ast.unparse(node)
    ]  # fmt: skip
    [sizes] = [
        node.value
        for node in ast.walk(forward)
        if isinstance(node, ast.Assign)
        and ast.unparse(node.targets[0]) == "split_sizes"
    ]
    assert [ast.unparse(e) for e in sizes.elts] == [
        "3 * self.local_projection_size",
        "self.local_projection_size",
        "self.head_dim",
        "self.local_num_heads",
    ]
    unpacked = [
        ast.unparse(node.targets[0])
        for node in ast.walk(forward)
        if isinstance(node, ast.Assign) and ast.unparse(node.value) == "projected[:4]"
    ]
    assert unpacked == ["(mixed_qkv, g_proj_states, f_a, beta)"]
    layer = stand_in_layer(12)
    [plain] = warm_up.layer_layouts(layer, 9, 0)
    assert plain.beta_column == 4 * layer.local_projection_size + layer.head_dim
