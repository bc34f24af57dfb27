"""scripts/try-cpu: kimi-k3-rocm's compose stack on a machine without a GPU,
in one command.

    scripts/try-cpu [--api-port N] [--prometheus-port N] ...   bring it up
    scripts/try-cpu --down                                      stop it

It checks that Docker's engine answers and Compose is there, then builds
the stand-in for the ROCm base (scripts/standin-base) and the image on it
(scripts/build-image, as operators build), makes the tiny model the tests
use, derives the CPU stack from compose.yaml (k3rocm.tryout.stack, run
inside the image), brings up the server, Prometheus and Alertmanager with
Compose, waits for the server's health check (smoke test passed), sends one
completion and prints where everything answers and the command that stops
it. Needs, as root, Docker with Compose (`docker compose` or
`docker-compose`), Python 3.11 with pip and `debootstrap`
(scripts/standin-base builds the base from Debian's packages and wheels
fetched on the host), with PyPI and Debian reachable; YAML is read inside
the image. The API has no key here and listens on 127.0.0.1 only.
Prometheus and Alertmanager run compose.yaml's pinned images where this
host has them or can pull them, else images built from Debian's packages
(k3rocm.tryout.monitoring; --monitoring-from picks, --no-monitoring leaves
them out); it prints Prometheus' targets page and a query of the
step-latency metric once that answers with data.

--down stops the try-out of --project and --state-dir and exits 0; with no
container under that project it says "nothing was running under project
NAME" and exits 0, or 1 when a try-out runs under another project (it names
the command that stops that one).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from k3rocm.common.line_log import line_logger
from k3rocm.common.setting_table import MODEL, STOP_GRACE_SECONDS
from k3rocm.patchtool.lines import shipped_series
from k3rocm.supply_chain.image import image_tag
from k3rocm.tryout.cpu import CPU_SETTINGS, SERVER, SERVICES
from k3rocm.tryout.monitoring import (
    MonitoringError,
    settle_monitoring,
    step_query,
    wait_ready,
)
from k3rocm.tryout.options import DEFAULT_PROJECT, DEFAULT_STATE_DIR, parser

REPO = Path(__file__).resolve().parents[3]
IMAGE_REPO = "kimi-k3-rocm-cpu"
PROMPT = "The stall-free prefill path"
# Compose labels every container it starts with these (v1 and v2 alike).
PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
CONFIG_FILES_LABEL = "com.docker.compose.project.config_files"


def engine_fix() -> str:
    """The next step where no engine answers: the repository's own starter,
    and Debian's packages first where dockerd is missing."""
    start = "as root, scripts/docker-engine start starts one"
    if shutil.which("dockerd") is None:
        return (
            "dockerd is not installed: apt-get install docker.io iptables, then "
            + start
        )
    return start


class TryError(Exception):
    """What stopped the try-out, in one line."""


log = line_logger("try-cpu")


def run(command: list[str], stdin: str | None = None, timeout: float = 3600) -> str:
    try:
        done = subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise TryError(f"{shlex.join(command[:3])} ... could not run: {err}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-15:]
        raise TryError(
            f"{shlex.join(command[:3])} ... failed (exit {done.returncode}):\n"
            + "\n".join(tail)
        )
    return done.stdout


def compose_program() -> list[str]:
    """Compose v2 (the docker plugin) where it exists, else docker-compose;
    and Docker's engine must answer. Checked before anything is built."""
    if shutil.which("docker") is None:
        raise TryError("docker is not installed (the try-out needs Docker)")
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True)
    if plugin.returncode == 0:
        program = ["docker", "compose"]
    elif shutil.which("docker-compose"):
        program = ["docker-compose"]
    else:
        raise TryError(
            "Compose is missing: install the docker compose plugin (or docker-compose)"
        )
    info = subprocess.run(["docker", "info"], capture_output=True, text=True)
    if info.returncode != 0:
        why = (info.stderr.strip().splitlines() or ["no answer"])[-1]
        raise TryError(
            f"Docker's engine does not answer (docker info: {why}); {engine_fix()}"
        )
    return program


def compose_command(program: list[str], state: Path, project: str) -> list[str]:
    return [
        *program,
        *("--project-name", project, "--project-directory", str(REPO)),
        *("--env-file", str(state / ".env"), "--file", str(state / "compose.json")),
    ]


def stop_command(state: Path, project: str) -> str:
    """The --down command for a try-out, naming what differs from the defaults."""
    words = ["scripts/try-cpu", "--down"]
    if state != DEFAULT_STATE_DIR:
        words += ["--state-dir", str(state)]
    if project != DEFAULT_PROJECT:
        words += ["--project", project]
    return shlex.join(words)


def build_image() -> str:
    log("building the stand-in base (~7 min the first time, then reused) ...")
    standin = REPO / "scripts" / "standin-base"
    base = run([sys.executable, str(standin), "build"]).strip().splitlines()[-1]
    log(f"building the image on {base} ...")
    builder = REPO / "scripts" / "build-image"
    run([sys.executable, str(builder), "--base-image", base, "--repo", IMAGE_REPO])
    return f"{IMAGE_REPO}:{image_tag(shipped_series())}"


def in_image(image: str, *args: str, stdin: str | None = None, mounts=()) -> str:
    """A Python module of the image, run without network, as this user."""
    volumes = [arg for mount in mounts for arg in ("--volume", mount)]
    return run(
        [
            *("docker", "run", "--rm", "--interactive", "--network", "none"),
            *("--user", f"{os.getuid()}:{os.getgid()}", *volumes),
            *("--entrypoint", "python3", image, "-m", *args),
        ],
        stdin=stdin,
        timeout=600,
    )


def prepare(state: Path, image: str, args: argparse.Namespace) -> None:
    """The tiny model, the CPU stack and its settings under state."""
    model = state / "model"
    if not (model / "config.json").is_file():
        log("making the tiny model ...")
        model.mkdir(parents=True, exist_ok=True)
        in_image(image, "k3rocm.tryout.tiny_model", "/out", mounts=[f"{model}:/out"])
    images = [
        f"--image={service}={ref}"
        for service, ref in (
            ("prometheus", args.prometheus_image),
            ("alertmanager", args.alertmanager_image),
        )
        if ref
    ]
    compose_yaml = (REPO / "compose.yaml").read_text()
    stack = in_image(image, "k3rocm.tryout.stack", *images, stdin=compose_yaml)
    (state / "compose.json").write_text(stack)
    settings = {
        **CPU_SETTINGS,
        "K3_IMAGE": image,
        "K3_MODELS_DIR": str(model),
        MODEL.env: "/models",
        "K3_API_PORT": str(args.api_port),
        "PROMETHEUS_PORT": str(args.prometheus_port),
        "ALERTMANAGER_PORT": str(args.alertmanager_port),
        STOP_GRACE_SECONDS.env: "60",
        # Grafana is not started; its secret must still name a file.
        "GRAFANA_ADMIN_PASSWORD_SECRET": str(REPO / "secrets" / "empty"),
    }
    (state / ".env").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))


def wait_healthy(compose: list[str], timeout: float) -> None:
    container = run([*compose, "ps", "-q", SERVER]).strip()
    if not container:
        raise TryError("Compose started no server container")
    log("waiting for the server's health check (smoke test, then serving) ...")
    deadline, shown = time.monotonic() + timeout, None
    while True:
        state = json.loads(run(["docker", "inspect", container]))[0]["State"]
        health = state.get("Health", {}).get("Status")
        if health != shown:
            log(f"server: {health or state['Status']}")
            shown = health
        if health == "healthy":
            return
        if not state["Running"] or time.monotonic() > deadline:
            logs = subprocess.run(
                ["docker", "logs", "--tail", "30", container],
                capture_output=True,
                text=True,
            )
            why = "exited" if not state["Running"] else f"not healthy in {timeout} s"
            raise TryError(
                f"the server {why}; its last lines:\n{logs.stdout}{logs.stderr}"
            )
        time.sleep(3)


def complete(api: str) -> str:
    body = {"model": "kimi-k3", "prompt": PROMPT, "max_tokens": 12}
    request = urllib.request.Request(
        f"{api}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)["choices"][0]["text"]
    except (OSError, urllib.error.URLError, ValueError, KeyError) as err:
        raise TryError(f"the completion failed: {err}") from None


def up(args: argparse.Namespace) -> None:
    state = args.state_dir
    program = compose_program()
    state.mkdir(parents=True, exist_ok=True)
    image = build_image()
    prepare(state, image, args)
    services = (SERVER,) if args.no_monitoring else SERVICES
    ports = {"prometheus": args.prometheus_port, "alertmanager": args.alertmanager_port}
    monitoring = {
        service: f"http://127.0.0.1:{ports[service]}"
        for service in services
        if service != SERVER
    }
    settle_monitoring(state, tuple(monitoring), args, log)
    compose = compose_command(program, state, args.project)
    log(f"starting {', '.join(services)} ...")
    run([*compose, "up", "--detach", *services])
    wait_healthy(compose, args.timeout)
    for service, url in monitoring.items():
        wait_ready(compose, service, url, 120)
    api = f"http://127.0.0.1:{args.api_port}"
    text = complete(api)
    print(f"completion of {PROMPT!r}: {text!r}")
    print(f"API:          {api}/v1 (model kimi-k3, no key)")
    print(f"metrics:      {api}/metrics")
    for service, url in monitoring.items():
        print(f"{service.title() + ':':<14}{url}")
    if "prometheus" in monitoring:
        query = step_query(monitoring["prometheus"])
        print(f"targets:      {monitoring['prometheus']}/targets")
        print(f"step query:   {query}")
    print(f"stop it:      {stop_command(state, args.project)}")


def running_tryouts() -> dict[str, Path]:
    """Every try-out with a container, by project: its state directory. A
    try-out is told by its server's compose file, the state directory's
    compose.json (its image's name is no sign: a rebuild moves the tag)."""
    fields = (PROJECT_LABEL, SERVICE_LABEL, CONFIG_FILES_LABEL)
    listed = run(
        [
            *("docker", "ps", "--all", "--filter", f"label={PROJECT_LABEL}"),
            *("--format", "\t".join(f'{{{{.Label "{name}"}}}}' for name in fields)),
        ],
        timeout=60,
    )
    found = {}
    for line in listed.splitlines():
        project, service, config = line.split("\t")
        if service == SERVER and config.endswith("/compose.json"):
            found[project] = Path(config).parent
    return found


def down(args: argparse.Namespace) -> int:
    state, project = args.state_dir, args.project
    program = compose_program()
    tryouts = running_tryouts()
    stopped = project in tryouts
    if (state / "compose.json").is_file():
        compose = compose_command(program, state, project)
        # Also when nothing runs: it removes the network and volumes left.
        run([*compose, "down", "--volumes", "--remove-orphans", "--timeout", "70"])
    elif stopped:
        raise TryError(
            f"project {project} runs but {state} holds no try-out: "
            f"{stop_command(tryouts[project], project)}"
        )
    if stopped:
        log(f"stopped the try-out of project {project}")
        return 0
    others = {name: where for name, where in tryouts.items() if name != project}
    log(f"nothing was running under project {project}")
    for name, where in others.items():
        log(f"a try-out runs under project {name}: {stop_command(where, name)}")
    return 1 if others else 0


def main(argv: list[str]) -> int:
    args = parser(__doc__).parse_args(argv)
    # Compose records the compose file's path as given, and the printed stop
    # command must work from any directory.
    args.state_dir = args.state_dir.resolve()
    try:
        if args.down:
            return down(args)
        up(args)
    except (TryError, MonitoringError) as err:
        log(str(err))
        return 1
    except KeyboardInterrupt:
        log(
            f"interrupted; {stop_command(args.state_dir, args.project)} stops what "
            "was started"
        )
        return 130
    return 0
