"""scripts/try-cpu: kimi-k3-rocm's compose stack on a machine without a GPU,
in one command.

    scripts/try-cpu [--api-port N] [--prometheus-port N] ...   bring it up
    scripts/try-cpu --down                                      stop it

It builds the stand-in for the ROCm base (scripts/standin-base) and the image
on it (scripts/build-image, as operators build), makes the tiny model the
tests use, derives the CPU stack from compose.yaml (k3rocm.tryout.stack, run
inside the image), brings up the server, Prometheus and Alertmanager with
Compose, waits for the server's health check (smoke test passed), sends one
completion and prints where everything answers. Needs, as root, Docker with
Compose (`docker compose` or `docker-compose`), Python 3.11 with pip and
`debootstrap` (scripts/standin-base builds the base from Debian's packages
and wheels fetched on the host), with PyPI and Debian reachable; YAML is
read inside the image. The API has no key here and listens on 127.0.0.1
only.
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

from k3rocm.series import shipped_series
from k3rocm.setting_table import MODEL, STOP_GRACE_SECONDS
from k3rocm.supply_chain.image import image_tag
from k3rocm.tryout.cpu import CPU_SETTINGS, SERVER, SERVICES

REPO = Path(__file__).resolve().parents[3]
IMAGE_REPO = "kimi-k3-rocm-cpu"
PROMPT = "The stall-free prefill path"


class TryError(Exception):
    """What stopped the try-out, in one line."""


def log(message: str) -> None:
    print(f"try-cpu: {message}", file=sys.stderr, flush=True)


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


def compose_command(state: Path, project: str) -> list[str]:
    """Compose v2 (the docker plugin) where it exists, else docker-compose."""
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True)
    if plugin.returncode == 0:
        command = ["docker", "compose"]
    elif shutil.which("docker-compose"):
        command = ["docker-compose"]
    else:
        raise TryError("Compose is missing: install the docker compose plugin")
    return [
        *command,
        *("--project-name", project, "--project-directory", str(REPO)),
        *("--env-file", str(state / ".env"), "--file", str(state / "compose.json")),
    ]


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


def wait_ready(compose: list[str], service: str, url: str, timeout: float) -> None:
    """A monitoring server's readiness endpoint answers 200."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            logs = subprocess.run(
                [*compose, "logs", "--tail", "20", service],
                capture_output=True,
                text=True,
            )
            raise TryError(
                f"{service} is not ready at {url} after {timeout:.0f} s; its last "
                f"lines:\n{logs.stdout}{logs.stderr}"
            )
        time.sleep(2)


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
    state.mkdir(parents=True, exist_ok=True)
    image = build_image()
    prepare(state, image, args)
    compose = compose_command(state, args.project)
    log(f"starting {', '.join(SERVICES)} ...")
    run([*compose, "up", "--detach", *SERVICES])
    wait_healthy(compose, args.timeout)
    monitoring = {
        "prometheus": f"http://127.0.0.1:{args.prometheus_port}",
        "alertmanager": f"http://127.0.0.1:{args.alertmanager_port}",
    }
    for service, url in monitoring.items():
        wait_ready(compose, service, url, 120)
    api = f"http://127.0.0.1:{args.api_port}"
    text = complete(api)
    print(f"completion of {PROMPT!r}: {text!r}")
    print(f"API:          {api}/v1 (model kimi-k3, no key)")
    print(f"metrics:      {api}/metrics")
    print(f"Prometheus:   {monitoring['prometheus']}")
    print(f"Alertmanager: {monitoring['alertmanager']}")
    print(f"stop it:      scripts/try-cpu --down --state-dir {shlex.quote(str(state))}")


def down(args: argparse.Namespace) -> None:
    state = args.state_dir
    if not (state / "compose.json").is_file():
        log(f"nothing to stop: no try-out in {state}")
        return
    compose = compose_command(state, args.project)
    run([*compose, "down", "--volumes", "--remove-orphans", "--timeout", "70"])
    log("stopped")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scripts/try-cpu",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--down", action="store_true", help="stop the try-out")
    p.add_argument(
        "--state-dir",
        type=Path,
        default=REPO / ".cache" / "try-cpu",
        help="where the model, the stack and its settings are kept",
    )
    p.add_argument("--project", default="k3rocm-try", help="Compose project name")
    p.add_argument("--api-port", type=int, default=8000)
    p.add_argument("--prometheus-port", type=int, default=9090)
    p.add_argument("--alertmanager-port", type=int, default=9093)
    p.add_argument("--prometheus-image", help="instead of compose.yaml's pinned one")
    p.add_argument("--alertmanager-image", help="instead of compose.yaml's pinned one")
    p.add_argument(
        "--timeout",
        type=float,
        default=1200,
        help="seconds the server may take to become healthy",
    )
    return p  # fmt: skip


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        down(args) if args.down else up(args)
    except TryError as err:
        log(str(err))
        return 1
    except KeyboardInterrupt:
        log("interrupted; scripts/try-cpu --down stops what was started")
        return 130
    return 0
