"""Stage 2, once vLLM answers ``/health``: a completion whose prompt spans
several 64-token chunks, then new prefill step samples on ``/metrics``, then
the paths users hit: a completion with the server's default sampling (the
first one compiles the sampler: a server that cannot must not turn healthy)
and a streamed one, read to its ``[DONE]``; where the server speculates, a
completion its draft's proposals are verified in (k3rocm.smoke.speculative)."""

from __future__ import annotations

import json
import time
import urllib.error

from k3rocm.common.metric_names import STEP_DURATION
from k3rocm.common.metrics_text import sample_total
from k3rocm.common.smoke_report import CheckName, Stage
from k3rocm.common.states import PREFILL_KINDS, Verdict
from k3rocm.smoke.chunk_reference import CHUNK_SIZE
from k3rocm.smoke.http import Http, wait_for_health
from k3rocm.smoke.settings import Settings
from k3rocm.smoke.speculative import check_speculative

# The completion's prompt spans at least this many 64-token chunks.
PROMPT_CHUNKS = 4
PROMPT_SENTENCE = "the quick brown fox jumps over the lazy dog and runs far away "
# The metrics plugin's step histogram; steps that prefill are `prefill` or
# `mixed` (prefill and decode together).
STEP_COUNT_METRIC = f"{STEP_DURATION}_count"


def prefill_step_samples(metrics_text: str) -> float:
    total = sample_total(
        metrics_text,
        STEP_COUNT_METRIC,
        lambda labels: labels.get("kind") in PREFILL_KINDS,
    )
    return total or 0.0


def long_prompt(http: Http, model: str, min_tokens: int) -> tuple[str, int]:
    """A prompt the server's own tokenizer counts at least min_tokens for."""
    prompt = PROMPT_SENTENCE
    while True:
        tokens = http.post("/tokenize", {"model": model, "prompt": prompt}, 30)
        if tokens["count"] >= min_tokens:
            return prompt, tokens["count"]
        prompt += PROMPT_SENTENCE


def run_stage2(stage: Stage, settings: Settings) -> None:
    http = Http(settings.base_url, settings.api_key)
    if not wait_for_health(http, settings.load_timeout):
        stage.add(
            CheckName.HEALTH,
            Verdict.FAIL,
            f"{settings.base_url}/health did not answer 200 within "
            f"{settings.load_timeout:.0f} s (K3_SMOKE_LOAD_TIMEOUT)",
        )
        return
    stage.add(CheckName.HEALTH, Verdict.PASS, f"{settings.base_url}/health answers 200")
    try:
        model = json.loads(http.get("/v1/models")[1])["data"][0]["id"]
        before = prefill_step_samples(http.get("/metrics")[1])
        prompt, prompt_tokens = long_prompt(
            http, model, (PROMPT_CHUNKS - 1) * CHUNK_SIZE + 1
        )
        answer = http.post(
            "/v1/completions",
            {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0},
            timeout=settings.stage2_timeout,
        )
    except (OSError, urllib.error.URLError, KeyError, ValueError) as err:
        stage.add(
            CheckName.COMPLETION,
            Verdict.FAIL,
            f"request to {settings.base_url}: {err!r}",
        )
        return
    served = answer.get("usage", {}).get("prompt_tokens", 0)
    chunks = -(-served // CHUNK_SIZE)
    if not answer.get("choices") or chunks < PROMPT_CHUNKS:
        stage.add(
            CheckName.COMPLETION,
            Verdict.FAIL,
            f"answer with {len(answer.get('choices', []))} choices for a "
            f"{served}-token prompt; wanted a completion over {PROMPT_CHUNKS}+ "
            "chunks",
        )
        return
    stage.add(
        CheckName.COMPLETION,
        Verdict.PASS,
        f"{model} completed a {prompt_tokens}-token prompt ({chunks} chunks)",
    )
    check_prefill_metrics(stage, http, before)
    check_sampled_requests(stage, http, model, settings.stage2_timeout)
    check_speculative(stage, http, model, settings.speculative, settings.stage2_timeout)


def check_sampled_requests(stage: Stage, http: Http, model: str, timeout: float):
    body = {"model": model, "prompt": PROMPT_SENTENCE, "max_tokens": 4}
    try:
        answer = http.post("/v1/completions", body, timeout=timeout)
        events = http.stream("/v1/completions", {**body, "stream": True}, timeout)
    except (OSError, urllib.error.URLError, KeyError, ValueError) as err:
        stage.add(
            CheckName.SAMPLED_COMPLETION,
            Verdict.FAIL,
            f"a completion with default sampling failed: {err!r}"[:500],
        )
        return
    tokens = answer.get("usage", {}).get("completion_tokens", 0)
    if not answer.get("choices") or tokens < 1 or events[-1:] != ["[DONE]"]:
        stage.add(
            CheckName.SAMPLED_COMPLETION,
            Verdict.FAIL,
            f"default sampling gave {tokens} tokens; the stream ended with "
            f"{events[-1:]!r} after {len(events)} events, not [DONE]",
        )
        return
    stage.add(
        CheckName.SAMPLED_COMPLETION,
        Verdict.PASS,
        f"default sampling: {tokens} tokens; streamed: {len(events) - 1} events "
        "and [DONE]",
    )


def check_prefill_metrics(stage: Stage, http: Http, before: float) -> None:
    # The plugin records a step when the engine reports it: allow a moment.
    after = before
    for _ in range(20):
        after = prefill_step_samples(http.get("/metrics")[1])
        if after > before:
            break
        time.sleep(0.5)
    if after <= before:
        stage.add(
            CheckName.PREFILL_METRICS,
            Verdict.FAIL,
            f"/metrics shows no new {STEP_COUNT_METRIC} sample for kind "
            f"{'/'.join(PREFILL_KINDS)} (still {before:.0f}): is the k3rocm "
            "metrics plugin loaded (the launcher's metrics flags)?",
        )
        return
    stage.add(
        CheckName.PREFILL_METRICS,
        Verdict.PASS,
        f"{after - before:.0f} new prefill step samples on /metrics",
    )
