"""Drain on stop: refuse new requests, finish the accepted ones.

vLLM 0.27.1's own shutdown does not drain an HTTP server: with
``--shutdown-timeout`` > 0 it keeps the engine stepping, but first shuts
the API server's renderer down, so every request not yet in the engine ends
at once with an empty stream (measured: 23 of 24 streams, 0 tokens, no
error); with 0 (the default) it aborts everything. So the drain happens in
front of vLLM, in its own HTTP server:

``DrainMiddleware`` (vLLM ``--middleware k3rocm.container.drain.DrainMiddleware``, in
every API server process) counts the requests in flight
(``k3rocm_api_requests_in_flight``) and, once the drain mark exists in the
run directory, answers every new request (``/health`` included, so load
balancers take the server out) with HTTP 503 and ``Retry-After``; only
``/metrics`` stays open. A request counts once its body has arrived whole:
it reads the body first, and a body that has not arrived within
``BODY_SECONDS`` is answered 408, one still awaited when a drain starts
503, one over ``K3_MAX_REQUEST_BYTES`` 413 (k3rocm.container.request_body),
each closing the connection, so a client that sends headers and never a
body holds no stop, and no body is held past the limit. A stream still
open when the drain deadline in the mark has passed gets an error event and
``[DONE]``, so its client knows why it ends.

``k3rocm.container.supervise run`` writes the mark on SIGTERM, waits
(k3rocm.container.drain_wait) until nothing is in flight or the deadline
passes, and only then stops vLLM (see k3rocm.common.stop_budget).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Gauge

from k3rocm.common.metric_names import (
    API_BODY_TIMEOUTS,
    API_IN_FLIGHT,
    API_REFUSED_DRAINING,
)
from k3rocm.common.run_files import DRAIN_MARK, run_dir
from k3rocm.container.request_body import TOO_LARGE, BodyLimit

# Paths that are neither counted nor refused: Prometheus keeps scraping.
UNGUARDED_PATHS = frozenset({"/metrics"})
RETRY_AFTER_SECONDS = 30
# A request body must have arrived whole within this; while it is awaited,
# the drain mark is looked for this often.
BODY_SECONDS = 60.0
BODY_POLL_SECONDS = 0.25
# A stream checks the deadline at most this often (not on every token).
DEADLINE_POLL_SECONDS = 0.5

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

IN_FLIGHT = Gauge(
    API_IN_FLIGHT,
    "HTTP requests the API server has accepted and not yet answered in full.",
    multiprocess_mode="livesum",
)
REFUSED = Counter(
    API_REFUSED_DRAINING,
    "HTTP requests refused with 503 because the server is draining for a stop.",
)
BODY_TIMEOUTS = Counter(
    API_BODY_TIMEOUTS,
    "HTTP requests answered 408 because their body did not arrive in time.",
)


def write_drain_mark(directory: Path, deadline: float) -> None:
    """Atomically: a half-written mark must not read as 'no drain'."""
    tmp = directory / f".{DRAIN_MARK}.{os.getpid()}"
    tmp.write_text(json.dumps({"deadline": deadline}) + "\n")
    os.replace(tmp, directory / DRAIN_MARK)


def read_drain_deadline(directory: Path) -> float | None:
    """The drain deadline (epoch seconds); None when no drain is under way.
    A mark that cannot be read still means draining, with the deadline now."""
    try:
        text = (directory / DRAIN_MARK).read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return time.time()
    try:
        deadline = json.loads(text)["deadline"]
        return float(deadline)
    except (ValueError, TypeError, KeyError, RecursionError):
        return time.time()


class DrainMiddleware:
    """Pure ASGI middleware (streams pass through untouched until the deadline)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]):
        self.app = app
        self.directory = run_dir()
        self.body_limit = BodyLimit(os.environ)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in UNGUARDED_PATHS:
            await self.app(scope, receive, send)
            return
        if read_drain_deadline(self.directory) is not None:
            REFUSED.inc()
            await _refuse(send)
            return
        if self.body_limit.refuses(scope.get("headers", ())):
            await self._too_large(send)
            return
        body = await self._read_body(receive, send)
        if body is None:
            return  # answered (408, 413, 503) or the client left
        # The check and the count happen in one step of the event loop, so a
        # drain that sees zero in flight cannot miss a request accepted before
        # its mark.
        if read_drain_deadline(self.directory) is not None:
            REFUSED.inc()
            await _refuse(send)
            return
        IN_FLIGHT.inc()
        guard = _DeadlineGuard(send, self.directory)
        try:
            await self.app(scope, _replay(body, receive), guard)
        finally:
            IN_FLIGHT.dec()
            await guard.close()

    async def _read_body(self, receive: Receive, send: Send) -> list | None:
        """The request's body messages, whole; None where it was answered
        instead (408 past BODY_SECONDS, 503 once a drain starts, 413 past
        the body limit) or the client disconnected."""
        messages: list[Message] = []
        received = 0
        deadline = time.monotonic() + BODY_SECONDS
        pending = None
        while True:
            if pending is None:
                pending = asyncio.ensure_future(receive())
            done, _ = await asyncio.wait({pending}, timeout=BODY_POLL_SECONDS)
            if done:
                message, pending = pending.result(), None
                if message["type"] == "http.disconnect":
                    return None
                messages.append(message)
                received += len(message.get("body", b""))
                if self.body_limit.passed(received):
                    await self._too_large(send)
                    return None
                if not message.get("more_body", False):
                    return messages
                continue
            if read_drain_deadline(self.directory) is not None:
                REFUSED.inc()
                await _refuse(send)
            elif time.monotonic() >= deadline:
                BODY_TIMEOUTS.inc()
                await _answer(send, 408, _BODY_TIMEOUT_MESSAGE, "RequestTimeout")
            else:
                continue
            pending.cancel()
            return None

    async def _too_large(self, send: Send) -> None:
        TOO_LARGE.inc()
        await _answer(send, 413, self.body_limit.message, "PayloadTooLarge")


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that hands out the body read already, then the client's
    later messages (a disconnect)."""
    queued = list(messages)

    async def replay() -> Message:
        if queued:
            return queued.pop(0)
        return await receive()

    return replay


_DRAINING_MESSAGE = (
    "the server is draining for a stop and takes no new requests; retry on "
    "another replica or after it restarts"
)
_BODY_TIMEOUT_MESSAGE = (
    f"the request body did not arrive within {BODY_SECONDS:.0f} s; send it "
    "with the headers"
)


async def _refuse(send: Send) -> None:
    await _answer(send, 503, _DRAINING_MESSAGE, "ServiceUnavailable")


async def _answer(send: Send, status: int, message: str, kind: str) -> None:
    """A JSON error that closes the connection."""
    body = json.dumps(
        {"error": {"message": message, "type": kind, "code": status}}
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if status == 503:
        headers.append((b"retry-after", str(RETRY_AFTER_SECONDS).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_CUT_OFF_EVENT = (
    "data: "
    + json.dumps(
        {
            "error": {
                "message": "the server is stopping and its drain time "
                "(K3_STOP_GRACE_SECONDS) is over; this response is cut off",
                "type": "ServiceUnavailable",
                "code": 503,
            }
        }
    )
    + "\n\ndata: [DONE]\n\n"
).encode()


class _DeadlineGuard:
    """The ``send`` of one request: ends an event stream with an error event
    once the drain deadline has passed, and drops what the app sends later."""

    def __init__(self, send: Send, directory: Path):
        self.send = send
        self.directory = directory
        self.streaming = False
        self.cut_off = False
        self.finished = False
        self.next_check = 0.0

    async def __call__(self, message: Message) -> None:
        if self.cut_off:
            return
        if message["type"] == "http.response.start":
            headers = dict(message.get("headers", ()))
            content_type = headers.get(b"content-type", b"")
            self.streaming = content_type.startswith(b"text/event-stream")
        elif self.streaming and message["type"] == "http.response.body":
            if self._past_deadline():
                await self._cut_off()
                return
            self.finished = not message.get("more_body", False)
        await self.send(message)

    async def _cut_off(self) -> None:
        self.cut_off = True
        await self.send({"type": "http.response.body", "body": _CUT_OFF_EVENT})

    async def close(self) -> None:
        """The app is done with this request. A stream it left open past the
        deadline (vLLM aborted it before its first token, say) still gets the
        error event and [DONE], so its client knows why it ends."""
        if not self.streaming or self.finished or self.cut_off:
            return
        self.next_check = 0.0
        if self._past_deadline():
            try:
                await self._cut_off()
            except Exception:  # the connection may be gone: nothing to tell
                pass

    def _past_deadline(self) -> bool:
        now = time.monotonic()
        if now < self.next_check:
            return False
        self.next_check = now + DEADLINE_POLL_SECONDS
        deadline = read_drain_deadline(self.directory)
        return deadline is not None and time.time() >= deadline
