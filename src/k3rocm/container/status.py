"""The container's own metrics endpoint, up from its first second.

vLLM serves no HTTP until the weights are loaded (hours for Kimi-K3), so
Prometheus would see nothing of a start-up. supervisord's ``status`` program
(``python -m k3rocm.container.status``) serves, on ``K3_STATUS_HOST`` and
``K3_STATUS_PORT``, at ``/metrics`` only (every other path is 404):

``k3rocm_container_phase{phase}``
    1 for the current phase, 0 for the others: ``stage1`` (smoke stage 1,
    before vLLM starts), ``loading`` (vLLM starting, no ``/health`` yet),
    ``stage2`` (vLLM answers, smoke stage 2 runs), ``serving`` (ready mark
    written), ``draining`` (a stop is draining), ``stopping`` (a stop reason
    was written: the container is about to exit).
``k3rocm_container_phase_seconds{phase}``
    Seconds in the current phase (one series, the current phase's), counted
    from when the phase began: the time its mark was written in the run
    directory (loading: the stage-1 gate; serving: the ready mark;
    draining, stopping: theirs); stage1 and stage2, which have none, from
    when this server first saw them (stage1 from its own start, at the
    container's; stage2 within a scrape of vLLM's first answer), kept in
    ``phase-since.json`` so that a restarted server keeps counting.
``k3rocm_smoke_stage1_verdict``
    Smoke stage 1: 1 pass, 0 fail, -1 not finished.
``k3rocm_container_load_alert_seconds``
    K3_LOAD_ALERT_SECONDS, the operator's bound on loading; the alert
    KimiK3LoadSlow compares the loading time with it.
``k3rocm_container_stall_seconds``
    K3_STALL_SECONDS, the watchdog's stall time; the alert
    KimiK3EngineStalled compares the age of the engine's last step with it.

The phase is read from the run directory (k3rocm.common.run_files) and, between the
stage-1 gate and the ready mark, from vLLM's ``/health``, on every scrape.
"""

from __future__ import annotations

import os
import socket
import socketserver
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric

from k3rocm.common.api_address import BadAddress, api_base_url
from k3rocm.common.exit_codes import ExitCode
from k3rocm.common.json_file import UnreadableJson, read_json_file, write_json_file
from k3rocm.common.line_log import line_logger
from k3rocm.common.metric_names import (
    CONTAINER_PHASE,
    CONTAINER_PHASE_SECONDS,
    CONTAINER_PHASES,
    LOAD_ALERT_BOUND,
    STAGE1_VERDICT,
    STALL_BOUND,
)
from k3rocm.common.run_files import (
    DRAIN_MARK,
    PHASE_SINCE,
    READY_MARK,
    REASON_FILE,
    STAGE1_GATE,
    run_dir,
    smoke_report_path,
)
from k3rocm.common.setting_kinds import read_all
from k3rocm.common.setting_table import (
    LOAD_ALERT_SECONDS,
    STALL_SECONDS,
    STATUS_HOST,
    STATUS_PORT,
)
from k3rocm.common.smoke_report import (
    VERDICT_FAIL,
    VERDICT_PASS,
    VERDICT_PENDING,
    read_mark,
    reported_verdict,
)
from k3rocm.common.states import Verdict

log = line_logger("k3rocm.container.status")

# The settings this server reads.
STATUS_SETTINGS = (STATUS_HOST, STATUS_PORT, LOAD_ALERT_SECONDS, STALL_SECONDS)
# The one path this server answers.
METRICS_PATH = "/metrics"
# The metrics this server exports.


def vllm_answers(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def current_phase(directory: Path, base_url: str) -> str:
    if (directory / DRAIN_MARK).exists():
        return "draining"
    if (directory / REASON_FILE).exists():
        return "stopping"
    if (directory / READY_MARK).exists():
        return "serving"
    if not (directory / STAGE1_GATE).exists():
        return "stage1"
    return "stage2" if vllm_answers(base_url) else "loading"


# The mark each phase begins with, where it has one.
PHASE_MARKS = {
    "loading": STAGE1_GATE,
    "serving": READY_MARK,
    "draining": DRAIN_MARK,
    "stopping": REASON_FILE,
}


class PhaseClock:
    """When the current phase began (epoch seconds)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.path = directory / PHASE_SINCE
        try:
            seen = read_json_file(self.path)
            self.seen = {str(k): float(v) for k, v in seen.items()}
        except (FileNotFoundError, UnreadableJson, AttributeError, ValueError):
            self.seen = {}

    def began(self, phase: str) -> float:
        mark = PHASE_MARKS.get(phase)
        if mark is not None:
            try:
                return (self.directory / mark).stat().st_mtime
            except OSError:
                pass  # gone between the look and now: count from here
        if phase not in self.seen:
            self.seen[phase] = time.time()
            try:
                write_json_file(self.path, self.seen)
            except OSError:
                pass  # counted in memory; a restart starts again
        return self.seen[phase]


def stage1_verdict(directory: Path, report: Path) -> int:
    """From the stage-1 gate (written when vLLM may start), else from the
    report (a stage 1 failed under `stop` writes no gate)."""
    try:
        gate = read_mark(directory / STAGE1_GATE)
    except OSError:
        gate = ""
    if gate:
        # A gate is written whole, pass or fail; anything else is no pass.
        return VERDICT_PASS if gate == Verdict.PASS else VERDICT_FAIL
    try:
        return reported_verdict(read_json_file(report), "stage1")
    except (FileNotFoundError, UnreadableJson):
        return VERDICT_PENDING


class StartupCollector:
    """Computes the phase on each scrape; remembers when it last changed."""

    def __init__(
        self, directory: Path, base_url: str, load_alert_seconds: int, stall: int
    ):
        self.directory = directory
        self.base_url = base_url
        self.load_alert_seconds = load_alert_seconds
        self.stall_seconds = stall
        self.report = smoke_report_path()
        self.lock = threading.Lock()
        self.clock = PhaseClock(directory)

    def collect(self) -> Iterator[Metric]:
        phase = current_phase(self.directory, self.base_url)
        with self.lock:
            seconds = max(0.0, time.time() - self.clock.began(phase))
        states = GaugeMetricFamily(
            CONTAINER_PHASE,
            "Start-up phase of the container: 1 for the current one.",
            labels=["phase"],
        )
        for name in CONTAINER_PHASES:
            states.add_metric([name], 1.0 if name == phase else 0.0)
        yield states
        in_phase = GaugeMetricFamily(
            CONTAINER_PHASE_SECONDS,
            "Seconds the container has been in its current phase.",
            labels=["phase"],
        )
        in_phase.add_metric([phase], seconds)
        yield in_phase
        yield GaugeMetricFamily(
            STAGE1_VERDICT,
            "Smoke test stage 1: 1 pass, 0 fail, -1 not finished.",
            value=stage1_verdict(self.directory, self.report),
        )
        yield GaugeMetricFamily(
            LOAD_ALERT_BOUND,
            "K3_LOAD_ALERT_SECONDS: loading longer than this raises KimiK3LoadSlow.",
            value=self.load_alert_seconds,
        )
        yield GaugeMetricFamily(
            STALL_BOUND,
            "K3_STALL_SECONDS: an engine this long without a step while "
            "requests are pending is stalled.",
            value=self.stall_seconds,
        )


def only_metrics(metrics: Callable) -> Callable:
    """A WSGI app that serves ``metrics`` at METRICS_PATH and 404 elsewhere,
    so the port shows nothing it was not opened for."""

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == METRICS_PATH:
            return metrics(environ, start_response)
        body = f"not found: this port serves {METRICS_PATH} only\n".encode()
        start_response(
            "404 Not Found",
            [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # every scrape would be a log line


def serve(host: str, port: int, registry: CollectorRegistry) -> WSGIServer:
    """Listen on host:port (an IPv4 or IPv6 address, or a name of this
    node) in a thread of its own; OSError where it cannot."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        address_family = family
        daemon_threads = True  # a scrape in flight does not hold an exit

    server = make_server(
        host, port, only_metrics(make_wsgi_app(registry)), Server, _QuietHandler
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> int:
    values, problems = read_all(os.environ, STATUS_SETTINGS)
    try:
        base_url = api_base_url(os.environ)
    except BadAddress as err:
        problems.append(str(err))
    for problem in problems:
        log(problem)
    if problems:
        return ExitCode.SETTINGS
    host, port = values[STATUS_HOST.name], values[STATUS_PORT.name]
    bound = values[LOAD_ALERT_SECONDS.name]
    stall = values[STALL_SECONDS.name]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StartupCollector(run_dir(), base_url, bound, stall))
    try:
        serve(host, port, registry)
    except OSError as err:
        log(
            f"cannot listen on {host}:{port} ({err}); set "
            f"{STATUS_HOST.env} to an address of this node (or 0.0.0.0) and "
            f"{STATUS_PORT.env} to a free port"
        )
        return ExitCode.SETTINGS
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    print(f"k3rocm.container.status: start-up metrics on {where}{METRICS_PATH}")
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
