"""The Prometheus alert rules for kimi-k3-rocm servers, generated from the
monitoring configuration the dashboard uses too (k3rocm.monitoring.names).

    python -m k3rocm.monitoring.alerts --output-dir monitoring

writes monitoring/alerts.yml and monitoring/container-alerts.yml. A test
fails when the committed files differ from what this module generates, so
edit here (or k3rocm.monitoring.names) and regenerate; the promtool unit tests
(monitoring/*.test.yml) check every alert firing and quiet.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from k3rocm.common.setting_table import (
    LOAD_ALERT_SECONDS,
    SMOKE_LOAD_TIMEOUT,
    STALL_SECONDS,
    STATUS_PORT,
)
from k3rocm.common.smoke_report import VERDICT_FAIL, VERDICT_PENDING
from k3rocm.common.states import StepKind
from k3rocm.monitoring import names as m

WARNING, CRITICAL = "warning", "critical"
WRAP = 72  # folded text lines, indentation included


@dataclass(frozen=True)
class Rule:
    alert: str
    expr: str
    severity: str
    summary: str
    runbook: str
    duration: str | None = None  # the rule's `for`
    labels: dict[str, str] = field(default_factory=dict)
    comment: str = ""


def _seconds_text(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def _step_latency(kind: StepKind, runbook: str) -> Rule:
    threshold = m.STEP_P99_SECONDS[kind]
    selector = f'{m.STEP_DURATION}_bucket{{kind="{kind}"}}'
    return Rule(
        "EngineStepLatencyP99High",
        "histogram_quantile(0.99, sum by (instance, model_name, engine, kind, le) "
        f"(rate({selector}[5m]))) > {threshold:g}",
        WARNING,
        f"p99 {kind} step time above {_seconds_text(threshold)} on "
        "{{ $labels.instance }} engine {{ $labels.engine }}",
        runbook,
        m.STEP_P99_FOR,
        {"kind": kind},
    )


def _per_prefill_token(window: str) -> str:
    by = "sum by (instance, model_name)"
    return (
        f'{by} (rate({m.STEP_DURATION}_sum{{kind="prefill"}}[{window}])) / '
        f'{by} (rate({m.CONTEXT_TOKENS}{{kind="prefill"}}[{window}]))'
    )


def server_rules() -> list[Rule]:
    regression = round((m.PREFILL_REGRESSION_RATIO - 1) * 100)
    return [
        _step_latency(
            StepKind.PREFILL,
            "Long prompts make long prefill steps; compare with the step rate "
            "and tokens per step on the dashboard. If steps got slower for the "
            "same tokens, see PrefillStepLatencyRegression.",
        ),
        _step_latency(
            StepKind.MIXED,
            "Mixed steps carry prefill chunks next to decodes, so every running "
            "request waits for them: lower --max-num-batched-tokens, or check "
            "for a prefill regression.",
        ),
        _step_latency(
            StepKind.DECODE,
            "Decode steps grow with the batch: check running requests and KV "
            "cache usage; lower --max-num-seqs if the batch is too large, or "
            "look for a GPU that throttles (rocm-smi).",
        ),
        Rule(
            "PrefillStepLatencyRegression",
            f"({_per_prefill_token('30m')}) / ({_per_prefill_token('1d')}) > "
            f"{m.PREFILL_REGRESSION_RATIO:g}",
            WARNING,
            "Prefill time per token on {{ $labels.instance }} is "
            f"{regression} % above its one-day average",
            "The stall-free prefill path may be off: check k3rocm_build_info "
            "(patch_series must be the series id, not none) and the smoke "
            "verdict, then what changed in the last hour (image, flags, prompt "
            "mix).",
            "15m",
        ),
        Rule(
            "StallFreePathNotVerified",
            f"{m.SMOKE_VERDICT} == {VERDICT_PENDING}",
            WARNING,
            "No smoke-test verdict on the stall-free prefill path for "
            "{{ $labels.instance }} after "
            f"{int(m.NO_VERDICT_FOR[:-1])} minutes",
            "The smoke test never wrote a verdict: read its log in the "
            "container output and check that K3_SMOKE_REPORT names the same "
            "file for the smoke test and the vLLM server.",
            m.NO_VERDICT_FOR,
        ),
        Rule(
            "SmokeTestFailed",
            f"{m.SMOKE_VERDICT} == {VERDICT_FAIL}",
            CRITICAL,
            "The smoke test failed on {{ $labels.instance }}: the stall-free "
            "prefill path is not proven",
            "Read the smoke report (K3_SMOKE_REPORT) for the failed stage. A "
            "missing patch marker or a drifted vLLM means a wrong image: "
            "redeploy a released tag by digest.",
            "0m",
        ),
        Rule(
            "KVCacheNearlyFull",
            f"max by (instance, model_name, engine) ({m.KV_CACHE_USAGE}) > "
            f"{m.KV_CACHE_FULL:g}",
            WARNING,
            f"KV cache above {m.KV_CACHE_FULL * 100:g} % on "
            "{{ $labels.instance }} engine {{ $labels.engine }}",
            "Requests will be preempted or queued: lower --max-num-seqs or "
            "--max-model-len, enable the FP8 KV cache, or add capacity.",
            "5m",
        ),
        Rule(
            "RequestsQueueing",
            f"sum by (instance, model_name) ({m.REQUESTS_WAITING}) > 0",
            WARNING,
            "Requests have been waiting on {{ $labels.instance }} for "
            f"{int(m.REQUESTS_WAITING_FOR[:-1])} minutes",
            "The server is over capacity: check KV cache usage and running "
            "requests; add replicas or lower the offered load.",
            m.REQUESTS_WAITING_FOR,
        ),
    ]


def container_rules() -> list[Rule]:
    starting = f"{m.CONTAINER_PHASE}{{{m.STARTUP_PHASE_SELECTOR}}} == 1"
    return [
        Rule(
            "KimiK3ServerDown",
            f'up{{job="{m.VLLM_JOB}"}} == 0 unless on(instance) {starting}',
            CRITICAL,
            "vLLM server {{ $labels.instance }} does not answer /metrics",
            "The container is past its start-up and vLLM does not answer: a "
            "crash loop, an out-of-memory kill, a stop. docker compose ps; "
            "docker compose logs kimi-k3 (the k3rocm.container lines say why).",
            m.DOWN_FOR,
            comment="Not while the container says it is still starting (smoke "
            "stage 1, loading the weights, smoke stage 2): vLLM serves no HTTP "
            "then.",
        ),
        Rule(
            "KimiK3ContainerDown",
            f'up{{job="{m.CONTAINER_JOB}"}} == 0',
            CRITICAL,
            "the kimi-k3 container of {{ $labels.instance }} is not running",
            "The container's own metrics endpoint (port "
            f"{STATUS_PORT.default}) does not answer: the container exited or "
            "was never started. docker compose ps -a shows its exit code "
            '(README, "Exit codes": 3 vLLM could not be kept '
            "running, 4 smoke test failed, 5 the engine stalled).",
            m.DOWN_FOR,
        ),
        Rule(
            "KimiK3LoadSlow",
            f"{m.CONTAINER_PHASE_SECONDS}{{{m.STARTUP_PHASE_SELECTOR}}} > "
            f"on(instance) group_left() {m.LOAD_ALERT_BOUND}",
            WARNING,
            "kimi-k3 on {{ $labels.instance }} is still in start-up phase "
            "{{ $labels.phase }} after {{ $value | humanizeDuration }}",
            f"Loading takes longer than {LOAD_ALERT_SECONDS.env}. Check the "
            "disk and network the weights come from (docker compose logs "
            "kimi-k3) and the smoke test's load timeout "
            f"{SMOKE_LOAD_TIMEOUT.env}, after which the container exits 4.",
            comment=f"The operator's bound, {LOAD_ALERT_SECONDS.env}, is "
            "exported beside the phase, so the rule carries no threshold of "
            "its own.",
        ),
        Rule(
            "KimiK3EngineStalled",
            f"(time() - max by (instance, model_name, engine) ({m.LAST_STEP}) > "
            f"on(instance) group_left() {m.STALL_BOUND} / 2) and on(instance, "
            f"model_name, engine) sum by (instance, model_name, engine) "
            f"({m.ENGINE_REQUESTS}) > 0",
            CRITICAL,
            "engine {{ $labels.engine }} on {{ $labels.instance }} has not "
            "stepped for {{ $value | humanizeDuration }} with requests pending",
            "The engine is stalled (a hung collective, a copy that never ends, "
            "a stopped worker). At K3_STALL_SECONDS the watchdog dumps every "
            "vLLM process's stacks into the log and K3_FORENSICS_DIR, and the "
            'container exits 5 and restarts (README, "When the engine '
            'stalls"). Send the stacks upstream with the image tag.',
            comment=f"Half of {STALL_SECONDS.env} (exported by the container), "
            "so it fires before the watchdog acts; no step plus a queue the "
            "engine reported is the watchdog's rule too.",
        ),
    ]


SERVER_HEADER = """\
# Alert rules for kimi-k3-rocm servers, generated by k3rocm.monitoring.alerts
# from k3rocm.monitoring.names (thresholds there): do not edit, regenerate. Every
# expression is `QUANTITY OP THRESHOLD`: the test suite queries each QUANTITY
# on a live Prometheus scraping a real vLLM, so a renamed metric cannot go
# unnoticed. Step-latency thresholds are starting points for Kimi-K3 on
# 8x MI355X with --max-num-batched-tokens 4096; tune them to your own baseline.
#   promtool test rules monitoring/alerts.test.yml
"""
CONTAINER_HEADER = f"""\
# Alert rules on the container's own start-up metrics (k3rocm.container.status, port
# {STATUS_PORT.default}, job {m.CONTAINER_JOB}), up from the container's first
# second, and on whether vLLM answers at all; generated by k3rocm.monitoring.alerts from
# k3rocm.monitoring: do not edit, regenerate. prometheus.yml gives the
# container's target the `instance` of its vLLM (the API address), which joins
# the two jobs here and keeps the dashboard's instance filter working for both.
#   promtool test rules monitoring/container-alerts.test.yml
"""
RULE_FILES = {
    "alerts.yml": (SERVER_HEADER, "kimi-k3-rocm", server_rules),
    "container-alerts.yml": (CONTAINER_HEADER, "kimi-k3-container", container_rules),
}


def _plain(key: str, text: str, indent: str) -> str:
    """``key: text`` on one line, as a plain YAML scalar."""
    assert text[0].isalnum() or text[0] == "(", text
    assert ": " not in text and " #" not in text, text
    return f"{indent}{key}: {text}"


def _folded(key: str, text: str, indent: str) -> list[str]:
    """``key: text`` folded (``>-``): wrapped, read back as one line."""
    body = textwrap.wrap(
        text,
        WRAP - len(indent) - 2,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return [f"{indent}{key}: >-", *(f"{indent}  {part}" for part in body)]


def render_rules(header: str, group: str, rules: list[Rule]) -> str:
    lines = [header.rstrip("\n"), "groups:", f"  - name: {group}", "    rules:"]
    for index, rule in enumerate(rules):
        if index:
            lines.append("")
        lines.append(f"      - alert: {rule.alert}")
        pad = " " * 8
        for part in textwrap.wrap(rule.comment, WRAP - len(pad) - 2):
            lines.append(f"{pad}# {part}")
        lines.append(_plain("expr", rule.expr, pad))
        if rule.duration is not None:
            lines.append(f"{pad}for: {rule.duration}")
        lines.append(f"{pad}labels:")
        labels = {**rule.labels, "severity": rule.severity}
        lines += [f"{pad}  {name}: {labels[name]}" for name in sorted(labels)]
        lines.append(f"{pad}annotations:")
        lines.append(f"{pad}  summary: {json.dumps(rule.summary)}")
        lines += _folded("runbook", rule.runbook, pad + "  ")
    return "\n".join(lines) + "\n"


def render(name: str) -> str:
    header, group, rules = RULE_FILES[name]
    return render_rules(header, group, rules())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output-dir", type=Path, help="write the rule files here (default: stdout)"
    )
    args = parser.parse_args(argv)
    for name in RULE_FILES:
        if args.output_dir is None:
            sys.stdout.write(f"# ---- {name}\n{render(name)}")
        else:
            (args.output_dir / name).write_text(render(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
