"""The container's process tree, run for real outside Docker: dumb-init (the
image's PID 1) -> `python -m k3rocm.container.supervise run` -> supervisord with
docker/supervisord.conf -> the smoke test, the guard and vLLM through the
launcher's cpu-dev profile, serving the tiny Llama on the CPU.

What only a container has is replaced by its nearest real thing here: the
image's patched site-packages is a patched copy of the installed vLLM on
PYTHONPATH, /run/k3rocm is a temporary folder, the GPU kernel check runs in
the Triton interpreter.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from k3rocm.tryout.cpu import CPU_SETTINGS, SERVE_ENV
from k3rocm.tryout.tiny_model import build_tiny_llama
from support.vllm_trees import REPO, patched_tree
from support.workers import free_port

DUMB_INIT = Path(sys.executable).with_name("dumb-init")
# The image's CMD, under its ENTRYPOINT (dumb-init) below.
CONTAINER_COMMAND = (sys.executable, "-m", "k3rocm.container.supervise", "run")


@dataclass
class ContainerTree:
    process: subprocess.Popen
    run_dir: Path
    port: int
    log_path: Path
    env: dict[str, str]
    log_copier: threading.Thread

    @property
    def log(self) -> str:
        if not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    @property
    def report(self) -> dict:
        return json.loads((self.run_dir / "smoke-report.json").read_text())

    def health(self) -> subprocess.CompletedProcess:
        """The image's HEALTHCHECK command."""
        return subprocess.run(
            [sys.executable, "-m", "k3rocm.container.health"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def wait_for(self, what: str, condition: Callable[[], bool], timeout: float):
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(
                    f"container exited ({self.process.returncode}) while waiting "
                    f"for {what}; log tail:\n{self.log[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {what} within {timeout:.0f} s; log tail:\n{self.log[-4000:]}"
                )
            time.sleep(0.5)

    def wait_exit(self, timeout: float) -> int:
        try:
            code = self.process.wait(timeout)
            self.log_copier.join(10)  # the last lines, up to end of stream
            return code
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"container still running after {timeout:.0f} s; log tail:\n"
                f"{self.log[-4000:]}"
            ) from None

    def vllm_pid(self) -> int | None:
        """vLLM's pid (the leader of its process group), once it started."""
        try:
            return int((self.run_dir / "vllm.pgid").read_text())
        except (FileNotFoundError, ValueError):
            return None


def session_processes(session: int) -> list[int]:
    """Pids of every live process of a session (the container's whole tree)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, pgrp, session.
        if int(fields[3]) == session and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


def start_container_tree(
    tmp: Path, *, patched: bool = True, **settings: str
) -> ContainerTree:
    """Start the tree in a new session, as a container would be; ``patched``
    False serves the installed vLLM, which has no patch marker."""
    run_dir = tmp / "run"
    port = free_port()
    env = {
        **os.environ,
        **SERVE_ENV,
        "K3_RUN_DIR": str(run_dir),
        "K3_SMOKE_REPORT": str(run_dir / "smoke-report.json"),
        # Beside the run directory: it outlives it, as the cache volume does.
        "K3_FORENSICS_DIR": str(tmp / "forensics"),
        "K3_SUPERVISORD_CONF": str(REPO / "docker" / "supervisord.conf"),
        "K3_PROFILE": "cpu-dev",
        "K3_MODEL": str(build_tiny_llama(tmp / "model")),
        "K3_HOST": "127.0.0.1",
        "K3_PORT": str(port),
        "K3_MAX_MODEL_LEN": "512",
        "K3_EXTRA_ARGS": CPU_SETTINGS["K3_EXTRA_ARGS"],
        "K3_STOP_GRACE_SECONDS": "30",
        "K3_SMOKE_LOAD_TIMEOUT": "300",
        "TRITON_INTERPRET": "1",
        "PYTHONUNBUFFERED": "1",
        **settings,
    }
    if patched:
        env["PYTHONPATH"] = str(patched_tree())
    else:
        env.pop("PYTHONPATH", None)
    log_path = tmp / "container.log"
    process = subprocess.Popen(
        [str(DUMB_INIT), "--single-child", "--", *CONTAINER_COMMAND],
        env=env,
        # A pipe, like the container runtime's: supervisord reopens
        # /dev/stdout and /dev/stderr per program, which on a regular file
        # would start each at offset 0 and overwrite the others.
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log_copier = threading.Thread(
        target=_copy_log, args=(process.stdout, log_path), daemon=True
    )
    log_copier.start()
    return ContainerTree(process, run_dir, port, log_path, env, log_copier)


def _copy_log(stream, log_path: Path) -> None:
    with log_path.open("ab", buffering=0) as log:
        for line in stream:
            log.write(line)


def stop_container_tree(tree: ContainerTree) -> None:
    """Clean up after a test, whatever state it left: SIGTERM like `docker
    stop`, then SIGKILL whatever of the session is left."""
    if tree.process.poll() is None:
        tree.process.send_signal(signal.SIGTERM)
        try:
            tree.process.wait(60)
        except subprocess.TimeoutExpired:
            tree.process.kill()
            tree.process.wait()
    for pid in session_processes(tree.process.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
