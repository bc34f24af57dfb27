"""The stop's wait for the drain: poll the API server's in-flight count
(k3rocm.container.drain's middleware exports it on /metrics) until nothing is
in flight, the drain deadline passes or a second signal comes."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

from k3rocm.common.metric_names import API_IN_FLIGHT
from k3rocm.common.metrics_text import sample_total


class MetricsBusy(Exception):
    """/metrics took the connection but gave no answer in time: the API
    server is busy (its event loop serving streams), not gone."""


def requests_in_flight(metrics_url: str, timeout: float = 5) -> float | None:
    """The in-flight count from the API server's /metrics; None when nothing
    answers (not serving yet, or gone). Raises MetricsBusy on a timeout."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as response:
            text = response.read().decode(errors="replace")
    except OSError as err:
        # urllib wraps a timeout while connecting, not one while reading.
        cause = err.reason if isinstance(err, urllib.error.URLError) else err
        if isinstance(cause, TimeoutError):
            raise MetricsBusy(
                f"/metrics did not answer within {timeout:.1f} s"
            ) from err
        return None
    try:
        return sample_total(text, API_IN_FLIGHT)
    except ValueError:  # not the metrics format: no count to wait on
        return None


def wait_drained(
    metrics_url: str,
    deadline: float,
    interrupted: Callable[[], bool],
    log: Callable[[str], None],
    poll_seconds: float = 0.5,
    metrics_timeout: float = 5.0,
) -> None:
    """Wait until no request is in flight, the deadline passes, or
    ``interrupted()``; say which in one line. A busy /metrics is asked
    again (counted as still in flight), never taken for a server that is
    gone: skipping the drain would leave the streams to vLLM's own shutdown."""
    started = time.time()
    last, said_busy = None, False
    while True:
        timeout = max(0.1, min(metrics_timeout, deadline - time.time()))
        try:
            in_flight = requests_in_flight(metrics_url, timeout)
        except MetricsBusy as busy:
            if not said_busy:
                log(f"drain: {busy} (a busy server); asking again")
                said_busy = True
        else:
            if in_flight is None:
                log("drain: vLLM is not serving (no /metrics); nothing to drain")
                return
            if in_flight == 0:
                elapsed = time.time() - started
                log(f"drain: every accepted request finished in {elapsed:.1f} s")
                return
            if in_flight != last:
                log(f"drain: {in_flight:.0f} request(s) in flight; new ones get 503")
                last = in_flight
        if time.time() >= deadline:
            count = "an unknown number of" if last is None else f"{last:.0f}"
            log(
                f"drain: {count} request(s) still in flight at the drain "
                "deadline (K3_STOP_GRACE_SECONDS); their streams are cut off with "
                "an error"
            )
            return
        if interrupted():
            log("drain: a second stop signal; stopping without waiting further")
            return
        time.sleep(poll_seconds)
