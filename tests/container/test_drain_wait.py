"""The stop's wait for the drain (k3rocm.container.drain_wait) against a real
HTTP /metrics on a loopback port whose answers a script sets: a count, a
slow answer (a busy API server), or nothing listening."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.workers import free_port

from k3rocm.common.metric_names import API_IN_FLIGHT
from k3rocm.container.drain_wait import MetricsBusy, requests_in_flight, wait_drained

# A "slow" answer comes this long after the request, past the wait's timeout.
SLOW_SECONDS = 1.0
TIMEOUT = 0.3


class ScriptedMetrics:
    """/metrics answering each scrape as the script says: a number is the
    in-flight gauge, "slow" is a gauge of 1 sent after SLOW_SECONDS, any other
    text is the answer as it stands; the last entry repeats."""

    def __init__(self, script: list):
        self.script, self.scrapes = list(script), 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                step = outer.script[min(outer.scrapes, len(outer.script) - 1)]
                outer.scrapes += 1
                if step == "slow":
                    time.sleep(SLOW_SECONDS)
                    step = 1
                if isinstance(step, str):
                    body = step.encode()
                else:
                    body = f'{API_IN_FLIGHT}{{pid="7"}} {step}.0\n'.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # A late answer's client has gone (the wait's timeout): no traceback.
        self.server.handle_error = lambda request, address: None
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metrics(request):
    served = ScriptedMetrics(request.param)
    yield served
    served.close()


def drain(url: str, seconds: float, interrupted=lambda: False) -> tuple[list, float]:
    lines: list[str] = []
    started = time.monotonic()
    wait_drained(
        url,
        time.time() + seconds,
        interrupted,
        lines.append,
        poll_seconds=0.05,
        metrics_timeout=TIMEOUT,
    )
    return lines, time.monotonic() - started


@pytest.mark.parametrize("metrics", [["slow", "slow", 2, 2, 0]], indirect=True)
def test_a_busy_metrics_is_asked_again_not_taken_for_a_server_gone(metrics):
    """Under load the API server's /metrics can answer late; the stop must
    still wait for the streams (skipping the drain would leave them to vLLM's
    own shutdown). Fails on a wait that reads a timeout as "not serving"."""
    lines, _ = drain(metrics.url, 30)
    assert not any("not serving" in line for line in lines), lines
    assert lines[0] == (
        f"drain: /metrics did not answer within {TIMEOUT:.1f} s (a busy server); "
        "asking again"
    )
    assert lines[1:] == [
        "drain: 2 request(s) in flight; new ones get 503",
        lines[-1],
    ]
    assert lines[-1].startswith("drain: every accepted request finished in ")
    assert metrics.scrapes == 5


def test_nothing_listening_is_not_serving_at_once():
    lines, took = drain(f"http://127.0.0.1:{free_port()}/metrics", 30)
    assert lines == ["drain: vLLM is not serving (no /metrics); nothing to drain"]
    assert took < 5


@pytest.mark.parametrize("metrics", [[3, "slow"]], indirect=True)
def test_a_server_busy_to_the_end_is_waited_for_until_the_deadline_only(metrics):
    lines, took = drain(metrics.url, 2.0)
    assert lines[-1] == (
        "drain: 3 request(s) still in flight at the drain deadline "
        "(K3_STOP_GRACE_SECONDS); their streams are cut off with an error"
    )
    # Each late scrape is cut at the time left, not the full timeout.
    assert 2.0 <= took < 2.0 + TIMEOUT + 0.5, took


@pytest.mark.parametrize("metrics", [["slow"]], indirect=True)
def test_a_count_never_read_is_said_unknown_at_the_deadline(metrics):
    lines, _ = drain(metrics.url, 1.0)
    assert lines[-1].startswith(
        "drain: an unknown number of request(s) still in flight at the drain deadline"
    ), lines


@pytest.mark.parametrize("metrics", [[4]], indirect=True)
def test_a_second_signal_ends_the_wait(metrics):
    lines, took = drain(metrics.url, 30, interrupted=lambda: True)
    assert lines == [
        "drain: 4 request(s) in flight; new ones get 503",
        "drain: a second stop signal; stopping without waiting further",
    ]
    assert took < 5


@pytest.mark.parametrize("metrics", [["slow"]], indirect=True)
def test_a_late_answer_raises_busy_and_a_prompt_one_is_the_count(metrics):
    with pytest.raises(MetricsBusy, match=r"did not answer within 0\.3 s"):
        requests_in_flight(metrics.url, TIMEOUT)
    metrics.script = [5]
    assert requests_in_flight(metrics.url, TIMEOUT) == 5.0


def test_a_connection_never_taken_is_busy_too():
    """A listening API server too busy to accept: the connect times out
    (urllib wraps that timeout, unlike one while reading)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)  # never accepted: the queue fills, later SYNs wait
        port = server.getsockname()[1]
        queued = [socket.socket() for _ in range(3)]
        for client in queued:
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
        try:
            with pytest.raises(MetricsBusy):
                requests_in_flight(f"http://127.0.0.1:{port}/metrics", TIMEOUT)
        finally:
            for client in queued:
                client.close()


@pytest.mark.parametrize(
    "metrics",
    [
        [
            f"# TYPE {API_IN_FLIGHT} gauge\n"
            f'{API_IN_FLIGHT}{{pid="7"}} 2.0 1700000000000\n'
            f'{API_IN_FLIGHT}{{pid="8"}} 1.0\n'
        ]
    ],
    indirect=True,
)
def test_the_count_is_read_as_prometheus_reads_it(metrics):
    """One reader for the drain and the watchdog (k3rocm.common.metrics_text):
    a sample's timestamp is not its value."""
    assert requests_in_flight(metrics.url, TIMEOUT) == 3.0


@pytest.mark.parametrize(
    "metrics", [["this is not the metrics format {\n"]], indirect=True
)
def test_an_answer_that_is_not_metrics_gives_no_count(metrics):
    assert requests_in_flight(metrics.url, TIMEOUT) is None
