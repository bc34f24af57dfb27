"""The 0.32.0 line's KDA layer call and modelled step against vLLM 0.32.0's
own path (issue 41 item 2), on the lent GPU, at K3_HEADS heads a rank
(default 12), in one process.

A step's KDA work as 0.32.0's layer (amd/kda.py ``_forward``) does it on
its Triton path, the one an NVIDIA GPU takes (on gfx950 prefills go to the
fused HIP chunk kernels instead, which no NVIDIA GPU runs):

- once a step, the builder's chunk metadata for the step's prefills:
  0.32.0's own ``kda_metadata.prepare_chunk_metadata_device`` or the
  series' kernel (patches 0001-0002);
- each KDA layer call: the decodes' ``fused_recurrent_kda`` (state pool,
  state indices, core_attn_out's rows as out) through 0.32.0's wrapper, or
  through the series' direct launch (patches 0008-0009; switched off for
  the other side), then ``chunk_kda_prefill``'s Triton path over the
  prefills, alike on both sides (initial states gathered from the pool:
  torch's indexing, no host sync, stands in for vLLM's
  gather_initial_states kernel;
  chunk_kda_with_fused_gate with the step's metadata; the copy into
  core_attn_out; the final states scattered back);
- a dspark step of spec decodes only: one ``fused_recurrent_kda`` on the
  block table with the uniform length, q, k and v views of one
  convolution output, core_attn_out's rows as out.

What both sides do alike around these calls (projections, convolutions,
the norm) is left out. Per shape: both sides' outputs and states bitwise
equal from the same inputs (and 0.32.0's own path against itself); host
and GPU microseconds per layer call, the sides interleaved round by round;
the step model of gpu_bench.py (64 layers, KDA in three of every four, the
others a calibrated GPU wait, the metadata once a step), the sides
alternating step by step: per-round medians, the paired difference, the
share of steps the GPU waited for the host; Triton binaries compiled while
timing (none may be).

    cd benchmarks && K3_LINE=0.32.0 K3_HEADS=12 python3 gpu_line_layer.py

needs .gpu/line-0.32.0 (gpu_bundle.py); JSON to $OUT/line-layer.json.
"""

import gc
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_bench as gb  # loads the line's patched tree
from kda_harness import (
    HEAD_DIM,
    HEADS_PER_RANK,
    RunReport,
    binaries,
    cu_seqlens,
    kda_inputs,
    pin_to_quiet_cpu,
    repin_to_quiet_cpu,
)
from vllm.models.kimi_k3.amd import kda_recurrent_launch as series
from vllm.models.kimi_k3.amd.kda_direct_launch import unwrap
from vllm.models.kimi_k3.amd.kda_metadata_launch import (
    prepare_chunk_metadata_device as series_metadata,
)
from vllm.models.kimi_k3.amd.ops.third_party.kda import (
    chunk_kda_with_fused_gate,
    fused_recurrent,
)

OWN, SERIES = "0.32.0", "series"
NUM_SPEC = 7  # dspark's draft tokens
SLOTS = 512  # room for 32 spec requests' block-table rows
SHAPES = {
    "7 decodes + 1 x 1k prefill": (7, [1024], 0),
    "15 decodes + 1 x 1k prefill": (15, [1024], 0),
    "31 decodes + 1 x 512 prefill": (31, [512], 0),
    "1 x 4096 prefill": (0, [4096], 0),
    "dspark: 8 spec requests x 8 tokens": (0, [], 8),
    "dspark: 32 spec requests x 8 tokens": (0, [], 32),
}
CALLS = 40  # layer calls a side a round (host and GPU time)
MODEL_STEPS = 20  # modelled steps a side a round
ROUNDS = gb.ROUNDS
JITS = {
    "recurrent": unwrap(fused_recurrent.fused_recurrent_kda_fwd_kernel)[0],
    "series metadata": unwrap(
        sys.modules[series_metadata.__module__]._chunk_metadata_kernel
    )[0],
    "0.32.0 metadata": unwrap(gb.upstream_metadata._chunk_metadata_kernel)[0],
}


class Step:
    """One step's tensors, laid out as 0.32.0's layer has them."""

    def __init__(self, decodes: int, prefills: list[int], spec: int, seed: int = 0):
        self.decodes, self.spec = decodes, spec
        lens = [NUM_SPEC + 1] * spec if spec else [1] * decodes + prefills
        self.total = total = sum(lens)
        heads, width = HEADS_PER_RANK, HEADS_PER_RANK * HEAD_DIM
        x = kda_inputs(lens, seed=seed)
        if spec:  # q, k, v: views of one convolution output's rows
            conv_out = torch.randn(total, 3 * width, device="cuda").to(torch.bfloat16)
            for i, name in enumerate("qkv"):
                x[name] = conv_out[:, i * width : (i + 1) * width].view(
                    1, total, heads, HEAD_DIM
                )
        self.x = x
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        self.pool = (
            torch.randn(SLOTS, heads, HEAD_DIM, HEAD_DIM, device="cuda", generator=g)
            * 0.1
        )
        order = torch.randperm(SLOTS - 1, device="cuda", generator=g) + 1
        if spec:  # block table rows, NUM_SPEC + 1 columns
            self.table = order[: spec * (NUM_SPEC + 1)].int().view(spec, NUM_SPEC + 1)
            self.accepted = torch.randint(1, NUM_SPEC + 2, (spec,), device="cuda").int()
        self.slots = order[: len(lens)].int()
        self.dev, _ = cu_seqlens(lens)
        self.out = torch.empty(
            1, total, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda"
        )
        self.split = decodes
        self.pdev, self.phost = cu_seqlens(prefills)
        # Every other prefill resumes a state (a prefix-cache hit).
        self.has_initial = torch.tensor(
            [i % 2 == 0 for i in range(len(prefills))], device="cuda"
        )

    def metadata(self, side: str):
        if self.spec or self.split == self.total:
            return None
        prepare = series_metadata if side == SERIES else gb.upstream
        return prepare(self.pdev, self.phost)

    def layer(self, side: str, meta) -> None:
        series.DIRECT = side == SERIES
        x, d = self.x, self.split
        common = {
            "A_log": x["A_log"],
            "dt_bias": x["g_bias"],
            "lower_bound": x["lower_bound"],
            "initial_state": self.pool,
        }
        if self.spec:
            fused_recurrent.fused_recurrent_kda(
                q=x["q"], k=x["k"], v=x["v"], raw_g=x["raw_g"], raw_beta=x["raw_beta"],
                cu_seqlens=self.dev, ssm_state_indices=self.table,
                num_accepted_tokens=self.accepted,
                uniform_sequence_length=NUM_SPEC + 1, out=self.out, **common,
            )  # fmt: skip
            return
        if d:
            fused_recurrent.fused_recurrent_kda(
                **{n: x[n][:, :d] for n in ("q", "k", "v", "raw_g", "raw_beta")},
                cu_seqlens=self.dev[: d + 1], ssm_state_indices=self.slots[:d],
                out=self.out[:, :d], **common,
            )  # fmt: skip
        slots = self.slots[d:].long()
        # vLLM's gather_initial_states, without a host sync.
        initial = torch.where(self.has_initial.view(-1, 1, 1, 1), self.pool[slots], 0.0)
        o, final = chunk_kda_with_fused_gate(
            **{n: x[n][:, d:] for n in ("q", "k", "v", "raw_g", "raw_beta")},
            A_log=x["A_log"], g_bias=x["g_bias"], initial_state=initial,
            output_final_state=True, lower_bound=x["lower_bound"],
            use_qk_l2norm_in_kernel=True, cu_seqlens=self.pdev,
            chunk_indices=meta[0], chunk_offsets=meta[1],
        )  # fmt: skip
        self.out[:, d:].copy_(o)
        self.pool[slots] = final

    def bitwise(self) -> dict:
        """Each run from the same inputs against 0.32.0's first: the decodes'
        output rows, the other rows and the states, bitwise; and whether the
        two sides' chunk metadata are equal."""
        pool, runs = self.pool.clone(), []
        # The inputs too, in case a kernel writes one in place.
        inputs = {n: t.clone() for n, t in self.x.items() if torch.is_tensor(t)}
        for side in (OWN, OWN, SERIES, SERIES):  # the series' second: direct
            for name, saved in inputs.items():
                self.x[name].copy_(saved)
            self.pool.copy_(pool)
            self.out.zero_()
            self.layer(side, self.metadata(side))
            runs.append((self.out.clone(), self.pool.clone()))
        torch.cuda.synchronize()
        self.pool.copy_(pool)
        (ref_out, ref_pool), d = runs[0], self.split
        result = {
            name: {
                "decode rows": torch.equal(out[:, :d], ref_out[:, :d]),
                "other rows": torch.equal(out[:, d:], ref_out[:, d:]),
                "states": torch.equal(states, ref_pool),
            }
            for name, (out, states) in zip(
                ("0.32.0 again", "series, first call", "series, direct launch"),
                runs[1:],
                strict=True,
            )
        }
        own, ours = self.metadata(OWN), self.metadata(SERIES)
        if own is not None:
            result["chunk metadata equal"] = all(
                a.shape == b.shape and torch.equal(a.long(), b.long())
                for a, b in zip(own, ours, strict=True)
            )
        return result


def layer_times(step: Step, queued: int) -> dict:
    """Host and GPU microseconds per layer call, the sides in turn by round;
    each side's calls start behind `queued` cycles of GPU wait (the host
    issues ahead of the GPU)."""
    host = {OWN: [], SERIES: []}
    gpu = {OWN: [], SERIES: []}
    for r in range(ROUNDS + 1):
        repin_to_quiet_cpu()
        for side in (OWN, SERIES) if r % 2 else (SERIES, OWN):
            meta = step.metadata(side)
            torch.cuda.synchronize()
            torch.cuda._sleep(queued)
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            times = []
            gc.disable()
            try:
                start.record()
                for _ in range(CALLS):
                    t0 = time.perf_counter()
                    step.layer(side, meta)
                    times.append(time.perf_counter() - t0)
                end.record()
            finally:
                gc.enable()
            end.synchronize()
            if r:  # round 0 warms up
                host[side].append(statistics.median(times) * 1e6)
                gpu[side].append(start.elapsed_time(end) * 1e3 / CALLS)
    return {
        "host us per layer call (median of round medians)": {
            s: statistics.median(v) for s, v in host.items()
        },
        "host us per round": host,
        "GPU us per layer call (median of rounds)": {
            s: statistics.median(v) for s, v in gpu.items()
        },
    }


def model_step(step: Step, side: str, wait_cycles: int) -> None:
    meta = step.metadata(side)
    for layer in range(gb.LAYERS):
        if layer % 4 != 3:
            step.layer(side, meta)
        torch.cuda._sleep(wait_cycles)


def step_model(
    step: Step, wait_cycles: int, queued: int, steps: int = MODEL_STEPS
) -> dict:
    """The sides alternating step by step; each step's interval on the GPU's
    timeline; per round the medians and the paired difference."""
    medians = {OWN: [], SERIES: []}
    waited = {OWN: [], SERIES: []}
    paired = []
    gpu_only = {}
    for side in (OWN, SERIES):  # one step's GPU time behind a queue
        torch.cuda.synchronize()
        torch.cuda._sleep(queued)
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        model_step(step, side, wait_cycles)
        end.record()
        end.synchronize()
        gpu_only[side] = start.elapsed_time(end)
    for r in range(ROUNDS + 1):
        repin_to_quiet_cpu()
        order = [OWN, SERIES] * steps if r % 2 else [SERIES, OWN] * steps
        intervals = gb.step_intervals(
            order, lambda side: model_step(step, side, wait_cycles)
        )
        if not r:
            continue
        ms = {OWN: [], SERIES: []}
        for interval, side in zip(intervals, order, strict=True):
            ms[side].append(interval)
        for side in (OWN, SERIES):
            medians[side].append(statistics.median(ms[side]))
            waited[side].append(
                sum(t > 1.05 * gpu_only[side] for t in ms[side]) / steps
            )
        paired.append(
            statistics.median(a - b for a, b in zip(ms[SERIES], ms[OWN], strict=True))
        )
    return {
        "GPU ms per step behind a queue": gpu_only,
        "step ms (median of round medians)": {
            s: statistics.median(v) for s, v in medians.items()
        },
        "step ms per round": medians,
        "paired (series - 0.32.0, ms): median / min / max": [
            statistics.median(paired),
            min(paired),
            max(paired),
        ],
        "share of steps the GPU waited for the host": {
            s: statistics.mean(v) for s, v in waited.items()
        },
    }


def main() -> None:
    report = RunReport("line-layer.json", heads=HEADS_PER_RANK,
                       host_cpu=pin_to_quiet_cpu(), rounds=ROUNDS,
                       calls_per_round=CALLS, model_steps=MODEL_STEPS,
                       shapes={})  # fmt: skip
    # calibrated once: the other layers' GPU wait, the queues timing starts behind
    wait_cycles = gb.sleep_cycles_for(gb.OTHER_GPU_MS / gb.LAYERS)
    layer_queue, step_queue = gb.sleep_cycles_for(50.0), gb.sleep_cycles_for(300.0)
    for name, shape in SHAPES.items():
        step = Step(*shape)
        row = {"bitwise": step.bitwise()}
        for side in (OWN, SERIES, SERIES):  # compiles and plans first
            model_step(step, side, wait_cycles)
        torch.cuda.synchronize()
        before = {k: binaries(jit) for k, jit in JITS.items()}
        row.update(layer_times(step, layer_queue))
        row["step model"] = step_model(step, wait_cycles, step_queue)
        row["binaries compiled while timing"] = {
            k: binaries(jit) - before[k] for k, jit in JITS.items()
        }
        report["shapes"][name] = row
        report.save()
        host = row["host us per layer call (median of round medians)"]
        paired = row["step model"]["paired (series - 0.32.0, ms): median / min / max"]
        print(name, row["bitwise"], host, paired, flush=True)


if __name__ == "__main__":
    main()
