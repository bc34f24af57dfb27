"""The Grafana dashboard for kimi-k3-rocm servers, generated from code.

    python -m k3rocm.monitoring.dashboard \
        --output monitoring/grafana/dashboards/kimi-k3-rocm.json

The committed JSON is what Grafana provisions; a test fails when it differs
from what this module generates, so edit here and regenerate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from k3rocm.monitoring import names as m
from k3rocm.setting_table import STATUS_PORT

UID = "kimi-k3-rocm"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
INSTANCE = 'instance=~"$instance"'
WIDTH = 24  # Grafana's grid width
STEP_KINDS_SELECTOR = f"{INSTANCE}, {m.REAL_STEPS_SELECTOR}"
VERDICT_COLORS = ("green", "red", "yellow")  # in m.VERDICT_TEXT's order
VERDICT_MAPPINGS = [
    {
        "type": "value",
        "options": {
            str(value): {"text": text, "color": color, "index": index}
            for index, ((value, text), color) in enumerate(
                zip(m.VERDICT_TEXT.items(), VERDICT_COLORS, strict=True)
            )
        },
    }
]


def rate(metric: str, selector: str = INSTANCE) -> str:
    return f"rate({metric}{{{selector}}}[$__rate_interval])"


def quantile(q: float, histogram: str, by: str, selector: str = INSTANCE) -> str:
    return (
        f"histogram_quantile({q}, sum by ({by}) "
        f"({rate(histogram + '_bucket', selector)}))"
    )


def target(ref: str, expr: str, legend: str, **extra) -> dict:
    return {
        "refId": ref,
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend,
        **extra,
    }


def timeseries(title: str, unit: str, targets: list[dict], description: str) -> dict:
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom"},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def latency_panel(title: str, histogram: str, description: str) -> dict:
    return timeseries(
        title,
        "s",
        [
            target("A", quantile(0.5, histogram, "le"), "p50"),
            target("B", quantile(0.99, histogram, "le"), "p99"),
        ],
        description,
    )


def panels() -> list[list[tuple[int, int, dict]]]:
    """Rows of (width, height, panel), laid out left to right."""
    step = m.STEP_DURATION
    build_info = {
        "type": "table",
        "title": "Build",
        "description": "vLLM version, applied patch series (none: unpatched), "
        f"image tag and ROCm version of each server ({m.BUILD_INFO}).",
        "datasource": DATASOURCE,
        "targets": [
            target(
                "A",
                f"{m.BUILD_INFO}{{{INSTANCE}}}",
                "",
                instant=True,
                format="table",
            )
        ],
        "transformations": [
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True, "Value": True}},
            }
        ],
    }
    smoke = {
        "type": "stat",
        "title": "Smoke verdict (stall-free prefill path)",
        "description": f"{m.SMOKE_VERDICT}: 1 pass, 0 fail, -1 no verdict yet.",
        "datasource": DATASOURCE,
        "fieldConfig": {
            "defaults": {"mappings": VERDICT_MAPPINGS, "unit": "none"},
            "overrides": [],
        },
        "options": {"colorMode": "background", "textMode": "value_and_name"},
        "targets": [target("A", f"{m.SMOKE_VERDICT}{{{INSTANCE}}}", "{{instance}}")],
    }
    phase = {
        "type": "stat",
        "title": "Start-up phase",
        "description": f"{m.CONTAINER_PHASE}, from the container's own endpoint "
        f"(port {STATUS_PORT.default}), up before vLLM serves: stage1, loading, "
        "stage2, serving, "
        "draining, stopping.",
        "datasource": DATASOURCE,
        "options": {"colorMode": "none", "textMode": "name"},
        "targets": [
            target("A", f"{m.CONTAINER_PHASE}{{{INSTANCE}}} == 1", "{{phase}}")
        ],
    }
    time_in_phase = {
        "type": "stat",
        "title": "Time in phase",
        "description": f"{m.CONTAINER_PHASE_SECONDS}; KimiK3LoadSlow fires when a "
        "start-up phase outlasts K3_LOAD_ALERT_SECONDS.",
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": "s"}, "overrides": []},
        "options": {"colorMode": "none", "textMode": "value_and_name"},
        "targets": [
            target("A", f"{m.CONTAINER_PHASE_SECONDS}{{{INSTANCE}}}", "{{phase}}")
        ],
    }
    step_latency = timeseries(
        "Engine step latency by kind",
        "s",
        [
            target(
                "A",
                quantile(0.5, step, "le, kind", STEP_KINDS_SELECTOR),
                "{{kind}} p50",
            ),
            target(
                "B",
                quantile(0.99, step, "le, kind", STEP_KINDS_SELECTOR),
                "{{kind}} p99",
            ),
        ],
        f"Wall time of one engine step ({m.STEP_DURATION}). "
        "The stall-free prefill path shortens prefill and mixed steps.",
    )
    steps_per_second = timeseries(
        "Engine steps per second by kind",
        "ops",
        [
            target(
                "A",
                f"sum by (kind) ({rate(m.STEPS_TOTAL, STEP_KINDS_SELECTOR)})",
                "{{kind}}",
            )
        ],
        f"{m.STEPS_TOTAL}, without data-parallel dummy steps.",
    )
    tokens_per_second = timeseries(
        "Scheduled tokens per second by step kind",
        "short",
        [
            target(
                "A",
                f"sum by (kind) ({rate(m.CONTEXT_TOKENS)})",
                "{{kind}} context",
            ),
            target(
                "B",
                f"sum by (kind) ({rate(m.GENERATION_TOKENS)})",
                "{{kind}} generation",
            ),
        ],
        "Context (prompt) and generation tokens the scheduler gave each kind of step.",
    )
    requests = timeseries(
        "Running and waiting requests",
        "short",
        [
            target(
                "A",
                f"sum by (instance) ({m.REQUESTS_RUNNING}{{{INSTANCE}}})",
                "{{instance}} running",
            ),
            target(
                "B",
                f"sum by (instance) ({m.REQUESTS_WAITING}{{{INSTANCE}}})",
                "{{instance}} waiting",
            ),
        ],
        "vLLM's scheduler queues: requests in the batch and requests waiting.",
    )
    progress = timeseries(
        "Engine progress",
        "short",
        [
            target(
                "A",
                f"time() - max by (instance, engine) ({m.LAST_STEP}{{{INSTANCE}}})",
                "{{instance}} engine {{engine}}: seconds since its last step",
            ),
            target(
                "B",
                f"sum by (instance, engine) ({m.ENGINE_REQUESTS}{{{INSTANCE}}})",
                "{{instance}} engine {{engine}}: requests pending",
            ),
        ],
        "Seconds since each engine's last step, and the requests its scheduler "
        "held then. Growing seconds with requests pending is a stall: the "
        "watchdog captures stacks and restarts the container after "
        "K3_STALL_SECONDS (alert KimiK3EngineStalled at half of it).",
    )
    kv_cache = timeseries(
        "KV cache usage",
        "percentunit",
        [
            target(
                "A",
                f"max by (instance, engine) ({m.KV_CACHE_USAGE}{{{INSTANCE}}})",
                "{{instance}} engine {{engine}}",
            )
        ],
        f"Fraction of KV cache blocks in use ({m.KV_CACHE_USAGE}).",
    )
    kv_cache["fieldConfig"]["defaults"].update(min=0, max=1)
    return [
        [(10, 6, build_info), (5, 6, smoke), (5, 6, phase), (4, 6, time_in_phase)],
        [(WIDTH, 9, step_latency)],
        [(12, 8, steps_per_second), (12, 8, tokens_per_second)],
        [
            (
                8,
                8,
                latency_panel(
                    "Time to first token",
                    "vllm:time_to_first_token_seconds",
                    "vllm:time_to_first_token_seconds, p50 and p99.",
                ),
            ),
            (
                8,
                8,
                latency_panel(
                    "Inter-token latency",
                    "vllm:inter_token_latency_seconds",
                    "vllm:inter_token_latency_seconds, p50 and p99.",
                ),
            ),
            (
                8,
                8,
                latency_panel(
                    "End-to-end request latency",
                    "vllm:e2e_request_latency_seconds",
                    "vllm:e2e_request_latency_seconds, p50 and p99.",
                ),
            ),
        ],
        [(8, 8, requests), (8, 8, progress), (8, 8, kv_cache)],
    ]


def templating() -> dict:
    # Both scrape jobs: the container's is up while vLLM still loads.
    instances = f'label_values(up{{job=~"{"|".join(m.JOBS)}"}}, instance)'
    return {
        "list": [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
                "refresh": 1,
            },
            {
                "name": "instance",
                "label": "Instance",
                "type": "query",
                "datasource": DATASOURCE,
                "definition": instances,
                "query": {"query": instances, "refId": "instances"},
                "multi": True,
                "includeAll": True,
                "allValue": ".*",
                "current": {},
                "hide": 0,
                "refresh": 2,
                "sort": 1,
            },
        ]
    }


def dashboard() -> dict:
    laid_out = []
    y = 0
    panel_id = 1
    for row in panels():
        x = 0
        for width, height, panel in row:
            laid_out.append(
                {
                    "id": panel_id,
                    "gridPos": {"x": x, "y": y, "w": width, "h": height},
                    **panel,
                }
            )
            panel_id += 1
            x += width
        assert x == WIDTH, f"row at y={y} is {x} wide, not {WIDTH}"
        y += max(height for _, height, _ in row)
    return {
        "uid": UID,
        "title": "Kimi-K3 on ROCm: engine steps and serving",
        "description": "Engine step latency from the k3rocm vLLM plugin next to "
        "vLLM's own serving metrics.",
        "tags": ["kimi-k3", "vllm", "rocm"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": templating(),
        "annotations": {"list": []},
        "panels": laid_out,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, help="write here (default: stdout)")
    args = parser.parse_args(argv)
    if args.output is None:
        sys.stdout.write(render())
    else:
        args.output.write_text(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
