"""Test session set-up every wing shares, none of it vLLM: Triton's
interpreter chosen before any Triton import, the release line under test,
the container tests' images and the stand-in health endpoint. Wings that
run vLLM import support.vllm_session in their own conftest.py (the patched
tree on sys.path)."""

import http.server
import os
import threading

# Before triton is imported anywhere: run kernels on CPU tensors.
os.environ["TRITON_INTERPRET"] = "1"

import pytest
from hypothesis import HealthCheck, settings
from support.docker_images import build_image, build_standin, require_engine
from support.registry import PUSHED, build_image_push, running_registry
from support.vllm_trees import ON_DEFAULT_LINE
from support.workers import TogetherScheduling, start_order

from k3rocm.tryout.tiny_model import build_for_containers

# Property tests judge behaviour, not speed: on two workers sharing 2 cores
# one slow example (a GC pause, a busy core) failed a test by Hypothesis's
# 200 ms deadline, or its too-slow health check, by luck.
settings.register_profile(
    "k3rocm", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("k3rocm")

# An environment of another release line than the default (.venv-<line>,
# scripts/test) runs only the tests marked every_line: the rest are about the
# default line's own vLLM (its bugs, its triage, its image, its launches).
OTHER_LINE = not ON_DEFAULT_LINE


def pytest_ignore_collect(collection_path, config):
    """There, a test file that marks nothing every_line is not even imported
    (it may import what only the default line's series ships)."""
    if OTHER_LINE and collection_path.suffix == ".py":
        name = collection_path.name
        if name.startswith("test_") and "every_line" not in collection_path.read_text():
            return True
    return None


def pytest_collection_modifyitems(config, items):
    """There, of the files collected, the tests not marked every_line are
    deselected. Then the files are put in the order two workers share them
    best in (scripts/test: pytest-xdist, --dist loadfile: each file whole on
    one worker, for its module fixtures: a server, a compose project,
    containers named per file)."""
    if OTHER_LINE:
        kept = [item for item in items if item.get_closest_marker("every_line")]
        dropped = [item for item in items if not item.get_closest_marker("every_line")]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept
    items.sort(key=start_order(items).__getitem__)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """scripts/test's --dist loadfile, keeping support.workers.RUN_TOGETHER's
    files on one worker."""
    if config.getvalue("dist") == "loadfile":
        return TogetherScheduling(config, log)
    return None


# The container tests' images (tests/support/docker_images.py), built once a session.
@pytest.fixture(scope="session")
def standin() -> str:
    require_engine()
    return build_standin()


@pytest.fixture(scope="session")
def image(standin) -> str:
    return build_image(standin)


@pytest.fixture(scope="session")
def registry(tmp_path_factory):
    """A real registry on a loopback port, for the whole session."""
    require_engine()
    with running_registry(tmp_path_factory.mktemp("registry")) as address:
        yield address


@pytest.fixture(scope="session")
def pushed_image(standin, image, registry) -> dict:
    """The image pushed by scripts/build-image --push (the build reuses the
    session image's layers): its reference pinned by the registry's digest."""
    pushed = build_image_push(standin, f"{registry}/kimi-k3-rocm")
    assert pushed.returncode == 0, pushed.stdout[-3000:] + pushed.stderr[-3000:]
    match = PUSHED.search(pushed.stdout)
    assert match, pushed.stdout[-3000:]
    repo, tag, digest = match.groups()
    return {
        "registry": registry,
        "repo": repo,
        "tag": tag,
        "digest": digest,
        "ref": f"{repo}:{tag}@{digest}",
        "output": pushed.stdout + pushed.stderr,
    }


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    return build_for_containers(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture
def vllm_health():
    """A real HTTP server on 127.0.0.2 answering /health with 200, standing
    in for vLLM's; yields its port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.2", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
