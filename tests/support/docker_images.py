"""The images and containers of the container tests, on the Docker engine
that ./scripts/test starts (scripts/docker-engine).

No registry is reachable here, so everything is built locally: the stand-in
for the vLLM ROCm base (scripts/standin-base; how it differs is listed there
and in docs/testing.md), then the real image on top of it by scripts/build-image, the
path operators use.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path

import pytest

from k3rocm.tryout.cpu import CPU_SERVER_ENV, CPU_SETTINGS
from k3rocm.tryout.monitoring import DEBIAN_SERVERS, debian_image
from support.vllm_trees import REPO, SERIES
from support.workers import free_port, worker_lock

TEST_REPO = "k3rocm-test"
STANDIN_SCRIPT = REPO / "scripts" / "standin-base"
IN_CONTAINER_MODEL = "/models/tiny"
# Builds share caches (.cache/standin, docker/wheelhouse) and tags: one at a
# time across the test workers; the second finds Docker's cache warm.
ONE_BUILD_AT_A_TIME = "docker-build"


def docker(*args: str, timeout: float = 600, check: bool = True, **kwargs):
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, **kwargs
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"docker {' '.join(args[:3])} ... failed ({result.returncode}):\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def require_engine() -> None:
    """Fail, never skip: on a machine where the engine can be installed, a
    skipped container test would prove nothing (deselect with -m 'not docker')."""
    if shutil.which("docker") is None or (
        subprocess.run(["docker", "info"], capture_output=True).returncode != 0
    ):
        pytest.fail(
            "no Docker engine answers: run ./scripts/test (it installs and starts "
            "one) or scripts/docker-engine start; deselect with -m 'not docker'"
        )


@worker_lock(ONE_BUILD_AT_A_TIME)
def build_standin(variant: str = "plain") -> str:
    """The stand-in base of the installed vLLM's line (each line's tests
    build that line's image)."""
    line = ("--line", SERIES.vllm_version)
    result = subprocess.run(
        [sys.executable, str(STANDIN_SCRIPT), "build", "--variant", variant, *line],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout.strip().splitlines()[-1]


@worker_lock(ONE_BUILD_AT_A_TIME)
def monitoring_images() -> dict[str, str]:
    """Prometheus' and Alertmanager's images as scripts/try-cpu builds them
    where Docker Hub cannot be reached (k3rocm.tryout.monitoring: Debian's
    packages on the stand-in base's Debian), one code path for both."""
    os_image = build_standin("os")
    return {service: debian_image(os_image, service) for service in DEBIAN_SERVERS}


@worker_lock(ONE_BUILD_AT_A_TIME)
def build_image(base: str) -> str:
    """The image, by scripts/build-image (wheelhouse, then `docker build`)."""
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "build-image"),
            "--base-image",
            base,
            "--repo",
            TEST_REPO,
            "--line",
            SERIES.vllm_version,
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    tagged = [
        line for line in result.stdout.splitlines() if "Successfully tagged" in line
    ]
    assert tagged, result.stdout[-3000:]
    return tagged[-1].split()[-1]


# The container settings of a cpu-dev server on the tiny model, as the CPU
# try-out sets them (k3rocm.tryout.stack).
CPU_DEV_ENV = {**CPU_SERVER_ENV, **CPU_SETTINGS, "K3_MODEL": IN_CONTAINER_MODEL}


@dataclass
class Container:
    name: str
    port: int
    status_port: int

    def phase(self) -> str | None:
        """The start-up phase on the container's own metrics endpoint."""
        try:
            _, text = http(f"http://127.0.0.1:{self.status_port}/metrics", timeout=3)
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("k3rocm_container_phase{") and line.endswith(" 1.0"):
                return line.split('"')[1]
        return None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def inspect(self) -> dict:
        return container_state(self.name)

    def state(self) -> dict:
        return self.inspect()["State"]

    def health(self) -> str:
        return self.state().get("Health", {}).get("Status", "none")

    def logs(self) -> str:
        return server_logs(self.name)

    def exec(self, *command: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return docker("exec", self.name, *command, timeout=timeout, check=False)

    def read(self, path: str) -> str:
        result = self.exec("cat", path)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def wait_for(self, what: str, condition: Callable[[], bool], timeout: float):
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.name}: no {what} within {timeout:.0f} s; state "
                    f"{self.state()}; log tail:\n{self.logs()[-5000:]}"
                )
            time.sleep(1)

    def wait_healthy(self, timeout: float = 420) -> list[str]:
        """Wait for Docker's healthy; the start-up phases seen meanwhile."""
        phases: list[str] = []

        def healthy() -> bool:
            phase = self.phase()
            if phase and phase not in phases:
                phases.append(phase)
            state = self.state()
            if not state["Running"]:
                raise AssertionError(
                    f"{self.name} exited ({state['ExitCode']}); log tail:\n"
                    f"{self.logs()[-5000:]}"
                )
            return state.get("Health", {}).get("Status") == "healthy"

        self.wait_for("healthy state", healthy, timeout)
        return phases

    def wait_exit(self, timeout: float) -> int:
        self.wait_for("exit", lambda: not self.state()["Running"], timeout)
        return self.state()["ExitCode"]

    def remove(self) -> None:
        docker("rm", "-f", "-v", self.name, check=False)


def run_container(
    image: str,
    model: Path,
    name: str,
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
    stop_timeout: int = 60,
) -> Container:
    port, status_port = free_port(), free_port()
    settings = {
        **CPU_DEV_ENV,
        "K3_STOP_GRACE_SECONDS": str(stop_timeout),
        **(env or {}),
    }
    docker("rm", "-f", name, check=False)
    docker(
        "run",
        "--detach",
        "--name",
        name,
        # vLLM's CPU build needs more than Docker's 64 MB of /dev/shm.
        "--shm-size",
        "1g",
        "--stop-timeout",
        str(stop_timeout),
        "--publish",
        f"127.0.0.1:{port}:8000",
        "--publish",
        f"127.0.0.1:{status_port}:8001",
        "--volume",
        f"{model}:{IN_CONTAINER_MODEL}:ro",
        *(f"--env={key}={value}" for key, value in settings.items()),
        *extra,
        image,
    )
    return Container(name, port, status_port)


@contextlib.contextmanager
def running_container(
    image: str, model: Path, name: str, **kwargs
) -> Iterator[Container]:
    """A container of `run_container`, removed afterwards whatever happened."""
    container = run_container(image, model, name, **kwargs)
    try:
        yield container
    finally:
        container.remove()


def http(
    url: str, body: dict | None = None, timeout: float = 120, headers=None
) -> tuple[int, str]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


# Engine processes and streams in flight, for the stall tests.
STREAM_TOKENS = 480
# The longest stream the tiny model's 512-token context holds after its prompt.
LONGEST_STREAM = 500


def vllm_processes(container: str) -> dict[str, int]:
    """comm -> pid of vLLM's named processes (the image has no ps). comm is
    cut at 15 characters: VLLM::EngineCor, VLLM::Worker_TP..."""
    listing = docker(
        "exec",
        container,
        "sh",
        "-c",
        'for d in /proc/[0-9]*; do echo "${d#/proc/} $(cat $d/comm)"; done',
        check=False,
    ).stdout
    found = {}
    for line in listing.splitlines():
        pid, _, name = line.partition(" ")
        if name.startswith("VLLM::"):
            found[name] = int(pid)
    return found


def signal_process(container: str, pid: int, name: str) -> None:
    docker("exec", container, "sh", "-c", f"kill -{name} {pid}")


def container_state(container: str) -> dict:
    return json.loads(docker("inspect", container).stdout)[0]


def server_logs(container: str, since: float | None = None) -> str:
    """The container's log (every run of it), or only what was logged from
    unix time ``since`` on."""
    window = ("--since", f"{since:.3f}") if since is not None else ()
    result = docker("logs", *window, container, check=False)
    return result.stdout + result.stderr


class Stream(threading.Thread):
    """One streaming completion, read to its end. A slow reader may get
    several tokens in one event, so the count comes from the final usage."""

    def __init__(
        self, base_url: str, api_key: str | None = None, max_tokens: int = STREAM_TOKENS
    ):
        super().__init__(daemon=True)
        self.base_url = base_url
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.max_tokens = max_tokens
        self.events = 0
        self.tokens = 0
        self.done = False
        self.errors: list[str] = []
        self.ended: float | None = None  # time.monotonic() at its end

    def run(self) -> None:
        try:
            self._read()
        finally:
            self.ended = time.monotonic()

    def _read(self) -> None:
        body = {
            "model": "kimi-k3",
            "prompt": "a b c d",
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        request = urllib.request.Request(
            f"{self.base_url}/v1/completions",
            data=json.dumps(body).encode(),
            headers=self.headers,
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                for raw in response:
                    line = raw.decode().strip()
                    if line == "data: [DONE]":
                        self.done = True
                    elif line.startswith("data: "):
                        event = json.loads(line[6:])
                        if "error" in event:
                            self.errors.append(str(event["error"]))
                        elif event.get("usage"):
                            self.tokens = event["usage"]["completion_tokens"]
                        else:
                            self.events += 1
        except (OSError, HTTPException, ValueError) as err:
            # A connection cut mid-stream ends the read with IncompleteRead.
            self.errors.append(repr(err))


class Load:
    """count clients, each sending one long stream after another until
    stopped or until one of its streams is cut off: the engine has work
    pending the whole time, however fast this machine runs it."""

    def __init__(self, base_url: str, count: int, api_key: str | None = None):
        self.base_url, self.api_key = base_url, api_key
        self.stopping = threading.Event()
        self.finished: list[Stream] = []
        self.current: list[Stream | None] = [None] * count
        self.clients = [
            threading.Thread(target=self._client, args=(i,), daemon=True)
            for i in range(count)
        ]
        for client in self.clients:
            client.start()
        deadline = time.monotonic() + 120
        while self.running() < count:
            assert time.monotonic() < deadline, "the load never got under way"
            time.sleep(0.2)

    def _client(self, index: int) -> None:
        while not self.stopping.is_set():
            stream = Stream(self.base_url, self.api_key, LONGEST_STREAM)
            self.current[index] = stream
            stream.start()
            stream.join()
            self.finished.append(stream)
            if not stream.done or stream.errors:
                return  # cut off: the server is gone

    def running(self) -> int:
        """Streams under way now (a few events in, not finished)."""
        return sum(
            1 for s in self.current if s is not None and s.events >= 2 and not s.done
        )

    def in_flight(self) -> int:
        """Streams sent and not yet ended (their request is with the server,
        whether or not tokens came back yet)."""
        return sum(1 for s in self.current if s is not None and s.is_alive())

    def stop(self, timeout: float = 300) -> list[Stream]:
        """Stop starting streams; every stream it ran, once all have ended."""
        self.stopping.set()
        for client in self.clients:
            client.join(timeout)
        assert not any(client.is_alive() for client in self.clients)
        return self.finished
