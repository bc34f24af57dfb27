"""What the dashboard shows, row by row, top to bottom: status, step
latency, step rates, request latency and load. Each row is its panels with
their widths and heights; the rows fill the grid's width.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import table
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models import prometheus as prometheus_models

from k3rocm.common.setting_table import STATUS_PORT
from k3rocm.monitoring import names as m
from k3rocm.monitoring.dashboard_panels import (
    DATASOURCE,
    INSTANCE,
    Panel,
    latency_panel,
    quantile,
    rate,
    series,
    stat_panel,
    target,
)

WIDTH = 24  # Grafana's grid width
STEP_KINDS_SELECTOR = f"{INSTANCE}, {m.REAL_STEPS_SELECTOR}"
VERDICT_COLORS = ("green", "red", "yellow")  # in m.VERDICT_TEXT's order
VERDICT_MAPPINGS = [
    models.ValueMap(
        {
            str(value): models.ValueMappingResult(text=text, color=color, index=index)
            for index, ((value, text), color) in enumerate(
                zip(m.VERDICT_TEXT.items(), VERDICT_COLORS, strict=True)
            )
        }
    )
]

Row = list[tuple[int, int, Panel]]  # (width, height, panel), left to right


def status_row() -> Row:
    """What runs and whether it passed: build, smoke verdict, start-up."""
    build_info = (
        table.Panel()
        .title("Build")
        .description(
            "vLLM version, applied patch series (none: unpatched), image tag and "
            f"ROCm version of each server ({m.BUILD_INFO})."
        )
        .datasource(DATASOURCE)
        .with_target(
            target("A", f"{m.BUILD_INFO}{{{INSTANCE}}}", "")
            .instant()
            .format(prometheus_models.PromQueryFormat.TABLE)
        )
        .with_transformation(
            models.DataTransformerConfig(
                id_val="organize",
                options={"excludeByName": {"Time": True, "Value": True}},
            )
        )
    )
    smoke = (
        stat_panel(
            "Smoke verdict (stall-free prefill path)",
            f"{m.SMOKE_VERDICT}: 1 pass, 0 fail, -1 no verdict yet.",
            f"{m.SMOKE_VERDICT}{{{INSTANCE}}}",
            "{{instance}}",
            common.BigValueTextMode.VALUE_AND_NAME,
        )
        .mappings(VERDICT_MAPPINGS)
        .unit("none")
        .color_mode(common.BigValueColorMode.BACKGROUND)
    )
    phase = stat_panel(
        "Start-up phase",
        f"{m.CONTAINER_PHASE}, from the container's own endpoint (port "
        f"{STATUS_PORT.default}), up before vLLM serves: stage1, loading, stage2, "
        "serving, draining, stopping.",
        f"{m.CONTAINER_PHASE}{{{INSTANCE}}} == 1",
        "{{phase}}",
        common.BigValueTextMode.NAME,
    ).color_mode(common.BigValueColorMode.NONE)
    time_in_phase = (
        stat_panel(
            "Time in phase",
            f"{m.CONTAINER_PHASE_SECONDS}; KimiK3LoadSlow fires when a start-up "
            "phase outlasts K3_LOAD_ALERT_SECONDS.",
            f"{m.CONTAINER_PHASE_SECONDS}{{{INSTANCE}}}",
            "{{phase}}",
            common.BigValueTextMode.VALUE_AND_NAME,
        )
        .unit("s")
        .color_mode(common.BigValueColorMode.NONE)
    )
    return [(10, 6, build_info), (5, 6, smoke), (5, 6, phase), (4, 6, time_in_phase)]


def step_latency_row() -> Row:
    """The stall-free path's figure: step latency by kind."""
    step = m.STEP_DURATION
    step_latency = series(
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
    return [(WIDTH, 9, step_latency)]


def step_rates_row() -> Row:
    steps_per_second = series(
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
    tokens_per_second = series(
        "Scheduled tokens per second by step kind",
        "short",
        [
            target(
                "A", f"sum by (kind) ({rate(m.CONTEXT_TOKENS)})", "{{kind}} context"
            ),
            target(
                "B",
                f"sum by (kind) ({rate(m.GENERATION_TOKENS)})",
                "{{kind}} generation",
            ),
        ],
        "Context (prompt) and generation tokens the scheduler gave each kind of step.",
    )
    return [(12, 8, steps_per_second), (12, 8, tokens_per_second)]


def request_latency_row() -> Row:
    """vLLM's own request latencies."""
    return [
        (8, 8, latency_panel(title, metric, f"{metric}, p50 and p99."))
        for title, metric in (
            ("Time to first token", "vllm:time_to_first_token_seconds"),
            ("Inter-token latency", "vllm:inter_token_latency_seconds"),
            ("End-to-end request latency", "vllm:e2e_request_latency_seconds"),
        )
    ]


def load_row() -> Row:
    """Queues, engine progress (a stall shows here) and the KV cache."""
    requests = series(
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
    progress = series(
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
    kv_cache = (
        series(
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
        .min(0)
        .max(1)
    )
    return [(8, 8, requests), (8, 8, progress), (8, 8, kv_cache)]


def panels() -> list[Row]:
    """The dashboard's rows, top to bottom."""
    return [
        status_row(),
        step_latency_row(),
        step_rates_row(),
        request_latency_row(),
        load_row(),
    ]
