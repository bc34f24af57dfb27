"""``k3rocm_smoke_verdict``: the start-up smoke test's verdict on /metrics.

Read from the smoke test's JSON report (``K3_SMOKE_REPORT``): 1 pass, 0 fail,
-1 no verdict yet (no report, still running, or unreadable). Nothing in the
report may break /metrics: a report of any content, size or type reads as a
verdict.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import GaugeMetricFamily

from k3rocm.common.json_file import UnreadableJson, read_json_file
from k3rocm.common.metric_names import SMOKE_VERDICT
from k3rocm.common.smoke_report import VERDICT_PENDING, reported_verdict

log = logging.getLogger(__name__)

# How stale the verdict may be in multiprocess mode (well under any scrape
# interval worth using).
VERDICT_REFRESH_SECONDS = 5.0

DOCUMENTATION = (
    "Smoke test verdict on the stall-free prefill path: "
    "1 pass, 0 fail, -1 no verdict yet."
)


def read_smoke_verdict(report: Path) -> int:
    try:
        return reported_verdict(read_json_file(report))
    except FileNotFoundError:
        return VERDICT_PENDING
    except UnreadableJson as err:
        log.warning("smoke report %s is unreadable: %s; no verdict", report, err)
        return VERDICT_PENDING


def _verdict_or_pending(report: Path) -> int:
    # The last guard between a reader bug and a failed scrape, which would
    # take vLLM's own metrics down with ours.
    try:
        return read_smoke_verdict(report)
    except Exception:
        log.exception("reading the smoke report %s failed; no verdict", report)
        return VERDICT_PENDING


class SmokeVerdictCollector:
    """Reads the smoke report on every scrape (single-process mode)."""

    def __init__(self, report: Path):
        self.report = report

    def describe(self):
        return [self._family(VERDICT_PENDING)]

    def collect(self):
        return [self._family(_verdict_or_pending(self.report))]

    @staticmethod
    def _family(value: int) -> GaugeMetricFamily:
        return GaugeMetricFamily(SMOKE_VERDICT, DOCUMENTATION, value=value)


def refresh_verdict(
    gauge: Gauge,
    report: Path,
    stop: threading.Event,
    interval: float = VERDICT_REFRESH_SECONDS,
) -> None:
    """Set the gauge from the report every interval until stop is set; an
    error in one round is logged and the next round tries again."""
    while True:
        try:
            gauge.set(_verdict_or_pending(report))
        except Exception:
            log.exception("setting the smoke verdict gauge failed")
        if stop.wait(interval):
            return


class VerdictRefresher:
    """The verdict as a gauge a daemon thread refreshes (multiprocess mode,
    where a custom collector would be invisible)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        report: Path,
        interval: float = VERDICT_REFRESH_SECONDS,
    ):
        self.gauge = Gauge(
            SMOKE_VERDICT,
            DOCUMENTATION,
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.stop = threading.Event()
        # A daemon: it lives as long as the API server process.
        self.thread = threading.Thread(
            target=refresh_verdict,
            args=(self.gauge, report, self.stop, interval),
            name="k3rocm-smoke-verdict",
            daemon=True,
        )
        self.thread.start()


def install_smoke_verdict(
    registry: CollectorRegistry, report: Path, *, multiprocess: bool
) -> VerdictRefresher | None:
    """Put the verdict into registry: read per scrape in a single process,
    refreshed by a thread in prometheus_client's multiprocess mode."""
    if multiprocess:
        return VerdictRefresher(registry, report)
    registry.register(SmokeVerdictCollector(report))
    return None
