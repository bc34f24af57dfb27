"""Who may use the API server (k3rocm.container.api_access), on the installed
vLLM's real app (0.27.1 or 0.32.0): ``build_app`` with the launcher's own
middleware flags, every route of its route table called with no key, a
wrong key and the right key.

No engine runs here (the routes' handlers fail without one, answering 500):
what is checked is who gets past the middlewares. The live server, behind
the image's launcher, is walked the same way in tests/deploy/test_compose_live.py.
"""

import pytest
from starlette.testclient import TestClient
from support.vllm_routes import build_app, make_arg_parser, plain_app, routes
from vllm.utils.argparse_utils import FlexibleArgumentParser

from k3rocm.common.vllm_release import TARGET
from k3rocm.container import api_access
from k3rocm.launcher.command import ACCESS_MIDDLEWARE, DRAIN_MIDDLEWARE

pytestmark = pytest.mark.every_line

KEY = "sk-route-walk-0d9c"
# vLLM's serving routes for a generating model: each needs the key.
# Written out so that a vLLM with other routes fails here until someone has
# decided, for each new one, whether it serves, is open or is admin.
SERVING = {
    "/version", "/tokenize", "/detokenize", "/v1/models", "/ping",
    "/invocations", "/v1/chat/completions", "/v1/chat/completions/batch",
    "/v1/responses", "/v1/responses/{response_id}",
    "/v1/responses/{response_id}/cancel", "/v1/completions", "/v1/messages",
    "/v1/messages/count_tokens", "/generative_scoring",
    "/v1/chat/completions/render", "/v1/completions/render",
    "/v1/chat/completions/derender", "/v1/completions/derender",
    "/inference/v1/generate",
}  # fmt: skip
# 0.32.0's new serving routes (besides /kv_event_sources, an admin route).
SERVING_0_32_0 = {
    "/inference/v1/abort_requests", "/v1/messages/render", "/v1/responses/render",
    "/v1/systemone",
}  # fmt: skip
SERVING = SERVING | SERVING_0_32_0 if TARGET.version == "0.32.0" else SERVING


def vllm_app(monkeypatch, tmp_path, key: str | None, admin: bool):
    """vLLM's app as the container's launcher configures it."""
    monkeypatch.setenv("K3_RUN_DIR", str(tmp_path))  # the drain mark's home
    if key is None:
        monkeypatch.delenv(api_access.KEY_ENV, raising=False)
    else:
        monkeypatch.setenv(api_access.KEY_ENV, key)
    monkeypatch.setenv("K3_API_ADMIN_ROUTES", "1" if admin else "0")
    parser = make_arg_parser(FlexibleArgumentParser())
    flags = ["--middleware", DRAIN_MIDDLEWARE, "--middleware", ACCESS_MIDDLEWARE]
    args = parser.parse_args(["--model", "m", *flags])
    return build_app(args, supported_tasks=("generate",))


def ours(response) -> str | None:
    """The access middleware's answer ("401"/"404"), or None where the
    request got past it."""
    if response.status_code in (401, 404):
        error = response.json().get("error")
        message = error.get("message", "") if isinstance(error, dict) else ""
        if "API key is required" in message or "admin routes are off" in message:
            return str(response.status_code)
    return None


def call(client, method, path, key=None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return client.request(method, path, headers=headers, json={})


def test_every_route_is_known():
    paths = {path for _, path, _ in routes(plain_app())}
    if TARGET.version == "0.32.0":
        assert "/kv_event_sources" in paths
    assert paths == api_access.OPEN_PATHS | SERVING | (paths & api_access.ADMIN_PATHS)
    assert paths & api_access.ADMIN_PATHS >= {
        "/scale_elastic_ep", "/is_scaling_elastic_ep", "/load", "/docs",
        "/openapi.json",
    }  # fmt: skip


@pytest.mark.parametrize("admin", [False, True], ids=["admin-off", "admin-on"])
def test_with_a_key_every_route_but_the_open_ones_needs_it(
    monkeypatch, tmp_path, admin
):
    app = vllm_app(monkeypatch, tmp_path, KEY, admin)
    client = TestClient(app, raise_server_exceptions=False)
    walked = routes(app)
    assert len(walked) > 30
    for method, path, concrete in walked:
        where = f"{method} {path}"
        without, wrong, right = (
            ours(call(client, method, concrete, key)) for key in (None, "sk-no", KEY)
        )
        if path in api_access.OPEN_PATHS:
            assert (without, wrong, right) == (None, None, None), where
            continue
        assert without == wrong == "401", where
        if path in api_access.ADMIN_PATHS and not admin:
            assert right == "404", where
        else:
            assert right is None, where


def test_without_a_key_the_routes_are_open_but_admin(monkeypatch, tmp_path):
    app = vllm_app(monkeypatch, tmp_path, None, False)
    client = TestClient(app, raise_server_exceptions=False)
    for method, path, concrete in routes(app):
        expected = "404" if path in api_access.ADMIN_PATHS else None
        assert ours(call(client, method, concrete)) == expected, f"{method} {path}"


def test_the_invocations_route_runs_nothing_without_the_key(monkeypatch, tmp_path):
    """What the issue saw: POST /invocations with a completion body and no
    Authorization header answered 200 with generated text."""
    client = TestClient(
        vllm_app(monkeypatch, tmp_path, KEY, False), raise_server_exceptions=False
    )
    body = {"model": "m", "prompt": "hello", "max_tokens": 4}
    response = client.post("/invocations", json=body)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    for header in ("Bearer sk-no", "Basic " + KEY, KEY, "Bearer"):
        response = client.post(
            "/invocations", json=body, headers={"Authorization": header}
        )
        assert response.status_code == 401, header


def test_a_preflight_passes_and_the_root_path_is_stripped():
    """OPTIONS passes; under a root path (vLLM's --root-path) the check
    reads the path below it, so /api/health is open and /api/docs admin."""
    import asyncio

    passed, sent = [], []

    async def app(scope, receive, send):
        passed.append(scope["path"])

    async def send(message):
        sent.append(message)

    middleware = api_access.ApiAccessMiddleware(app, {api_access.KEY_ENV: KEY})
    key = [(b"authorization", f"Bearer {KEY}".encode())]

    def status(path, method="GET", headers=(), root=""):
        passed.clear(), sent.clear()
        scope = {"type": "http", "path": path, "root_path": root,
                 "method": method, "headers": list(headers)}  # fmt: skip
        asyncio.run(middleware(scope, None, send))
        return 200 if passed else sent[0]["status"]

    assert status("/v1/completions", "OPTIONS") == 200
    assert status("/v1/completions") == 401
    assert status("/api/health", root="/api") == 200
    assert status("/api/docs/", headers=key, root="/api") == 404
    assert status("/api/v1/models", headers=key, root="/api") == 200
    assert status("/healthz") == 401
