"""compose.yaml, brought up for real with docker-compose on this machine's
Docker engine: the server (the image built on the stand-in base, cpu-dev on
the tiny model) and Prometheus.

What differs from an AMD host, and how: the server's GPU `devices`, its
`group_add` (the render group), its unlimited `memlock` (this machine's
Docker engine may not raise the limit: "error setting rlimit type 8") and its
`build` are dropped from a copy of compose.yaml (no GPU here, the image is
already built) by the CPU try-out's k3rocm.tryout.stack, which also adds the
CPU build's variables and puts in Prometheus and Alertmanager images built
from Debian's packages as scripts/try-cpu builds them where Docker Hub is
unreachable (k3rocm.tryout.monitoring).
Grafana has no image here and is not started (its files have static tests).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from support.docker_images import (
    Load,
    container_state,
    docker,
    http,
    monitoring_images,
    server_logs,
    signal_process,
    vllm_processes,
)
from support.vllm_trees import ON_DEFAULT_LINE, REPO
from support.workers import free_port

from k3rocm.container import api_access
from k3rocm.tryout.cpu import CPU_SETTINGS
from k3rocm.tryout.stack import cpu_stack

pytestmark = pytest.mark.docker
PROJECT = "k3rocmtest"
SECRETS = {
    "api_key": "sk-test-5f1c2e-never-in-an-environment",
    "hf_token": "hf_test_token_never_in_an_environment",
    "grafana": "grafana-test-password-never-in-an-environment",
}
# Values an operator's .env may hold that must not reach the server.
POISON = {"HF_TOKEN": "hf_poison_from_dotenv", "GRAFANA_ADMIN_PASSWORD": "poison-pw"}
# The watchdog's stall time here: far above a CPU step of the tiny model,
# short enough to wait for several times.
STALL_SECONDS = 15


def compose(*args: str, files: list[Path], env_file: Path, timeout: float = 600):
    command = ["docker-compose", "--project-name", PROJECT]
    command += ["--project-directory", str(REPO), "--env-file", str(env_file)]
    for file in files:
        command += ["--file", str(file)]
    result = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def secret_file(path: Path, text: str, owner: int = 1000) -> Path:
    path.write_text(text + "\n")
    os.chown(path, owner, owner)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def project(request, image, standin, model, tmp_path_factory):
    """The stack as an operator pinning by digest runs it: K3_IMAGE is the
    pushed REPO:TAG@sha256:... and no local reference to it exists, so the
    engine pulls it from the registry (and checks the digest). The image
    itself stays under the session's tag: the other test worker may be
    running containers of it, so the pull fetches the manifest and finds
    each layer local (test_registry_docker.py proves the registry holds
    them). Another release line's image runs by its local tag: the pull by
    digest is Docker's, the same for every line (and a minute of push and
    pull)."""
    tmp = tmp_path_factory.mktemp("compose")
    if ON_DEFAULT_LINE:
        pushed = request.getfixturevalue("pushed_image")
        pinned = pushed["ref"]
        forget_the_registrys_references(pushed)
    else:
        pinned = image
    stack = cpu_stack(
        yaml.safe_load((REPO / "compose.yaml").read_text()), monitoring_images()
    )
    derived = tmp / "compose.yaml"
    derived.write_text(yaml.safe_dump(stack))
    api_port, prometheus_port = free_port(), free_port()
    settings = dict(CPU_SETTINGS)
    settings |= {
        "K3_IMAGE": pinned,
        "K3_MODELS_DIR": str(model),
        "K3_MODEL": "/models",
        "K3_API_PORT": str(api_port),
        "PROMETHEUS_PORT": str(prometheus_port),
        "K3_STOP_GRACE_SECONDS": "60",
        "K3_STALL_SECONDS": str(STALL_SECONDS),
        "K3_API_KEY_SECRET": str(secret_file(tmp / "api-key", SECRETS["api_key"])),
        "K3_API_KEY_FILE": "/run/secrets/k3_api_key",
        "HF_TOKEN_SECRET": str(secret_file(tmp / "hf-token", SECRETS["hf_token"])),
        "GRAFANA_ADMIN_PASSWORD_SECRET": str(
            secret_file(tmp / "grafana", SECRETS["grafana"], owner=472)
        ),
        **POISON,
    }
    env_file = tmp / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    files = [derived]
    try:
        compose(
            "up", "--detach", "kimi-k3", "prometheus", files=files, env_file=env_file
        )
        yield {
            "api": f"http://127.0.0.1:{api_port}",
            "prometheus": f"http://127.0.0.1:{prometheus_port}",
            "containers": compose("ps", "-q", files=files, env_file=env_file).split(),
            "server": compose(
                "ps", "-q", "kimi-k3", files=files, env_file=env_file
            ).strip(),
            "pinned": pinned,
            "files": files,
            "env_file": env_file,
        }
    finally:
        subprocess.run(
            [
                "docker-compose",
                "--project-name",
                PROJECT,
                "--project-directory",
                str(REPO),
                "--env-file",
                str(env_file),
                "--file",
                str(derived),
                "down",
                "--volumes",
                "--remove-orphans",
                "--timeout",
                "70",
            ],
            capture_output=True,
            timeout=300,
        )


def forget_the_registrys_references(pushed: dict) -> None:
    """Remove the pushed tag (and with it the digest Docker recorded for it)
    but not the image, which the session's tag keeps: compose must pull the
    pinned reference."""
    docker("rmi", f"{pushed['repo']}:{pushed['tag']}")
    assert docker("image", "inspect", pushed["ref"], check=False).returncode != 0


def wait_for(what: str, condition, timeout: float, diagnose=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s\n{diagnose()}")
        time.sleep(2)


def health(container: str) -> str:
    state = json.loads(docker("inspect", container).stdout)[0]["State"]
    assert state["Running"], docker("logs", container, check=False).stderr[-4000:]
    return state.get("Health", {}).get("Status", "none")


@pytest.mark.every_line
def test_the_server_comes_up_healthy_with_its_api_key(project):
    server = project["server"]
    wait_for(
        "healthy server",
        lambda: health(server) == "healthy",
        480,
        lambda: docker("logs", server, check=False).stderr[-4000:],
    )
    # The pinned reference, pulled from the registry, is what runs.
    assert container_state(server)["Config"]["Image"] == project["pinned"]
    body = {"model": "kimi-k3", "prompt": "a b", "max_tokens": 4}
    assert http(f"{project['api']}/v1/completions", body)[0] == 401
    key = {"Authorization": f"Bearer {SECRETS['api_key']}"}
    status, answer = http(f"{project['api']}/v1/completions", body, headers=key)
    assert status == 200, answer


@pytest.mark.every_line
def test_the_live_server_walks_like_its_route_table(project):
    """Every route of the installed vLLM's route table (each line's image
    runs its own release), asked of the running server (the image's
    launcher, its API key set): 401 without the key and with a wrong one
    but on /health and /metrics; with the key the admin routes answer 404
    (K3_API_ADMIN_ROUTES is off). POST /invocations with a completion body
    and no key, which vLLM answers with generated text, is 401."""
    from support.vllm_routes import plain_app, routes

    server = project["server"]
    wait_for("healthy server", lambda: health(server) == "healthy", 480)
    api = project["api"]
    key = {"Authorization": f"Bearer {SECRETS['api_key']}"}
    wrong = {"Authorization": "Bearer sk-wrong"}
    for method, path, concrete in routes(plain_app()):
        body = {} if method == "POST" else None
        where = f"{method} {path}"
        if path in api_access.OPEN_PATHS:
            assert http(f"{api}{concrete}", body)[0] == 200, where
            continue
        assert http(f"{api}{concrete}", body)[0] == 401, where
        assert http(f"{api}{concrete}", body, headers=wrong)[0] == 401, where
        if path in api_access.ADMIN_PATHS:
            assert http(f"{api}{concrete}", body, headers=key)[0] == 404, where
    completion = {"model": "kimi-k3", "prompt": "a b", "max_tokens": 4}
    assert http(f"{api}/invocations", completion)[0] == 401


@pytest.mark.every_line
def test_the_probes_stay_out_of_the_access_log(project):
    """The health check, Prometheus and the watchdog ask /health and /metrics
    every few seconds; vLLM's access log keeps the API's requests only."""
    server = project["server"]
    wait_for("healthy server", lambda: health(server) == "healthy", 480)
    body = {"model": "kimi-k3", "prompt": "a b", "max_tokens": 2}
    key = {"Authorization": f"Bearer {SECRETS['api_key']}"}
    assert http(f"{project['api']}/v1/completions", body, headers=key)[0] == 200
    logs = docker("logs", server, check=False)
    text = logs.stdout + logs.stderr
    assert '"POST /v1/completions HTTP/1.1" 200' in text, text[-3000:]
    assert '"GET /metrics HTTP/1.1"' not in text
    assert '"GET /health HTTP/1.1"' not in text


@pytest.mark.every_line
def test_prometheus_scrapes_the_server_and_loaded_the_rules(project):
    prometheus = project["prometheus"]

    def target_up() -> bool:
        try:
            _, text = http(f"{prometheus}/api/v1/targets", timeout=5)
        except OSError:
            return False
        targets = json.loads(text)["data"]["activeTargets"]
        up = {t["labels"]["job"] for t in targets if t["health"] == "up"}
        return up == {"kimi-k3-vllm", "kimi-k3-container"}

    wait_for("both targets scraped", target_up, 240)
    phase = f"{prometheus}/api/v1/query?query=k3rocm_container_phase%3D%3D1"

    def current_phase() -> dict:
        [current] = json.loads(http(phase)[1])["data"]["result"]
        return current["metric"]

    # The scrape before the ready mark may still say stage2: one interval.
    wait_for(
        "the serving phase scraped", lambda: current_phase()["phase"] == "serving", 60
    )
    assert current_phase()["instance"] == "kimi-k3:8000"
    query = f"{prometheus}/api/v1/query?query=k3rocm_build_info"
    wait_for(
        "k3rocm_ series",
        lambda: json.loads(http(query, timeout=5)[1])["data"]["result"] != [],
        120,
    )
    # Alerts have somewhere to go: the compose service Alertmanager.
    managers = json.loads(http(f"{prometheus}/api/v1/alertmanagers")[1])["data"]
    assert [m["url"] for m in managers["activeAlertmanagers"]] == [
        "http://alertmanager:9093/api/v2/alerts"
    ]
    rules = json.loads(http(f"{prometheus}/api/v1/rules")[1])["data"]["groups"]
    names = {rule["name"] for group in rules for rule in group["rules"]}
    assert {"KimiK3ServerDown", "KimiK3LoadSlow", "SmokeTestFailed"} <= names


@pytest.mark.every_line
def test_no_secret_reaches_any_environment(project):
    for container in project["containers"]:
        described = docker("inspect", container).stdout
        for value in (*SECRETS.values(), *POISON.values()):
            assert value not in described, container
    environment = docker("exec", project["server"], "env").stdout
    for name in (*POISON, "GRAFANA_ADMIN_PASSWORD_SECRET", "K3_API_KEY_SECRET"):
        assert f"{name}=" not in environment, name
    for value in SECRETS.values():
        assert value not in environment


@pytest.mark.every_line
def test_compiled_triton_kernels_land_in_the_cache_volume(project):
    """A Triton kernel compiled in the server container (for a GPU target,
    which needs no GPU) lands in the k3-cache volume, so a recreated
    container does not compile it again."""
    script = (
        "import triton, triton.language as tl\n"
        "from triton.backends.compiler import GPUTarget\n"
        "@triton.jit\n"
        "def copy(x, y, BLOCK: tl.constexpr):\n"
        "    i = tl.arange(0, BLOCK)\n"
        "    tl.store(y + i, tl.load(x + i))\n"
        "source = triton.compiler.ASTSource(fn=copy, signature={'x': '*fp32', "
        "'y': '*fp32', 'BLOCK': 'constexpr'}, constexprs={'BLOCK': 32})\n"
        "print(triton.compile(source, target=GPUTarget('cuda', 80, 32)).hash)\n"
    )
    # @triton.jit reads its function's source: the script must be a file.
    result = docker(
        "exec",
        "--interactive",
        "--env",
        "TRITON_INTERPRET=0",
        project["server"],
        "sh",
        "-c",
        "cat > /tmp/compile_probe.py && python3 /tmp/compile_probe.py",
        input=script,
    )
    kernel_hash = result.stdout.strip().splitlines()[-1]
    volume = json.loads(docker("volume", "inspect", f"{PROJECT}_k3-cache").stdout)[0]
    cached = list(Path(volume["Mountpoint"], "triton").rglob("*.json"))
    assert cached, f"nothing under the volume's triton/ after compiling {kernel_hash}"


def test_a_digest_the_registry_lacks_is_refused_with_the_engines_message(project):
    """K3_IMAGE pinned to a digest that does not match: the engine refuses
    the pull; this is the line the operator sees."""
    repo_and_tag = project["pinned"].rsplit("@", 1)[0]
    wrong = f"{repo_and_tag}@sha256:{'0' * 64}"
    env_file = project["env_file"].with_name("wrong-digest.env")
    env_file.write_text(
        project["env_file"].read_text().replace(project["pinned"], wrong)
    )
    command = ["docker-compose", "--project-name", f"{PROJECT}wrong"]
    command += ["--project-directory", str(REPO), "--env-file", str(env_file)]
    for file in project["files"]:
        command += ["--file", str(file)]
    result = subprocess.run(
        [*command, "pull", "kimi-k3"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode != 0
    # The engine names the repository and digest (a digest wins over the tag).
    repository = repo_and_tag.rsplit(":", 1)[0]
    refused = f"manifest for {repository}@sha256:{'0' * 64} not found: manifest unknown"
    assert refused in result.stderr, result.stderr
    print(f"operator sees: {result.stderr.strip().splitlines()[-1]}")


@pytest.mark.every_line
def test_readmes_process_listing_works_in_a_compose_container(project):
    """README's troubleshooting command (`k3rocm ctl status`, the console
    script on the image's PATH), in a shell compose opened: the
    configuration's variables are filled in for supervisorctl."""
    listing = docker(
        "exec", project["server"], "k3rocm", "ctl", "status", check=False
    ).stdout
    for program in ("guard", "status", "vllm", "watchdog"):
        assert re.search(rf"^{program}\s+RUNNING", listing, re.M), listing


# The stall watchdog against a really stopped engine, under compose's restart
# policy. K3_STALL_SECONDS is STALL_SECONDS here (the fixture sets it); every
# test above ran with the watchdog armed too.
def wait_healthy_again(server: str, restarts: int) -> None:
    wait_for(
        f"restart {restarts}",
        lambda: container_state(server)["RestartCount"] >= restarts,
        180,
        lambda: server_logs(server)[-4000:],
    )
    wait_healthy(server)


def wait_healthy(server: str) -> None:
    """Until Docker calls the container healthy; not while it waits to
    restart (its status then is still the last run's)."""

    def healthy() -> bool:
        state = container_state(server)["State"]
        return (
            state["Running"]
            and not state["Restarting"]
            and state.get("Health", {}).get("Status") == "healthy"
        )

    wait_for("a healthy server", healthy, 480, lambda: server_logs(server)[-4000:])


def healthy_server(project) -> str:
    """The server, once Docker calls it healthy: each stall test starts from
    a served container, whatever the test before it left."""
    wait_healthy(project["server"])
    return project["server"]


def test_an_idle_server_is_not_stalled(project):
    server = healthy_server(project)
    restarts = container_state(server)["RestartCount"]
    # Twice the stall time: a false stall would have been called by half-way.
    time.sleep(2 * STALL_SECONDS)
    assert health(server) == "healthy"
    assert container_state(server)["RestartCount"] == restarts
    assert "the engine stalled" not in server_logs(server)


def test_a_slow_but_progressing_engine_is_not_stalled(project):
    """The engine core stopped for 0.6 x K3_STALL_SECONDS at a time, three
    times, let run for 2 s after each, under four streams: every gap is
    slower than any real step and shorter than the stall time, and the gaps
    together are longer than it."""
    server = healthy_server(project)
    engine = vllm_processes(server)["VLLM::EngineCor"]
    load = Load(project["api"], 4, SECRETS["api_key"])
    pending_at_stops = []
    for _ in range(3):
        signal_process(server, engine, "STOP")
        # Requests the server holds: the four equal streams end together, so
        # at a stop the next four may have no token back yet.
        pending_at_stops.append(load.in_flight())
        time.sleep(0.6 * STALL_SECONDS)
        signal_process(server, engine, "CONT")
        time.sleep(2)
    # Work was pending through every gap, or the test proves nothing.
    assert all(pending_at_stops), pending_at_stops
    streams = load.stop()
    assert [(s.done, s.errors) for s in streams] == [(True, [])] * len(streams)
    assert "the engine stalled" not in server_logs(server)
    assert health(server) == "healthy"


@pytest.mark.parametrize("stopped", ["VLLM::EngineCor", "VLLM::Worker"])
def test_a_stopped_engine_process_is_caught_dumped_and_restarted(project, stopped):
    """SIGSTOP to the engine core (or its worker) with four streams in flight:
    within K3_STALL_SECONDS and a few looks the health check says stalled,
    every vLLM process's stacks are in the log and on the cache volume, the
    container exits 5 and compose starts it again, healthy."""
    server = healthy_server(project)
    restarts = container_state(server)["RestartCount"]
    processes = vllm_processes(server)
    [pid] = [pid for name, pid in processes.items() if name.startswith(stopped)]
    # The health check, run over and over inside the container from before
    # the stop until the container exits (one exec: no start-up per look).
    health_loop = subprocess.Popen(
        ["docker", "exec", server, "sh", "-c",
         "while :; do python3 -m k3rocm.container.health; sleep 0.1; done"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    # Streams one after another (a fast machine ends one in seconds).
    load = Load(project["api"], 4, SECRETS["api_key"])
    # What Docker makes of the stall (README: never unhealthy while it runs).
    docker_health = DockerHealthWatch(server)
    # The log holds every earlier run of this container: this stall's lines
    # are the ones logged from the stop on.
    started, stopped_at = time.monotonic(), time.time()
    signal_process(server, pid, "STOP")
    assert load.in_flight() > 0, "no stream under way at the stop"
    wait_for(
        "the stop for a stall",
        lambda: (
            "container stopped: the engine stalled"
            in server_logs(server, since=stopped_at)
        ),
        STALL_SECONDS + 120,
        lambda: server_logs(server)[-4000:],
    )
    stopped_after = time.monotonic() - started
    assert not docker_health.stop(), (
        f"Docker's checks judged the running container unhealthy: "
        f"{docker_health.story}\n{timestamped_logs(server, stopped_at)}"
    )
    # The streams the stall held end, cut off (no [DONE]), not hung for ever.
    cut_off = [s for s in load.stop(60) if not s.done]
    assert len(cut_off) == 4, [(s.events, s.done, s.errors) for s in load.finished]
    health_lines = [
        line
        for line in health_loop.communicate(timeout=120)[0].splitlines()
        if "stalled" in line
    ]
    run = server_logs(server, since=stopped_at)
    assert run.count("capturing the stacks of") == 1, run[-4000:]
    # Caught within the stall time plus the watchdog's looks and the capture.
    assert stopped_after < STALL_SECONDS + 60, stopped_after
    assert health_lines and health_lines[0].startswith(
        "unhealthy: the engine stalled since "
    ), health_lines
    blocks = re.findall(
        r"===== k3rocm stacks pid (\d+) (\S+) \(([^)]*)\) =====\n(.*?)\n"
        r"===== end of k3rocm stacks pid \1 =====",
        run,
        re.S,
    )
    by_role = {role: body for _, _, role, body in blocks}
    assert {"vLLM main process", "engine core", "worker"} <= set(by_role), run[:3000]
    # A frame of vLLM's engine loop, not just a header.
    assert "run_busy_loop" in by_role["engine core"], by_role["engine core"]
    assert "(exit 5)" in run
    reason = re.search(r"container stopped: (.*) \(exit 5\)", run).group(1)
    assert "the engine stalled: no engine step for" in reason
    assert "request(s)" in reason
    wait_healthy_again(server, restarts + 1)
    kept = docker(
        "exec", server, "sh", "-c", "cat /home/k3/.cache/k3rocm/forensics/stacks-*"
    ).stdout
    assert f"{stopped}" in kept and "run_busy_loop" in kept
    record_stall_timings(server, stopped, stopped_at, time.time())


class DockerHealthWatch(threading.Thread):
    """Docker's view of a container, read every half second: its state, its
    health status and each check Docker ran meanwhile (times, exit code and
    line: what a failure shows). Docker also writes ``unhealthy`` when a
    container exits (every container whose health monitor stops: moby #36233),
    so only an ``unhealthy`` seen while it still runs is the checks' verdict."""

    def __init__(self, container: str):
        super().__init__(daemon=True)
        self.container, self.seen, self.done = container, [], threading.Event()
        self.checks: dict[str, tuple] = {}
        self.start()

    def run(self) -> None:
        while not self.done.is_set():
            state = container_state(self.container)["State"]
            health = state.get("Health", {})
            self.seen.append((state["Status"], health.get("Status")))
            for check in health.get("Log") or []:
                self.checks[check["Start"]] = (
                    check["Start"][11:23],
                    check["End"][11:23],
                    check["ExitCode"],
                    check["Output"].strip()[-200:],
                )
            time.sleep(0.5)

    @property
    def story(self) -> str:
        seen = [
            f"{state}/{health} x{len(list(looks))}"
            for (state, health), looks in itertools.groupby(self.seen)
        ]
        checks = "\n".join(map(str, sorted(self.checks.values())))
        return f"{seen}; checks:\n{checks}"

    def stop(self) -> list[tuple[str, str]]:
        """Each look that found the container running and unhealthy."""
        self.done.set()
        self.join(30)
        return [look for look in self.seen if look == ("running", "unhealthy")]


def timestamped_logs(server: str, since: float) -> str:
    """The log from unix time ``since`` on, each line with Docker's time,
    less vLLM's access lines (the health loop's thousands)."""
    lines = docker("logs", "--timestamps", "--since", f"{since:.3f}", server)
    text = lines.stdout + lines.stderr
    kept = [line[11:23] + line[30:] for line in text.splitlines()]
    kept = [line for line in kept if "GET /" not in line]
    return "\n".join(kept)[-6000:]


def record_stall_timings(
    server: str, stopped: str, stopped_at: float, healthy_at: float
):
    """Seconds from the SIGSTOP to each step the log shows, by Docker's
    timestamps of the lines (docs/stall-recovery.md reports one run); printed,
    and appended as JSON to $K3_STALL_TIMINGS when set."""
    lines = docker("logs", "--timestamps", server, check=False)
    text = lines.stdout + lines.stderr
    marks = {
        "stall_logged": "k3rocm.container.watchdog: the engine stalled: no engine step",
        "stacks_kept": "k3rocm.container.watchdog: stacks kept in",
        "exited_5": "(exit 5)",
    }
    timings = {"stopped": stopped}
    for name, phrase in marks.items():
        line = [line for line in text.splitlines() if phrase in line][-1]
        stamp = datetime.fromisoformat(line.split(" ", 1)[0][:26] + "+00:00")
        timings[name] = round(stamp.timestamp() - stopped_at, 1)
    timings["healthy_again"] = round(healthy_at - stopped_at, 1)
    print(f"STALL-TIMINGS {json.dumps(timings)}")
    if os.environ.get("K3_STALL_TIMINGS"):
        with open(os.environ["K3_STALL_TIMINGS"], "a") as out:
            out.write(json.dumps({**timings, "stall_seconds": STALL_SECONDS}) + "\n")


def test_a_killed_engine_core_is_still_a_counted_restart(project):
    """SIGKILL is no stall: the API server exits, the guard counts a death and
    vLLM starts again inside the same container."""
    server = healthy_server(project)
    restarts = container_state(server)["RestartCount"]
    counted = "vLLM exited unasked; restart 1 of 3"
    before = server_logs(server).count(counted)
    engine = vllm_processes(server)["VLLM::EngineCor"]
    signal_process(server, engine, "KILL")
    wait_for(
        "a counted restart",
        lambda: server_logs(server).count(counted) > before,
        120,
        lambda: server_logs(server)[-4000:],
    )
    wait_for("vLLM answering again", lambda: _health_status(project["api"]) == 200, 300)
    after_kill = server_logs(server).rsplit(counted, 1)[1]
    # Why the container ended, if it did: its own lines (the guard's stop
    # reason, the watchdog, supervisord), not vLLM's.
    own = [
        line
        for line in after_kill.splitlines()
        if line.startswith(("k3rocm.", "serve-kimi-k3")) or " INFO " in line[:40]
    ]
    assert container_state(server)["RestartCount"] == restarts, "\n".join(own[-40:])
    assert "the engine stalled" not in after_kill


def _health_status(api: str) -> int | None:
    try:
        return http(f"{api}/health", timeout=5)[0]
    except OSError:
        return None
