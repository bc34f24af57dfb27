"""The stall watchdog's judgement (k3rocm.container.watchdog) look by look, its reading
of a real /metrics text, its setting, and the health check's line for a
stall. The watchdog in the container, against a really stopped engine, is in
test_stall_docker.py."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from k3rocm.common.engine_progress import read_stall_mark, write_stall_mark
from k3rocm.common.metric_names import ENGINE_REQUESTS, LAST_STEP
from k3rocm.common.run_files import READY_MARK, STALL_MARK, VLLM_GROUP_FILE
from k3rocm.common.setting_table import STALL_SECONDS
from k3rocm.container import health, watchdog

STALL = 60.0


def look(in_flight=0.0, **engines) -> watchdog.Look:
    """engines: name=(last_step, running, waiting)."""
    return watchdog.Look(
        in_flight, {name: watchdog.Engine(*value) for name, value in engines.items()}
    )


def test_an_idle_server_is_never_stalled():
    judge = watchdog.StallJudge(STALL)
    for now in range(1000, 10_000, 7):
        assert judge.look(now, look(e0=(10.0, 0, 0))) == (None, False)


def test_a_slow_step_that_ends_is_progress():
    """Steps 0.9 x the stall time apart, work pending all along."""
    judge = watchdog.StallJudge(STALL)
    step = 1000.0
    for now in range(1000, 5000):
        if now - step >= 0.9 * STALL:
            step = float(now)
        stall, _ = judge.look(now, look(3, e0=(step, 2, 1)))
        assert stall is None


def test_pending_work_without_a_step_is_a_stall_after_the_stall_time():
    judge = watchdog.StallJudge(STALL)
    last = 1000.0
    assert judge.look(last, look(4, e0=(last, 4, 0))) == (None, False)
    stall, probe = judge.look(last + STALL / 2, look(4, e0=(last, 4, 0)))
    assert stall is None and probe
    stall, _ = judge.look(last + STALL - 1, look(4, e0=(last, 4, 0)))
    assert stall is None
    stall, _ = judge.look(last + STALL, look(4, e0=(last, 4, 0)))
    assert stall is not None and stall.since == last
    assert "4 running and 0 waiting request(s) on engine e0" in stall.pending


def test_time_counts_from_when_work_appeared_not_from_an_old_step():
    """An hour idle, then a request: the engine has the stall time from the
    request on, not from its last step an hour ago."""
    judge = watchdog.StallJudge(STALL)
    judge.look(4600, look(0, e0=(1000.0, 0, 0)))
    assert judge.look(4601, look(1, e0=(1000.0, 0, 0)))[0] is None
    assert judge.look(4601 + STALL - 1, look(1, e0=(1000.0, 0, 0)))[0] is None
    stall = judge.look(4601 + STALL, look(1, e0=(1000.0, 0, 0)))[0]
    assert stall is not None and stall.key == watchdog.API and stall.since == 4601


def test_a_silent_api_server_counts_as_pending():
    judge = watchdog.StallJudge(STALL)
    judge.look(2000, look(0, e0=(1999.0, 0, 0)))
    assert judge.look(2001, None)[0] is None
    stall = judge.look(2001 + STALL, None)[0]
    assert stall is not None and "not answering /metrics" in stall.pending


def test_one_stalled_engine_of_two_is_a_stall():
    judge = watchdog.StallJudge(STALL)
    for now in range(1000, 1000 + int(STALL)):
        assert judge.look(now, look(2, e0=(now, 1, 0), e1=(999.0, 1, 0)))[0] is None
    stall = judge.look(1000 + STALL, look(2, e0=(1060.0, 1, 0), e1=(999.0, 1, 0)))[0]
    assert stall is not None and stall.key == "engine e1"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.1, 30),  # seconds until the next look
            st.booleans(),  # did the engine step since the last look
            st.integers(0, 5),  # running on the engine
            st.integers(0, 5),  # HTTP requests in flight
            st.booleans(),  # /metrics answered
        ),
        min_size=1,
        max_size=80,
    )
)
def test_judge_against_a_reference(looks):
    """Against the rule stated directly: each of the engine's queue and the
    API server's requests is pending from the look it is first seen pending
    (a silent API server is pending; its engine keeps its last known queue);
    a stall when, for a pending one, the newer of that moment and the last
    step lies the stall time or more in the past."""
    judge = watchdog.StallJudge(STALL)
    now = last_step = 10_000.0
    known_running = 0
    since = {"engine": None, "api": None}
    for gap, stepped, running, in_flight, answered in looks:
        now += gap
        if answered:
            known_running = running
            if stepped:
                last_step = now
        pending = {"engine": known_running > 0, "api": in_flight > 0 or not answered}
        for key, is_pending in pending.items():
            if not is_pending:
                since[key] = None
            elif since[key] is None:
                since[key] = now
        expected = any(
            start is not None and now - max(start, last_step) >= STALL
            for start in since.values()
        )
        seen = look(in_flight, e0=(last_step, running, 0)) if answered else None
        stall, _ = judge.look(now, seen)
        assert (stall is not None) == expected
        if stall is not None:
            return  # the watchdog stops at the first stall


def test_reads_the_metrics_text_prometheus_client_writes():
    registry = CollectorRegistry()
    last = Gauge(LAST_STEP, "x", ["model_name", "engine"], registry=registry)
    requests = Gauge(
        ENGINE_REQUESTS,
        "x",
        ["model_name", "engine", "state"],
        registry=registry,
    )
    in_flight = Gauge("k3rocm_api_requests_in_flight", "x", registry=registry)
    last.labels("kimi-k3", "0").set(1234.5)
    requests.labels("kimi-k3", "0", "running").set(3)
    requests.labels("kimi-k3", "0", "waiting").set(2)
    in_flight.set(4)
    parsed = watchdog.parse_metrics(generate_latest(registry).decode())
    assert parsed.in_flight == 4
    assert parsed.engines == {"0": watchdog.Engine(1234.5, 3, 2)}


@pytest.mark.parametrize(
    "text", ["0", "4", "86401", "1e3", " 12x", "-30", "٣٠", "9" * 40]
)
def test_malformed_stall_seconds_are_refused(text):
    with pytest.raises(ValueError, match=r"K3_STALL_SECONDS is .*; set a whole number"):
        STALL_SECONDS.read({"K3_STALL_SECONDS": text})


def test_stall_seconds_default_and_bounds():
    assert STALL_SECONDS.read({}) == 300
    assert STALL_SECONDS.read({"K3_STALL_SECONDS": " 5 "}) == 5
    assert STALL_SECONDS.read({"K3_STALL_SECONDS": "86400"}) == 86400


def test_the_health_check_reports_a_stall_at_once(tmp_path, vllm_health):
    (tmp_path / READY_MARK).write_text("pass\n")
    base = f"http://127.0.0.2:{vllm_health}"
    assert health.check(tmp_path, base)[0]
    write_stall_mark(tmp_path, 1_700_000_000.0, 1_700_000_300.0, "4 HTTP request(s)")
    healthy, line = health.check(tmp_path, base)
    assert not healthy
    since = "2023-11-14T22:13:20Z"
    assert line == f"unhealthy: the engine stalled since {since} with 4 HTTP request(s)"


@pytest.mark.parametrize("content", [b"", b"{", b"[]", b'{"since": "x"}', b"\xff"])
def test_a_malformed_stall_mark_still_reads_as_a_stall(tmp_path, content):
    (tmp_path / STALL_MARK).write_bytes(content)
    line = read_stall_mark(tmp_path)
    assert line is not None and line.startswith("unhealthy: the engine stalled")


def test_stall_mark_round_trip(tmp_path):
    write_stall_mark(tmp_path, 5.0, 7.0, "1 HTTP request(s) in flight")
    assert json.loads((tmp_path / STALL_MARK).read_text())["detected"] == 7.0
    assert read_stall_mark(tmp_path) is not None
    assert read_stall_mark(tmp_path / "nothing") is None


# The watchdog's loop in its own process, on_stall only reported: between a
# vLLM that exited and the next (supervisord restarts it; the next start
# first reaps what is left of the dead one's group, up to 30 s), /metrics is
# silent while the run directory still says "ready".
WATCH = """
import sys
from pathlib import Path
from k3rocm.container import watchdog
def stalled(*_):
    print("stalled", flush=True)
    sys.exit(0)
watchdog.on_stall = stalled
probe = watchdog.Probe(sys.argv[2], None, "kimi-k3", 1.0)
watchdog.watch(Path(sys.argv[1]), sys.argv[2], 2, probe)
"""


@pytest.mark.parametrize("leader", ["exited", "running (planted: a silent server)"])
def test_a_vllm_that_exited_is_no_stall_while_the_next_starts(tmp_path, leader):
    registry = CollectorRegistry()
    Gauge(LAST_STEP, "x", ["model_name", "engine"], registry=registry).labels(
        "kimi-k3", "0"
    ).set(1.0)
    metrics = generate_latest(registry)
    answered = threading.Semaphore(0)

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(metrics)
            answered.release()

        def log_message(self, *_):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    vllm = subprocess.Popen(["sleep", "60"], start_new_session=True)
    (tmp_path / READY_MARK.name).write_text("pass\n")
    (tmp_path / VLLM_GROUP_FILE.name).write_text(f"{vllm.pid}\n")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    watch = subprocess.Popen(
        [sys.executable, "-c", WATCH, str(tmp_path), url], stdout=subprocess.PIPE
    )
    try:
        for _ in range(2):  # looks that answer: the watchdog is armed
            assert answered.acquire(timeout=60), "the watchdog never looked"
        server.shutdown()
        server.server_close()
        if leader == "exited":
            vllm.kill()
            vllm.wait()
        try:
            out, _ = watch.communicate(timeout=8)  # four times the stall time
        except subprocess.TimeoutExpired:
            out = b""
        assert (b"stalled" in out) == (leader != "exited")
    finally:
        watch.kill()
        vllm.kill()
        vllm.wait()
