"""Stage 2's speculative check: where the server speculates (`dspark`, or a
``--speculative-config`` in K3_EXTRA_ARGS), a greedy completion long enough
for the draft to propose and the target to verify several times must come
back, and vLLM's own counters must show the drafts verified. The target's
KDA layers run their spec-verify steps in it, so a container whose
speculative path is broken (vLLM #51682's warm-up error, a fault in a
spec step) never turns healthy."""

from __future__ import annotations

import time
import urllib.error

from k3rocm.common.metrics_text import finite_samples, metric_families
from k3rocm.common.smoke_report import CheckName, Stage
from k3rocm.common.states import Verdict
from k3rocm.smoke.http import Http

# vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py); the
# families exist only when the engine speculates.
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
# Enough tokens for several draft-and-verify rounds at DSpark's 7 tokens.
SPEC_MAX_TOKENS = 48
# Repeating: a draft model continues it, and an n-gram proposer finds its
# tail earlier in it, so drafts come at the first decode step.
SPEC_PROMPT = "one, two, three, four; " * 4 + "one, two,"


def spec_counters(metrics_text: str) -> dict[str, float] | None:
    """The three counters summed over their labels, or None where the
    server does not speculate."""
    totals = dict.fromkeys((DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS), 0.0)
    if not metric_families(metrics_text) & totals.keys():
        return None
    for sample in finite_samples(metrics_text):
        counter = sample.name.removesuffix("_total")
        if counter in totals and sample.name != counter:
            totals[counter] += sample.value
    return totals


def check_speculative(
    stage: Stage, http: Http, model: str, expected: bool, timeout: float
) -> None:
    """Adds "speculative decoding" to the stage where the server speculates
    or `expected` says it should; nothing otherwise."""
    try:
        before = spec_counters(http.get("/metrics")[1])
        if before is None:
            if expected:
                stage.add(
                    CheckName.SPECULATIVE_DECODING,
                    Verdict.FAIL,
                    f"K3_FEATURES has dspark but /metrics shows no {DRAFTS}: the "
                    "engine is not speculating (see vLLM's log for the "
                    "--speculative-config it read)",
                )
            return
        body = {
            "model": model,
            "prompt": SPEC_PROMPT,
            "max_tokens": SPEC_MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
        }
        answer = http.post("/v1/completions", body, timeout=timeout)
        after = wait_for_drafts(http, before)
    except (OSError, urllib.error.URLError, KeyError, ValueError) as err:
        stage.add(
            CheckName.SPECULATIVE_DECODING,
            Verdict.FAIL,
            f"a speculative completion failed: {err!r}"[:500],
        )
        return
    tokens = answer.get("usage", {}).get("completion_tokens", 0)
    drafts = after[DRAFTS] - before[DRAFTS]
    if tokens < SPEC_MAX_TOKENS or drafts < 1:
        stage.add(
            CheckName.SPECULATIVE_DECODING,
            Verdict.FAIL,
            f"a greedy completion gave {tokens} of {SPEC_MAX_TOKENS} tokens with "
            f"{drafts:.0f} drafts verified ({DRAFTS}_total)",
        )
        return
    proposed = after[DRAFT_TOKENS] - before[DRAFT_TOKENS]
    accepted = after[ACCEPTED_TOKENS] - before[ACCEPTED_TOKENS]
    stage.add(
        CheckName.SPECULATIVE_DECODING,
        Verdict.PASS,
        f"{tokens} tokens; {drafts:.0f} drafts verified, {accepted:.0f} of "
        f"{proposed:.0f} draft tokens accepted",
    )


def wait_for_drafts(http: Http, before: dict[str, float]) -> dict[str, float]:
    # The engine's stats reach /metrics at its logging interval: allow it.
    after = before
    for _ in range(20):
        after = spec_counters(http.get("/metrics")[1]) or before
        if after[DRAFTS] > before[DRAFTS]:
            break
        time.sleep(0.5)
    return after
