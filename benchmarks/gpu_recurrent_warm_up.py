"""The 0.32.0 line's recurrent warm-up (series k4.1, patches 0006-0007) on a
GPU: does serving still compile recurrent KDA binaries after it?

For each per-rank head count (12, 6, 96): a stand-in Kimi KDA layer (the
attributes amd/kda.py's layer has, random parameters, a state pool), then
either the series' warm-up (``warm_up_recurrent_kda``, as the builder calls
it) or, as the baseline, 50 of the serving calls below run first (what
gpu_spec.py's compiles part does); then serving-like recurrent calls
through 0.32.0's real wrapper, laid out as the layer lays out each of its
three (a speculative step alone, on block-table rows; speculative requests
gathered beside others; plain decodes beside prefills), 1 to 256
requests, dspark's 7 draft tokens, counting the recurrent kernel's binaries
new after the warm-up. Both arms in one process per head count, each
starting with no binary in the process (``forget_binaries``: until k4.3's
runs the series' arm ran after the baseline's with its binaries still
there, so a call the baseline had compiled was no miss of the warm-up's).

    K3_LINE=0.32.0 python3 gpu_recurrent_warm_up.py   # needs .gpu/line-0.32.0
    # CPU dry run (2 heads, a few calls, no binaries counted):
    K3_WARM_DEVICE=cpu TRITON_INTERPRET=1 K3_LINE=0.32.0 python3 \
        gpu_recurrent_warm_up.py

Writes $OUT/recurrent-warm-up.json.
"""

import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

DEV = os.environ.get("K3_WARM_DEVICE", "cuda")
DRY = DEV == "cpu"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import kda_harness  # noqa: E402
from kda_harness import HEAD_DIM, load_tree  # noqa: E402

load_tree("patched")

from vllm.models.kimi_k3.amd import kda_recurrent_launch as recurrent_launch  # noqa: E402
from vllm.models.kimi_k3.amd import kda_recurrent_warm_up as warm_up  # noqa: E402
from vllm.models.kimi_k3.amd.kda_direct_launch import unwrap  # noqa: E402
from vllm.models.kimi_k3.amd.ops.third_party.kda import fused_recurrent  # noqa: E402

from k3rocm.launcher.step_bound import PROVEN_TOKEN_HEADS  # noqa: E402
from k3rocm.smoke.interpreter import interpretable, kda_kernels  # noqa: E402

NUM_SPEC = 7  # dspark's draft tokens
GPU_MAX_NUM_SEQS, GPU_DT = 256, torch.bfloat16  # a GPU run's (a dry run's smaller)
MAX_NUM_SEQS = 4 if DRY else GPU_MAX_NUM_SEQS
TABLE_ROW = NUM_SPEC + 4  # a block table wider than the spec block
STATE_SLOTS = 513  # 3.2 GB of float32 state at 96 heads: past 2 GiB
LOWER_BOUND = -5.0
DT = torch.float32 if DRY else GPU_DT


def _recurrent_jit():
    jit, _ = unwrap(fused_recurrent.fused_recurrent_kda_fwd_kernel)
    return jit


def binaries() -> int | None:
    """The recurrent kernel's binaries in this process (None: the interpreter)."""
    return kda_harness.binaries(_recurrent_jit())


def forget_binaries() -> None:
    """Each arm starts with none in the process: it counts what its own
    warm-up and calls bring in (compiled, or read from Triton's disk cache),
    never the other arm's; nor direct-launch plans (k4.2's), which hold
    binaries read back from that cache."""
    kda_harness.forget_binaries(_recurrent_jit())
    recurrent_launch.PLANS.clear()


def stand_in_layer(heads: int, slots: int, random_state: bool = True):
    """The attributes of a Kimi KDA layer that its recurrent calls read (a
    state pool left unwritten when nothing runs on it: a key replay)."""
    width = heads * HEAD_DIM
    pool = torch.empty(slots, heads, HEAD_DIM, HEAD_DIM, device=DEV)
    if random_state:
        pool.normal_(0.0, 0.1)

    class Projection:
        output_size_per_partition = 4 * width + HEAD_DIM + heads
        params_dtype = DT

    class Layer:
        local_num_heads, head_dim, local_projection_size = heads, HEAD_DIM, width
        in_proj_qkvgfab = Projection
        A_log = torch.randn(heads, device=DEV)
        dt_bias = torch.randn(width, device=DEV)
        gate_lower_bound = LOWER_BOUND
        state = pool
        kv_cache = (None, pool)

    return Layer


def gathered_spec_indices(table: torch.Tensor) -> torch.Tensor:
    """Speculative requests' state indices beside others, gathered with a
    mask as 0.32.0's GDN builder gathers them: a new [n, NUM_SPEC + 1]
    tensor. (.contiguous() of one request's row keeps the table's row
    stride, which the kernel compiles in: until 2026-12-07 this harness did
    that, 7 misses no layer makes.)"""
    rows = torch.ones(table.shape[0], dtype=torch.bool, device=table.device)
    return table[rows, : NUM_SPEC + 1]


def call_layouts(layer) -> dict:
    """The layer's recurrent calls' layouts, by call."""
    return {x.call: x for x in warm_up.layer_layouts(layer, TABLE_ROW, NUM_SPEC)}


def series_warm_up(layer) -> dict:
    """The series' warm-up as the builder calls it, up to the launcher's
    largest step (on AMD its storages pass 2 GiB)."""
    largest = PROVEN_TOKEN_HEADS // layer.local_num_heads
    done = warm_up.warm_up_recurrent_kda(
        [layer], TABLE_ROW, NUM_SPEC, MAX_NUM_SEQS, largest
    )
    return {"layouts": done.layouts, "calls": done.calls}


def serving_arguments(layer, layouts: dict, rng: random.Random) -> tuple[str, dict]:
    """The path and arguments of one recurrent call of a random step, laid
    out as the layer makes it (tests/benchmarks replays them through a
    recorder of Triton's cache keys)."""
    path = rng.choice(["speculative step"] * 3 + ["beside others", "plain decodes"])
    n = rng.choice([1, 2, 3, 4, 8, 16, rng.randint(1, MAX_NUM_SEQS)])
    n = min(n, MAX_NUM_SEQS)
    spec = path != "plain decodes"
    if spec and rng.random() < 0.7:
        lengths = [NUM_SPEC + 1] * n
    elif spec:
        lengths = [rng.randint(1, NUM_SPEC + 1) for _ in range(n)]
    else:
        lengths = [1] * n
    t = sum(lengths)
    heads, width = layer.local_num_heads, layer.local_projection_size
    layout = layouts[
        {
            "speculative step": "speculative step",
            "beside others": "speculative requests beside others",
            "plain decodes": "plain decodes beside prefills",
        }[path]
    ]
    # Slot 0 left out, as vLLM's null block; requests may share a slot here.
    table = torch.randint(1, layer.state.shape[0], (n, TABLE_ROW), device=DEV).int()
    if path == "speculative step":
        indices = table[:, : NUM_SPEC + 1]
    elif path == "beside others":
        indices = gathered_spec_indices(table)
    else:
        indices = table[:, 0]

    def rows(width_of_row):
        return torch.randn(t, width_of_row, device=DEV).to(DT)

    if layout.packed:
        qkv = rows(3 * width)
        q, k, v = (qkv[:, i * width : (i + 1) * width] for i in range(3))
    else:
        q, k, v = rows(width), rows(width), rows(width)
    q, k, v = (x.unflatten(-1, (heads, HEAD_DIM))[None] for x in (q, k, v))
    beta = rows(layout.beta_row)[:, layout.beta_column :][:, :heads]
    cu = torch.zeros(n + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths).cumsum(0)
    common = lengths[0] if spec and len(set(lengths)) == 1 else None
    accepted = torch.tensor([rng.randint(1, n_) for n_ in lengths], dtype=torch.int32)
    return path, dict(
        q=q, k=k, v=v, raw_g=rows(width).unflatten(-1, (heads, HEAD_DIM))[None],
        raw_beta=beta[None], A_log=layer.A_log, dt_bias=layer.dt_bias,
        lower_bound=LOWER_BOUND, initial_state=layer.state, cu_seqlens=cu.to(DEV),
        ssm_state_indices=indices,
        num_accepted_tokens=accepted.to(DEV) if spec else None,
        uniform_sequence_length=common,
    )  # fmt: skip


def serving_call(layer, layouts: dict, rng: random.Random) -> str:
    """One recurrent call of a random step through 0.32.0's wrapper."""
    path, arguments = serving_arguments(layer, layouts, rng)
    out, _ = fused_recurrent.fused_recurrent_kda(**arguments)
    assert torch.isfinite(out).all(), path
    return path


def arm(heads: int, warm: str, calls: int, seed: int) -> dict:
    layer = stand_in_layer(heads, STATE_SLOTS)
    layouts = call_layouts(layer)
    rng = random.Random(seed)
    forget_binaries()
    start = time.perf_counter()
    if warm == "series warm-up":
        warmed = series_warm_up(layer)
    else:  # gpu_spec.py's baseline: the first 50 serving calls
        for _ in range(2 if DRY else 50):
            serving_call(layer, layouts, rng)
        warmed = {"serving calls": 2 if DRY else 50}
    if not DRY:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    before = binaries()
    paths: dict[str, int] = {}
    new_at, last = [], before
    for i in range(calls):
        path = serving_call(layer, layouts, rng)
        paths[path] = paths.get(path, 0) + 1
        if before is not None and binaries() != last:
            new_at.append(i)
            last = binaries()
    return {
        "warm-up": warm,
        "warm-up did": warmed,
        "warm-up seconds": round(seconds, 2),
        "binaries after warm-up": before,
        "serving calls": calls,
        "calls by path": paths,
        "new binaries after warm-up": None if before is None else last - before,
        "at calls": new_at,
    }


def main() -> None:
    out = Path(os.environ.get("OUT", "/tmp/k3-gpu"))
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "device": "cpu (dry run)" if DRY else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "num_speculative_tokens": NUM_SPEC,
        "max_num_seqs": MAX_NUM_SEQS,
        "runs": [],
    }
    calls = 4 if DRY else int(os.environ.get("K3_WARM_CALLS", 3000))
    for heads in (2,) if DRY else (12, 6, 96):
        for warm in ("50 serving calls", "series warm-up"):
            with interpretable(kda_kernels()) if DRY else contextlib.nullcontext():
                result = {"heads": heads, **arm(heads, warm, calls, seed=heads)}
            report["runs"].append(result)
            print(json.dumps(result), flush=True)
            (out / "recurrent-warm-up.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
