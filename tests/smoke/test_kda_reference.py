"""The float64 KDA reference (src/k3rocm/smoke/kda_reference.py, on the
recurrence of src/k3rocm/smoke/kda_recurrence.py) checked against itself:
the closed-form chunks against the token loop, a split sequence's carried
state, empty sequences, the gate and one token by hand,
and a mixed batch's order (decodes, then prefills). The kernels are checked
against it in tests/kernels/test_kda_kernels_vs_reference.py."""

import itertools
import math

import pytest
import torch
from support.kda_reference_cases import (
    BOUNDS,
    HEADS,
    chunk_args,
    chunk_expected,
    randn,
)

from k3rocm.smoke import kda_reference as ref
from k3rocm.smoke.chunk_reference import cu_seqlens_of
from k3rocm.smoke.kda_recurrence import (
    kda_gate,
    kda_sequence,
    kda_sequence_chunked,
    l2norm,
)


@BOUNDS
@pytest.mark.parametrize("length", [1, 16, 17, 63, 64, 65, 130])
def test_closed_form_chunks_equal_the_token_loop(length, lower_bound):
    gen = torch.Generator().manual_seed(length)
    q, k = (l2norm(randn(gen, length, HEADS, 8)) for _ in range(2))
    v = randn(gen, length, HEADS, 8)
    g = kda_gate(randn(gen, length, HEADS, 8), randn(gen, HEADS), None, lower_bound)
    beta = torch.sigmoid(randn(gen, length, HEADS).double())
    state = randn(gen, HEADS, 8, 8)
    loop = kda_sequence(q, k, v, g, beta, state, 0.3)
    for size in (16, 64):
        chunked = kda_sequence_chunked(q, k, v, g, beta, state, 0.3, size)
        for a, b in zip(loop, chunked, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # Not the same by construction: a state read as S[k, v] differs.
    wrong = kda_sequence_chunked(q, k, v, g, beta, state.mT.contiguous(), 0.3)
    assert not torch.allclose(wrong[0], loop[0], atol=1e-3)


def test_a_sequence_split_in_two_carries_its_state():
    args = chunk_args([70], -5.0)
    whole, whole_state, _ = chunk_expected(args)
    q, k, v, raw_g, raw_beta, A_log, bias, _, h0 = args[:9]
    cut = 29
    first, mid = ref.chunk_kda_reference(
        *(x[:, :cut] for x in (q, k, v, raw_g, raw_beta)), A_log, bias, None, h0,
        True, -5.0, True,
    )  # fmt: skip
    second, end = ref.chunk_kda_reference(
        *(x[:, cut:] for x in (q, k, v, raw_g, raw_beta)), A_log, bias, None, mid,
        True, -5.0, True,
    )  # fmt: skip
    torch.testing.assert_close(torch.cat([first, second], 1), whole)
    torch.testing.assert_close(end, whole_state)
    # And without the carried state, the second half is something else.
    other, _ = ref.chunk_kda_reference(
        *(x[:, cut:] for x in (q, k, v, raw_g, raw_beta)), A_log, bias, None, None,
        True, -5.0, True,
    )  # fmt: skip
    assert not torch.allclose(other, second, atol=1e-3)


def test_zero_length_sequences_leave_their_state_and_the_others_alone():
    args = chunk_args([3, 0, 5, 0], None)
    out, final, _ = chunk_expected(args)
    h0 = args[8].double()
    assert torch.equal(final[1], h0[1]) and torch.equal(final[3], h0[3])
    # The same tokens without the empty sequences: same outputs and states.
    packed = chunk_expected(
        args, initial_state=h0[[0, 2]], cu_seqlens=cu_seqlens_of([3, 5])
    )
    assert torch.equal(out, packed[0]) and torch.equal(final[[0, 2]], packed[1])


def test_gate_against_hand_computed_values():
    A_log = torch.tensor([math.log(2.0)], dtype=torch.float64)
    bias = torch.tensor([0.25, -1.0, 0.0, 0.0], dtype=torch.float64)
    raw = torch.tensor([[0.5, 0.5, 25.0, 19.5]], dtype=torch.float64)  # [H=1, K=4]
    bounded = kda_gate(raw, A_log, bias, -5.0)[0].tolist()
    # lower_bound * sigmoid(A * (raw + bias)), A = exp(A_log) = 2
    sigmoid = [1 / (1 + math.exp(-2 * x)) for x in (0.75, -0.5, 25.0, 19.5)]
    assert bounded == pytest.approx([-5.0 * s for s in sigmoid], rel=1e-14)
    free = kda_gate(raw, A_log, bias, None)[0].tolist()
    # -A * softplus(raw + bias), softplus(x) = x above the threshold 20
    softplus = [math.log(1 + math.exp(x)) for x in (0.75, -0.5)] + [25.0]
    softplus.append(math.log(1 + math.exp(19.5)))
    assert free == pytest.approx([-2.0 * s for s in softplus], rel=1e-14)
    assert kda_gate(raw, A_log, None, -5.0)[0, 0] == pytest.approx(
        -5.0 / (1 + math.exp(-1.0)), rel=1e-14
    )


def test_one_token_by_hand():
    """K = V = 2, one head: decay, delta rule with sigmoid beta, read with
    the updated state; q and k L2-normalized with eps 1e-6 inside the root."""
    q = torch.tensor([[[[3.0, 4.0]]]])
    k = torch.tensor([[[[1.0, 0.0]]]])
    v = torch.tensor([[[[2.0, -1.0]]]])
    raw_g = torch.zeros(1, 1, 1, 2)
    raw_beta = torch.zeros(1, 1, 1)  # beta = sigmoid(0) = 1/2
    A_log = torch.zeros(1)  # A = 1
    h0 = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])  # S[v, k]
    out, final = ref.chunk_kda_reference(
        q, k, v, raw_g, raw_beta, A_log, None, 1.0, h0, True, -1.0, True
    )
    a = math.exp(-1.0 / 2)  # g = -1 * sigmoid(0)
    S = [[a * 1, a * 2], [a * 3, a * 4]]
    nk = 1 / math.sqrt(1 + 1e-6)
    u = [0.5 * (2 - S[0][0] * nk), 0.5 * (-1 - S[1][0] * nk)]
    S = [[S[0][0] + u[0] * nk, S[0][1]], [S[1][0] + u[1] * nk, S[1][1]]]
    nq = 1 / math.sqrt(25 + 1e-6)
    o = [(S[r][0] * 3 + S[r][1] * 4) * nq for r in range(2)]
    assert out[0, 0, 0].tolist() == pytest.approx(o, rel=1e-12)
    assert final[0, 0].tolist() == [pytest.approx(row, rel=1e-12) for row in S]
    zeros = torch.zeros(1, 1, 1, 2)
    silent, _ = ref.chunk_kda_reference(
        zeros, zeros, v, raw_g, raw_beta, A_log, None, 1.0, h0, True, -1.0, True
    )
    assert torch.equal(silent, torch.zeros_like(silent))  # eps: no NaN


def test_mixed_batch_is_decodes_then_prefills():
    gen = torch.Generator().manual_seed(3)
    lens = [1, 1, 1, 4, 7]
    T, D = sum(lens), 8
    q, k, v, raw_g = (randn(gen, 1, T, HEADS, D) for _ in range(4))
    raw_beta, A_log, bias = (
        randn(gen, 1, T, HEADS),
        randn(gen, HEADS),
        randn(gen, HEADS * D),
    )
    pool = randn(gen, 8, HEADS, D, D)
    slots = torch.tensor([3, 0, 5, 2, 6])
    has_initial = torch.tensor([True, True, True, False, True])
    out, after = ref.mixed_batch_reference(
        q, k, v, raw_g, raw_beta, A_log, bias, -5.0, pool, slots, has_initial,
        cu_seqlens_of(lens), 3,
    )  # fmt: skip
    expected = pool.double().clone()
    starts = cu_seqlens_of(lens).tolist()
    for n, (bos, eos) in enumerate(itertools.pairwise(starts)):
        slot = int(slots[n])
        if n < 3 and slot <= 0:  # padded decode: 0 out, slot untouched
            assert torch.equal(out[0, bos], torch.zeros_like(out[0, bos]))
            continue
        state = pool[slot] if has_initial[n] else None
        o, S = kda_sequence(
            l2norm(q[0, bos:eos]), l2norm(k[0, bos:eos]), v[0, bos:eos],
            kda_gate(raw_g[0, bos:eos], A_log, bias, -5.0),
            torch.sigmoid(raw_beta[0, bos:eos].double()), state, D**-0.5,
        )  # fmt: skip
        torch.testing.assert_close(out[0, bos:eos], o, rtol=1e-12, atol=1e-12)
        expected[slot] = S
    torch.testing.assert_close(after, expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(after[0], pool[0].double())  # slot 0 never written
