"""The Grafana dashboard for kimi-k3-rocm servers, built with Grafana Labs'
typed builders (grafana-foundation-sdk, generated from Grafana's schemas;
the release for Grafana 11.6, compose.yaml's image).

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

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models import prometheus as prometheus_models

from k3rocm.common.setting_table import STATUS_PORT
from k3rocm.monitoring import names as m

UID = "kimi-k3-rocm"
DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
INSTANCE = 'instance=~"$instance"'
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
Panel = timeseries.Panel | stat.Panel | table.Panel


def rate(metric: str, selector: str = INSTANCE) -> str:
    return f"rate({metric}{{{selector}}}[$__rate_interval])"


def quantile(q: float, histogram: str, by: str, selector: str = INSTANCE) -> str:
    return (
        f"histogram_quantile({q}, sum by ({by}) "
        f"({rate(histogram + '_bucket', selector)}))"
    )


def target(ref: str, expr: str, legend: str) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery()
        .ref_id(ref)
        .datasource(DATASOURCE)
        .expr(expr)
        .legend_format(legend)
    )


def with_targets(panel: Panel, *targets: prometheus.Dataquery) -> Panel:
    for query in targets:
        panel = panel.with_target(query)
    return panel


def series(
    title: str, unit: str, targets: list[prometheus.Dataquery], description: str
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    return with_targets(panel, *targets)


def latency_panel(title: str, histogram: str, description: str) -> timeseries.Panel:
    return series(
        title,
        "s",
        [
            target("A", quantile(0.5, histogram, "le"), "p50"),
            target("B", quantile(0.99, histogram, "le"), "p99"),
        ],
        description,
    )


def stat_panel(
    title: str, description: str, expr: str, legend: str, text_mode
) -> stat.Panel:
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .text_mode(text_mode)
    )
    return with_targets(panel, target("A", expr, legend))


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


def variables() -> list:
    # Both scrape jobs: the container's is up while vLLM still loads.
    instances = f'label_values(up{{job=~"{"|".join(m.JOBS)}"}}, instance)'
    return [
        builders.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .hide(models.VariableHide.DONT_HIDE),
        builders.QueryVariable("instance")
        .label("Instance")
        .datasource(DATASOURCE)
        .query({"query": instances, "refId": "instances"})
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .hide(models.VariableHide.DONT_HIDE)
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC),
    ]


def builder() -> builders.Dashboard:
    board = (
        builders.Dashboard("Kimi-K3 on ROCm: engine steps and serving")
        .uid(UID)
        .description(
            "Engine step latency from the k3rocm vLLM plugin next to vLLM's own "
            "serving metrics."
        )
        .tags(["kimi-k3", "vllm", "rocm"])
        .editable()
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        .version(1)
        .time("now-1h", "now")
        .refresh("30s")
    )
    for variable in variables():
        board = board.with_variable(variable)
    y, panel_id = 0, 1
    for row in panels():
        x = 0
        for width, height, panel in row:
            grid = models.GridPos(h=height, w=width, x=x, y=y)
            board = board.with_panel(panel.id(panel_id).grid_pos(grid))
            panel_id += 1
            x += width
        assert x == WIDTH, f"row at y={y} is {x} wide, not {WIDTH}"
        y += max(height for _, height, _ in row)
    return board


def dashboard() -> dict:
    """The dashboard's JSON model, as Grafana reads it."""
    return json.loads(JSONEncoder().encode(builder().build()))


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


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
