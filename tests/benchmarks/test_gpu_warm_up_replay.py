"""The GPU harness of the 0.32.0 line's recurrent warm-up
(benchmarks/gpu_recurrent_warm_up.py) lays its serving calls out as the
layer does, so that a binary it sees compiled on the GPU after the warm-up
is the series' miss, not the harness's.

Its calls are replayed here, after the series' warm-up, through 0.32.0's
real wrapper with the kernel replaced by the recorder of Triton's cache
keys (support.recurrent_launch_keys; no GPU here), with the GPU run's
sizes and dtype: none may launch a key the warm-up did not compile. Run R
(docs/benchmarks.md) counted 7 binaries on an H100 that came from the
harness's own gather (``.contiguous()`` of one request's block-table row
keeps the table's row stride); planted back, the replay finds them at the
same calls at 12, 6 and 96 heads.
"""

import json
import os
import subprocess
import sys

import pytest
from support.vllm_trees import ON_DEFAULT_LINE, REPO

pytestmark = pytest.mark.every_line
if ON_DEFAULT_LINE:  # the default line's series has no such warm-up
    pytest.skip("the 0.32.0 line's recurrent warm-up", allow_module_level=True)

CALLS = 400

REPLAY = """
import json, random, sys

import gpu_recurrent_warm_up as harness
from support.recurrent_launch_keys import Recorder

heads, calls, planted = json.loads(sys.argv[1])
harness.MAX_NUM_SEQS, harness.DT = harness.GPU_MAX_NUM_SEQS, harness.GPU_DT
if planted:  # the harness's gather until 2026-12-07
    harness.gathered_spec_indices = lambda table: table[
        :, : harness.NUM_SPEC + 1
    ].contiguous()
class Counting(Recorder):
    launches = 0

    def __getitem__(self, grid):
        self.launches += 1
        return super().__getitem__(grid)


recorder = Counting()
harness.fused_recurrent.fused_recurrent_kda_fwd_kernel = recorder
layer = harness.stand_in_layer(heads, harness.STATE_SLOTS, random_state=False)
layouts = harness.call_layouts(layer)
harness.series_warm_up(layer)
assert recorder.compiled and not recorder.launched
rng = random.Random(heads)  # the series arm's calls, as harness.arm draws them
missed_at = []
for i in range(calls):
    _, arguments = harness.serving_arguments(layer, layouts, rng)
    harness.fused_recurrent.fused_recurrent_kda(**arguments)
    assert recorder.launches == i + 1  # each call launched through the recorder
    if recorder.launched - recorder.compiled:
        missed_at.append(i)
        recorder.compiled |= recorder.launched  # compiled once, as on the GPU
print(json.dumps(missed_at))
"""


def replay(bundle, heads: int, planted: bool = False) -> list[int]:
    """The calls (by index) that launched a key the warm-up had not compiled."""
    result = subprocess.run(
        [sys.executable, "-c", REPLAY, json.dumps([heads, CALLS, planted])],
        cwd=REPO / "benchmarks",
        capture_output=True,
        text=True,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(REPO / "tests"),
            "TRITON_INTERPRET": "1",
            "K3_WARM_DEVICE": "cpu",
            "K3_LINE": bundle.name.removeprefix("line-"),
            "HOME": os.environ.get("HOME", "/root"),
        },
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("heads", (12, 6, 96))
def test_the_harness_calls_launch_only_what_the_warm_up_compiled(bundle, heads):
    assert replay(bundle, heads) == []


# Run R's misses on the H100 within CALLS (docs/benchmarks-2026-12-07-h100-
# k4.3-warm-up-harness-misses.json, "at calls" of the series' arms).
RUN_R_MISSES = {12: [2, 3, 15, 243, 306, 396], 6: [34, 324, 357], 96: [38, 54, 61, 287]}


@pytest.mark.parametrize("heads", (12, 6, 96))
def test_the_harness_gather_of_run_r_misses_where_the_gpu_did(bundle, heads):
    assert replay(bundle, heads, planted=True) == RUN_R_MISSES[heads]
