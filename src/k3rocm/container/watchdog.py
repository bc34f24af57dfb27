"""The stall watchdog: supervisord's ``watchdog`` program
(``python -m k3rocm.container.watchdog``), outside every vLLM process.

vLLM 0.27.1's ``/health`` only reports an engine that has errored; an engine
loop that hangs (a collective that never returns, a copy that never ends, a
stopped or deadlocked worker) keeps it at 200 while every request hangs. The
watchdog judges progress where the engine reports it: the metrics plugin's
``k3rocm_engine_last_step_timestamp_seconds`` and ``k3rocm_engine_requests``
and the drain middleware's ``k3rocm_api_requests_in_flight``, read from
``/metrics`` every ``poll`` seconds.

A **stall** is work pending (an engine's scheduler holds requests, or the API
server has requests in flight, or ``/metrics`` does not answer at all) with
no engine step for ``K3_STALL_SECONDS``. A step that ends, however slow, is
progress; an idle server is never stalled. Requests in flight while the
engine reports nothing to do (a client still reading a finished stream, a
request not yet handed to the engine) are told apart by a probe: a one-token
completion sent once half the time has passed, which a live engine answers
with a step. The watchdog judges only while the server is serving (ready
mark, no drain, no stop under way, its API server running: an exited vLLM
is the guard's), and starts afresh with each new vLLM.

On a stall: the ``stalled`` mark (the health check reports it at once), the
stacks of every vLLM process (k3rocm.container.forensics), then vLLM's process group is
killed and the container exits 5 (k3rocm.container.guard).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from k3rocm.common.api_address import api_base_url
from k3rocm.common.api_key import api_key_from_env
from k3rocm.common.engine_progress import (
    REQUEST_RUNNING,
    REQUEST_WAITING,
    utc,
    write_stall_mark,
)
from k3rocm.common.exit_codes import ExitCode
from k3rocm.common.line_log import line_logger
from k3rocm.common.metric_names import API_IN_FLIGHT, ENGINE_REQUESTS, LAST_STEP
from k3rocm.common.metrics_text import finite_samples
from k3rocm.common.node import group_leader_alive, headless_node
from k3rocm.common.run_files import (
    DRAIN_MARK,
    READY_MARK,
    REASON_FILE,
    STACK_HANDLERS,
    STALL_MARK,
    VLLM_GROUP_FILE,
    run_dir,
)
from k3rocm.common.setting_table import (
    FORENSICS_DIR,
    SERVED_MODEL_NAME,
    STALL_SECONDS,
)
from k3rocm.container.forensics import capture
from k3rocm.container.guard import record_stop_reason, stop_supervisord

log = line_logger("k3rocm.container.watchdog")
METRICS_TIMEOUT_SECONDS = 5
API = "api"  # the progress key of requests in flight at the API server


def poll_seconds(stall: int) -> float:
    """Ten looks within the stall time, at most one a second, at least one
    every 10 s (each look is a line in vLLM's access log)."""
    return min(10.0, max(1.0, stall / 10))


@dataclass(frozen=True)
class Engine:
    last_step: float
    running: float = 0.0
    waiting: float = 0.0

    @property
    def pending(self) -> float:
        return self.running + self.waiting


@dataclass(frozen=True)
class Look:
    """One look at /metrics: None for a server that did not answer."""

    in_flight: float
    engines: dict[str, Engine]


def parse_metrics(text: str) -> Look:
    in_flight = 0.0
    steps: dict[str, float] = {}
    requests: dict[tuple[str, str], float] = {}
    for sample in finite_samples(text):
        if sample.name == API_IN_FLIGHT:
            in_flight += sample.value
        elif sample.name == LAST_STEP:
            engine = sample.labels.get("engine", "0")
            steps[engine] = max(steps.get(engine, 0.0), sample.value)
        elif sample.name == ENGINE_REQUESTS:
            key = (sample.labels.get("engine", "0"), sample.labels.get("state", ""))
            requests[key] = requests.get(key, 0.0) + sample.value
    engines = {
        engine: Engine(
            last,
            requests.get((engine, REQUEST_RUNNING), 0.0),
            requests.get((engine, REQUEST_WAITING), 0.0),
        )
        for engine, last in steps.items()
    }
    return Look(in_flight, engines)


@dataclass(frozen=True)
class Stall:
    since: float  # unix time of the last progress
    pending: str  # what was pending, in words
    key: str  # which engine, or the API server

    def reason(self, now: float) -> str:
        return (
            f"the engine stalled: no engine step for {now - self.since:.0f} s "
            f"(since {utc(self.since)}) "
            f"with {self.pending} ({STALL_SECONDS.env})"
        )


@dataclass
class StallJudge:
    """Decides, look by look, whether the engine is stalled. Each engine is
    judged by its own steps; requests in flight at the API server by the
    newest step of any engine."""

    stall_seconds: float
    pending_since: dict[str, float] = field(default_factory=dict)
    last_look: Look | None = None

    def _progress(
        self, key: str, pending: bool, last_step: float, now: float
    ) -> float | None:
        """The time of the last progress of a pending key; None when idle."""
        if not pending:
            self.pending_since.pop(key, None)
            return None
        since = self.pending_since.setdefault(key, now)
        return max(since, last_step)

    def look(self, now: float, look: Look | None) -> tuple[Stall | None, bool]:
        """(the stall, if one; whether to probe the engine)."""
        answered = look is not None
        if look is None:
            # The API server does not answer: nothing it knows is new.
            previous = self.last_look or Look(0.0, {})
            look = Look(max(previous.in_flight, 1.0), previous.engines)
        self.last_look = look if answered else self.last_look
        newest_step = max((e.last_step for e in look.engines.values()), default=0.0)
        candidates: list[Stall] = []
        probe = False
        judged = [
            (
                f"engine {name}",
                engine.pending > 0,
                engine.last_step,
                f"{engine.running:.0f} running and {engine.waiting:.0f} waiting "
                f"request(s) on engine {name}",
            )
            for name, engine in sorted(look.engines.items())
        ]
        api_words = (
            f"{look.in_flight:.0f} HTTP request(s) in flight"
            if answered
            else "the API server not answering /metrics"
        )
        judged.append((API, look.in_flight > 0, newest_step, api_words))
        for key, pending, last_step, words in judged:
            progress = self._progress(key, pending, last_step, now)
            if progress is None:
                continue
            waited = now - progress
            if waited >= self.stall_seconds:
                candidates.append(Stall(progress, words, key))
            elif waited >= self.stall_seconds / 2:
                probe = True
        for name in list(self.pending_since):
            if name != API and name not in {key for key, *_ in judged}:
                self.pending_since.pop(name)
        stall = min(candidates, key=lambda s: s.since) if candidates else None
        return stall, probe and stall is None


def read_look(metrics_url: str) -> Look | None:
    try:
        with urllib.request.urlopen(
            metrics_url, timeout=METRICS_TIMEOUT_SECONDS
        ) as response:
            text = response.read().decode(errors="replace")
        return parse_metrics(text)
    except (OSError, urllib.error.URLError, ValueError):
        return None


class Probe:
    """One one-token completion at a time, in the background: a live engine
    answers it with a step."""

    def __init__(self, base_url: str, api_key: str | None, model: str, timeout: float):
        body = {"model": model, "prompt": "ping", "max_tokens": 1}
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.request = urllib.request.Request(
            f"{base_url}/v1/completions",
            data=json.dumps(body).encode(),
            headers=headers,
        )
        self.timeout = timeout
        self.thread: threading.Thread | None = None

    def send(self) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with urllib.request.urlopen(self.request, timeout=self.timeout) as answer:
                answer.read()
        except (OSError, urllib.error.URLError, ValueError):
            pass  # judged by the steps it causes, not by its answer


def serving(directory: Path) -> bool:
    return (
        (directory / READY_MARK).is_file()
        and not (directory / DRAIN_MARK).exists()
        and not (directory / REASON_FILE).exists()
        and not (directory / STALL_MARK).exists()
    )


def vllm_group(directory: Path) -> int | None:
    try:
        return int((directory / VLLM_GROUP_FILE).read_text())
    except (OSError, ValueError):
        return None


def on_stall(directory: Path, stall: Stall, now: float, group: int | None) -> None:
    """Mark, capture, record, kill, stop: in this order, so the health check
    says so at once, nothing is killed before its stacks are kept, and the
    guard takes vLLM's death for part of this stop, not a crash of its own."""
    write_stall_mark(directory, stall.since, now, stall.pending)
    reason = stall.reason(now)
    log(reason)
    if group is not None:
        capture(
            reason,
            group,
            FORENSICS_DIR.read(os.environ),
            log,
            handlers=directory / STACK_HANDLERS,
        )
    if not record_stop_reason(directory, ExitCode.STALL, reason):
        return  # another stop is under way
    if group is not None:
        try:
            os.killpg(group, signal.SIGKILL)  # a stalled vLLM cannot stop itself
        except (ProcessLookupError, PermissionError):
            pass
    stop_supervisord()


def watch(directory: Path, base_url: str, stall: int, probe: Probe) -> None:
    judge = StallJudge(stall)
    metrics_url = f"{base_url}/metrics"
    group, armed = None, False
    while True:
        time.sleep(poll_seconds(stall))
        if not serving(directory):
            judge, armed = StallJudge(stall), False
            continue
        current = vllm_group(directory)
        if current != group:  # a new vLLM: judge it from its first answer on
            group, judge, armed = current, StallJudge(stall), False
        if current is not None and not group_leader_alive(current):
            # vLLM exited: the guard's (it counts it, the next may take longer
            # than the stall time to start); its silence meanwhile is no stall.
            judge, armed = StallJudge(stall), False
            continue
        look = read_look(metrics_url)
        armed = armed or look is not None
        if not armed:
            continue
        now = time.time()
        found, should_probe = judge.look(now, look)
        if found is not None:
            on_stall(directory, found, now, group)
            return
        if should_probe:
            probe.send()


def probe_from_env(environ: Mapping[str, str], stall: float) -> Probe:
    """The probe as the container's settings make it: with the API key
    where there is one (the launcher refused a bad key file before vLLM
    started)."""
    return Probe(
        api_base_url(environ),
        api_key_from_env(environ),
        SERVED_MODEL_NAME.text(environ),
        stall,
    )


def main() -> int:
    try:
        stall = STALL_SECONDS.read(os.environ)
        base_url = api_base_url(os.environ)
    except ValueError as err:
        log(str(err))
        return ExitCode.SETTINGS
    if headless_node(os.environ) is not None:
        # No API server here: node 0's watchdog judges the job, this node's
        # guard captures its stacks when node 0 goes away.
        threading.Event().wait()
    try:
        probe = probe_from_env(os.environ, stall)
    except ValueError as err:  # ApiKeyFileError included
        log(str(err))
        return ExitCode.SETTINGS
    watch(run_dir(), base_url, stall, probe)
    threading.Event().wait()  # the guard stops the container
    return 0


if __name__ == "__main__":
    sys.exit(main())
