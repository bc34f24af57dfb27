"""The panel kinds the dashboard's rows are made of (time series, latency
quantiles, stats) and the PromQL they query with, all reading the
dashboard's data source and instance variables.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models

DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")
INSTANCE = 'instance=~"$instance"'
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
