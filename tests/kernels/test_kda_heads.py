"""The KDA kernels of the installed release line (0.27.1's as its series
patches them, 0.32.0's as k4.0 does) at each profile's real per-rank head
count, in the Triton interpreter, against the float64 reference: the smoke
test's mixed step (decodes through the recurrent kernel, prefills through
the chunk chain with the device chunk metadata), which the smoke test runs
at 2 heads on a CPU. Head indexing is where a kernel can be right at 2
heads and wrong at 96 (offsets past a head's block, a grid short of the
heads)."""

import pytest
import torch

from k3rocm.smoke import kda_numerics
from k3rocm.smoke.interpreter import interpretable, kda_kernels
from k3rocm.smoke.settings import Settings

pytestmark = pytest.mark.every_line

# One profile per distinct head count: tep8 holds tp8's 12.
PROFILES = ("tp8", "tep16", "dep16")


def mixed_step(heads: int) -> tuple[dict, list[tuple]]:
    x = kda_numerics.step_inputs("cpu", heads=heads)
    with interpretable(kda_kernels()):
        return x, kda_numerics.run_step(x, chunk_calls=1)


@pytest.mark.parametrize("profile", PROFILES)
def test_the_kda_kernels_match_the_reference_at_the_profiles_head_count(profile):
    heads = Settings.from_env({"K3_PROFILE": profile}).kda_heads
    x, results = mixed_step(heads)
    [(out, pool)] = results
    assert out.shape[2] == heads and pool.shape[1] == heads
    assert kda_numerics.worst_excess(x, results, "cpu") <= 1
    # A planted error: every head's output and states moved to the next head.
    swapped = [(out.roll(1, dims=2), pool.roll(1, dims=1))]
    assert kda_numerics.worst_excess(x, swapped, "cpu") > 1
    assert torch.isfinite(out).all()
