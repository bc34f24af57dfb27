"""The Grafana dashboard for kimi-k3-rocm servers, built with Grafana Labs'
typed builders (grafana-foundation-sdk, generated from Grafana's schemas;
the release for Grafana 11.6, compose.yaml's image).

    python -m k3rocm.monitoring.dashboard \
        --output monitoring/grafana/dashboards/kimi-k3-rocm.json

This module lays the rows (``dashboard_rows``, made of the panel kinds of
``dashboard_panels``) out on Grafana's grid, adds the variables and writes
the JSON. The committed JSON is what Grafana provisions; a test fails when
it differs from what is generated, so edit the rows and regenerate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as models

from k3rocm.monitoring import names as m
from k3rocm.monitoring.dashboard_panels import DATASOURCE
from k3rocm.monitoring.dashboard_rows import WIDTH, panels

UID = "kimi-k3-rocm"


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
