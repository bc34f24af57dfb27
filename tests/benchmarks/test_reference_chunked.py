"""benchmarks/reference_chunked.py, the float64 reference the H200 check
(benchmarks/gpu_reference.py) judges the kernels by, against the token loop
of k3rocm.smoke.kda_reference on the CPU: the same outputs, states and peak
for mixed batches with chunk boundaries, one-token prefills, zero-length
sequences and prefills without initial states."""

import sys

import pytest
import torch
from support.vllm_trees import REPO

from k3rocm.smoke import kda_reference as ref

sys.path.insert(0, str(REPO / "benchmarks"))
from reference_chunked import batch_reference

H, K = 2, 16
BATCHES = [
    (0, [70], [True]),
    (3, [63, 64, 65], [True, False, True]),
    (2, [1, 129, 0, 2], [False, True, False, True]),
    (5, [], []),
    (1, [200, 0, 0], [True, False, False]),
    (0, [1, 1, 64], [True, True, False]),
]


@pytest.mark.parametrize(("decodes", "prefills", "has_init"), BATCHES)
@pytest.mark.parametrize("lower_bound", [-5.0, None], ids=["safe-gate", "no-bound"])
def test_chunked_reference_is_the_token_loops(decodes, prefills, has_init, lower_bound):
    g = torch.Generator().manual_seed(len(prefills) * 7 + decodes)
    lens = [1] * decodes + prefills
    T = sum(lens)

    def randn(*size, std=1.0):
        return torch.randn(*size, generator=g) * std

    x = {
        "q": randn(1, T, H, K), "k": randn(1, T, H, K), "v": randn(1, T, H, K),
        "raw_g": randn(1, T, H, K), "raw_beta": randn(1, T, H),
        "A_log": randn(H), "dt_bias": randn(H * K),
    }  # fmt: skip
    slots = 1 + torch.randperm(15, generator=g)[: len(lens)].to(torch.int32)
    pool = randn(16, H, K, K, std=0.3)
    init = torch.tensor([True] * decodes + has_init, dtype=torch.bool)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens, dtype=torch.int64).cumsum(0)
    peak: list[float] = []
    want_out, want_pool = ref.mixed_batch_reference(
        *x.values(), lower_bound, pool, slots, init, cu, decodes, peak=peak
    )
    got = batch_reference(
        *x.values(), lower_bound, pool, slots, init, lens, decodes, chunk=32
    )
    assert (got["out"] - want_out).abs().max() <= 1e-12
    assert (got["pool"] - want_pool).abs().max() <= 1e-12
    assert got["peak"] == pytest.approx(max(peak, default=0.0), rel=1e-12)
    assert got["longest_prefill"] == max(prefills, default=0)
