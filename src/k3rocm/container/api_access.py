"""Who may use the API server: with an API key set, every route needs it but
a short allow-list; vLLM's admin and development routes are off unless
``K3_API_ADMIN_ROUTES`` turns them on.

vLLM 0.27.1 checks its key only on a list of path prefixes (``/v1``, ...), so
``POST /invocations``, ``/generative_scoring``, ``/tokenize`` and the admin
action ``/scale_elastic_ep`` answered without it. ``ApiAccessMiddleware``
(``--middleware k3rocm.container.api_access.ApiAccessMiddleware``, the
outermost middleware of every API server process) denies by default: a
route vLLM adds in a later release needs the key too.

- ``OPEN_PATHS`` answer without the key: the container's health check, load
  balancers and Prometheus use them, and neither runs the model.
- ``ADMIN_PATHS`` (the target vLLM's admin, scaling and documentation routes,
  k3rocm.common.vllm_release)
  answer 404 unless ``K3_API_ADMIN_ROUTES`` is on, key or not; with it on
  they need the key like every other route.
- OPTIONS requests pass (CORS preflights; vLLM's own check skips them too).

The key is the one the launcher hands vLLM (``VLLM_API_KEY`` in the API
server's environment, read from ``K3_API_KEY_FILE``).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from k3rocm.common.setting_table import API_ADMIN_ROUTES
from k3rocm.common.vllm_release import TARGET

KEY_ENV = TARGET.api_key_env
OPEN_PATHS = TARGET.open_paths
ADMIN_PATHS = TARGET.admin_paths

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class ApiAccessMiddleware:
    """Pure ASGI middleware: 401 without the key, 404 for admin routes that
    are off; everything else passes untouched."""

    def __init__(self, app: App, environ: MutableMapping[str, str] | None = None):
        environ = os.environ if environ is None else environ
        self.app = app
        key = environ.get(KEY_ENV, "")
        self.key_digest = _digest(key) if key else None
        self.admin_routes = API_ADMIN_ROUTES.read(environ)

    def decide(self, path: str, method: str | None, headers) -> int:
        """200 (pass), 401 or 404 for one request."""
        if path in OPEN_PATHS or method == "OPTIONS":
            return 200
        if self.key_digest is not None and not self._has_key(headers):
            return 401
        if path.rstrip("/") in ADMIN_PATHS and not self.admin_routes:
            return 404
        return 200

    def _has_key(self, headers) -> bool:
        for name, value in headers:
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    return secrets.compare_digest(_digest(token), self.key_digest)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        status = self.decide(path, scope.get("method"), scope.get("headers", ()))
        if status == 200:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            await _answer(send, status)


_MESSAGES = {
    401: "a valid API key is required (Authorization: Bearer <key>)",
    404: "not found (vLLM's admin routes are off; K3_API_ADMIN_ROUTES=1 "
    "turns them on, behind the API key)",
}


async def _answer(send: Send, status: int) -> None:
    body = json.dumps({"error": {"message": _MESSAGES[status], "code": status}})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})
