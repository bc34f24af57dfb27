"""The drain middleware (k3rocm.container.drain) driven through the ASGI interface with
a streaming app, and the stop budget's derivation; the container-level drain
(`docker stop` with streams in flight) is in test_container_docker.py."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from k3rocm.common.metric_names import API_BODY_TOO_LARGE
from k3rocm.common.setting_kinds import SettingError
from k3rocm.common.setting_table import MAX_REQUEST_BYTES, STOP_GRACE_SECONDS
from k3rocm.common.stop_budget import StopBudget
from k3rocm.container import drain

CHUNKS = 5


async def streaming_app(scope, receive, send):
    """Like vLLM's streaming completions: an event stream, one event per token."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
        }
    )
    for index in range(CHUNKS):
        await asyncio.sleep(0.02)
        body = f"data: {json.dumps({'choices': [{'text': str(index)}]})}\n\n"
        await send(
            {"type": "http.response.body", "body": body.encode(), "more_body": True}
        )
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def call(middleware, path: str = "/v1/completions", on_body=None) -> dict:
    """One request through the middleware; the status and the body sent."""
    sent: dict = {"status": None, "body": b"", "headers": {}}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]
            sent["headers"] = dict(message.get("headers", []))
        else:
            sent["body"] += message.get("body", b"")
            if on_body:
                on_body(sent)

    asyncio.run(middleware({"type": "http", "path": path}, receive, send))
    return sent


@pytest.fixture
def middleware(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(drain, "DEADLINE_POLL_SECONDS", 0)
    return drain.DrainMiddleware(streaming_app)


def in_flight() -> float:
    return REGISTRY.get_sample_value(drain.API_IN_FLIGHT)


def test_requests_pass_untouched_and_are_counted_while_running(middleware):
    seen = []
    sent = call(middleware, on_body=lambda _: seen.append(in_flight()))
    assert sent["status"] == 200
    assert sent["body"].count(b"data: ") == CHUNKS + 1
    assert seen and min(seen) >= 1
    assert in_flight() == 0


def test_new_requests_get_503_once_draining_but_metrics_stay_open(middleware, tmp_path):
    drain.write_drain_mark(tmp_path, time.time() + 60)
    refused = call(middleware)
    assert refused["status"] == 503
    assert refused["headers"][b"retry-after"] == b"30"
    assert "draining" in json.loads(refused["body"])["error"]["message"]
    assert call(middleware, path="/health")["status"] == 503
    assert call(middleware, path="/metrics")["status"] == 200


def test_a_stream_accepted_before_the_drain_finishes(middleware, tmp_path):
    def start_draining(sent):
        if sent["body"].count(b"data: ") == 1:
            drain.write_drain_mark(tmp_path, time.time() + 60)

    sent = call(middleware, on_body=start_draining)
    assert sent["body"].count(b"data: ") == CHUNKS + 1
    assert b"error" not in sent["body"]


def test_a_stream_past_the_deadline_ends_with_an_error_event(middleware, tmp_path):
    def deadline_passes(sent):
        if sent["body"].count(b"data: ") == 2:
            drain.write_drain_mark(tmp_path, time.time() - 1)

    sent = call(middleware, on_body=deadline_passes)
    events = [e for e in sent["body"].decode().split("\n\n") if e]
    assert len(events) == 4  # two tokens, the error, [DONE]; nothing after
    assert "drain time" in json.loads(events[2][len("data: ") :])["error"]["message"]
    assert events[3] == "data: [DONE]"
    assert in_flight() == 0


async def tokenless_stream_app(scope, receive, send):
    """A stream vLLM aborts before its first token: headers, then the app
    returns (or raises) without another message."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    await asyncio.sleep(0.05)
    if scope.get("raise"):
        raise RuntimeError("engine aborted")


@pytest.mark.parametrize("raises", [False, True])
def test_a_stream_ended_without_a_token_after_the_deadline_gets_the_error_event(
    tmp_path, monkeypatch, raises
):
    monkeypatch.setenv("K3_RUN_DIR", str(tmp_path))
    drain.write_drain_mark(tmp_path, time.time() + 60)
    guarded = drain.DrainMiddleware(tokenless_stream_app)
    sent = {"body": b""}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent["body"] += message.get("body", b"")

    async def run():
        # Accepted before the mark, cut off by a second stop signal's mark.
        (tmp_path / "draining").unlink()
        task = asyncio.create_task(
            guarded(
                {"type": "http", "path": "/v1/completions", "raise": raises},
                receive,
                send,
            )
        )
        await asyncio.sleep(0.01)
        drain.write_drain_mark(tmp_path, time.time())
        try:
            await task
        except RuntimeError:
            assert raises

    asyncio.run(run())
    events = [e for e in sent["body"].decode().split("\n\n") if e]
    assert "drain time" in json.loads(events[0][len("data: ") :])["error"]["message"]
    assert events[1:] == ["data: [DONE]"]


def test_a_stream_that_ended_before_the_deadline_gets_nothing_more(middleware):
    sent = call(middleware)
    assert sent["body"].endswith(b"data: [DONE]\n\n")
    assert b"error" not in sent["body"]


def test_a_torn_drain_mark_still_means_draining(tmp_path):
    (tmp_path / "draining").write_text("{not json")
    assert drain.read_drain_deadline(tmp_path) <= time.time()
    assert drain.read_drain_deadline(tmp_path / "elsewhere") is None


@given(st.integers(STOP_GRACE_SECONDS.kind.low, STOP_GRACE_SECONDS.kind.high))
def test_every_wait_fits_in_the_grace(grace):
    budget = StopBudget(grace)
    assert budget.drain_seconds + budget.teardown_seconds == grace
    assert 10 <= budget.teardown_seconds <= 60
    assert budget.drain_seconds >= grace // 2
    # vLLM's own timeout ends before supervisord's SIGKILL, which comes
    # 5 s before Docker's.
    assert 1 <= budget.vllm_shutdown_timeout < budget.stopwait_seconds
    assert budget.stopwait_seconds + 5 == budget.teardown_seconds


@pytest.mark.parametrize("text", ["abc", "19", "86401", "1e3", "-5", "9" * 400])
def test_a_bad_grace_is_refused_with_its_fix(text):
    with pytest.raises(SettingError, match="K3_STOP_GRACE_SECONDS"):
        STOP_GRACE_SECONDS.read({"K3_STOP_GRACE_SECONDS": text})


def test_unset_grace_is_the_default():
    budgets = [StopBudget(STOP_GRACE_SECONDS.read(env)) for env in (
        {}, {"K3_STOP_GRACE_SECONDS": ""}, {"K3_STOP_GRACE_SECONDS": " "})]  # fmt: skip
    assert budgets == [StopBudget(120)] * 3


def run_with_body(
    middleware, messages, *, drain_after=None, tmp_path=None, headers=(), taken=None
):
    """One POST whose body messages arrive as given (a float: wait that long
    first; None: never arrives), with ``headers``; with ``drain_after``
    seconds, the drain mark is written then; ``taken`` collects the
    messages the middleware received. Returns (status, what the app
    received, in-flight counts the app saw)."""
    sent: dict = {"status": None}
    got: list = []
    counts: list = []
    queue = list(messages)

    async def receive():
        while queue:
            item = queue.pop(0)
            if item is None:
                await asyncio.Event().wait()  # never
            if isinstance(item, float):
                await asyncio.sleep(item)
                continue
            if taken is not None:
                taken.append(item)
            return item
        await asyncio.Event().wait()

    async def app(scope, app_receive, send):
        counts.append(in_flight())
        while True:
            message = await app_receive()
            got.append(message)
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def send(message):
        if message["type"] == "http.response.start":
            sent["status"] = message["status"]
            sent["headers"] = dict(message.get("headers", []))

    async def main():
        wrapped = drain.DrainMiddleware(app)
        if drain_after is not None:

            async def mark():
                await asyncio.sleep(drain_after)
                drain.write_drain_mark(tmp_path, time.time() + 60)

            marker = asyncio.ensure_future(mark())
        scope = {
            "type": "http",
            "path": "/v1/completions",
            "method": "POST",
            "headers": list(headers),
        }
        await asyncio.wait_for(wrapped(scope, receive, send), 10)
        if drain_after is not None:
            await marker

    asyncio.run(main())
    return sent, got, counts


def chunk(body: bytes, more: bool) -> dict:
    return {"type": "http.request", "body": body, "more_body": more}


def test_a_body_in_pieces_reaches_the_app_whole_and_counts_only_then(middleware):
    before = in_flight()
    sent, got, counts = run_with_body(
        middleware, [chunk(b'{"a"', True), 0.3, chunk(b": 1}", False)]
    )
    assert sent["status"] == 200
    assert b"".join(m["body"] for m in got) == b'{"a": 1}'
    assert counts == [before + 1]
    assert in_flight() == before


def test_a_body_that_never_comes_is_answered_408_and_never_counted(
    middleware, monkeypatch
):
    monkeypatch.setattr(drain, "BODY_SECONDS", 0.6)
    before = in_flight()
    started = time.monotonic()
    sent, got, counts = run_with_body(middleware, [chunk(b"{", True), None])
    assert sent["status"] == 408 and sent["headers"][b"connection"] == b"close"
    assert 0.5 < time.monotonic() - started < 3
    assert got == [] and counts == []
    assert in_flight() == before


def test_a_drain_answers_a_bodiless_request_503_at_once(middleware, tmp_path):
    """Headers sent, the body never: the drain mark closes it within a poll,
    without it ever counting as in flight (it cannot hold the stop)."""
    before = in_flight()
    started = time.monotonic()
    sent, _, counts = run_with_body(
        middleware, [None], drain_after=0.3, tmp_path=tmp_path
    )
    assert sent["status"] == 503 and sent["headers"][b"connection"] == b"close"
    assert time.monotonic() - started < 0.3 + 2 * drain.BODY_POLL_SECONDS + 0.5
    assert counts == [] and in_flight() == before


def test_a_client_gone_before_its_body_leaves_nothing(middleware):
    sent, _, counts = run_with_body(middleware, [{"type": "http.disconnect"}])
    assert sent["status"] is None and counts == []


LIMIT = 4096  # K3_MAX_REQUEST_BYTES's lowest allowed value


@pytest.fixture
def limited(tmp_path, monkeypatch):
    monkeypatch.setenv("K3_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("K3_MAX_REQUEST_BYTES", str(LIMIT))


def too_large() -> float:
    return REGISTRY.get_sample_value(API_BODY_TOO_LARGE + "_total") or 0.0


def test_a_declared_length_over_the_limit_is_answered_413_before_any_body(limited):
    before, refused = in_flight(), too_large()
    taken: list = []
    sent, got, counts = run_with_body(
        None,
        [chunk(b"x" * 100, True), None],
        headers=[(b"content-length", str(1_500_000_000).encode())],
        taken=taken,
    )
    assert sent["status"] == 413 and sent["headers"][b"connection"] == b"close"
    assert taken == [] and got == [] and counts == []
    assert too_large() == refused + 1 and in_flight() == before


def test_a_chunked_body_is_cut_as_soon_as_it_passes_the_limit(limited):
    """No declared length: counted as it arrives, refused at the piece that
    passes the limit; the pieces after it are never read."""
    refused = too_large()
    pieces = [chunk(b"x" * 1000, True) for _ in range(10)] + [chunk(b"", False)]
    taken: list = []
    sent, got, counts = run_with_body(None, pieces, taken=taken)
    assert sent["status"] == 413
    assert len(taken) == LIMIT // 1000 + 1  # 5,000 bytes passed 4,096
    assert got == [] and counts == [] and too_large() == refused + 1


@given(
    sizes=st.lists(st.integers(0, 3 * LIMIT // 2), min_size=1, max_size=6),
    declared=st.booleans(),
)
def test_a_body_is_served_exactly_when_it_fits_and_never_read_far_past(sizes, declared):
    """Any split of any body, its length declared or not: the app gets it
    whole when it is at most the limit, else the client gets 413; the
    middleware never holds more than the limit and one piece."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("K3_MAX_REQUEST_BYTES", str(LIMIT))
        pieces = [chunk(b"y" * n, i < len(sizes) - 1) for i, n in enumerate(sizes)]
        headers = [(b"content-length", str(sum(sizes)).encode())] if declared else []
        taken: list = []
        sent, got, _ = run_with_body(None, pieces, headers=headers, taken=taken)
    fits = sum(sizes) <= LIMIT
    assert sent["status"] == (200 if fits else 413)
    assert b"".join(m["body"] for m in got) == (b"y" * sum(sizes) if fits else b"")
    held = sum(len(m["body"]) for m in taken)
    assert held <= LIMIT + max(sizes)
    if declared and not fits:
        assert taken == []


@pytest.mark.parametrize("text", ["0", "4095", "64MiB", "-1", str(2**34 + 1)])
def test_a_body_limit_that_cannot_be_used_is_refused_with_its_fix(text):
    with pytest.raises(SettingError) as refused:
        MAX_REQUEST_BYTES.read({"K3_MAX_REQUEST_BYTES": text})
    assert str(refused.value).startswith(f"K3_MAX_REQUEST_BYTES is '{text}', not a")
    assert "e.g. K3_MAX_REQUEST_BYTES=67108864" in str(refused.value)
