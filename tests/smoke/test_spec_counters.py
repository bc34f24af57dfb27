"""The smoke test's speculation counters read from /metrics text written
here by hand (totals worked out by hand): summed over engines, the
_created samples left out, None where vLLM exports no spec family, zeros
where the family is there but nothing was counted yet."""

from __future__ import annotations

from k3rocm.smoke.speculative import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    DRAFTS,
    spec_counters,
)


def family(name: str, samples: str = "") -> str:
    """A counter as prometheus_client writes it (HELP and TYPE name the
    _total sample; its _created samples are a gauge family of their own)."""
    return f"# HELP {name}_total x\n# TYPE {name}_total counter\n{samples}"


def test_counters_sum_over_engines_without_their_created_samples():
    text = (
        family(
            DRAFTS,
            f'{DRAFTS}_total{{engine="0"}} 3.0\n{DRAFTS}_total{{engine="1"}} 4.0\n'
            f"# HELP {DRAFTS}_created x\n# TYPE {DRAFTS}_created gauge\n"
            f'{DRAFTS}_created{{engine="0"}} 1.7e9\n',
        )
        + family(DRAFT_TOKENS, f'{DRAFT_TOKENS}_total{{engine="0"}} 21.0\n')
        + family(ACCEPTED_TOKENS, f'{ACCEPTED_TOKENS}_total{{engine="0"}} 9.0\n')
    )
    assert spec_counters(text) == {
        DRAFTS: 7.0,
        DRAFT_TOKENS: 21.0,
        ACCEPTED_TOKENS: 9.0,
    }


def test_a_spec_family_with_nothing_counted_yet_reads_zero():
    assert spec_counters(family(DRAFTS)) == {
        DRAFTS: 0.0,
        DRAFT_TOKENS: 0.0,
        ACCEPTED_TOKENS: 0.0,
    }


def test_no_spec_family_means_the_server_does_not_speculate():
    assert spec_counters(family("vllm:num_requests_running_x")) is None
