"""The container's process tree around supervisord (docker/supervisord.conf).

    python -m k3rocm.supervise run     the container's main process (under an init)
    python -m k3rocm.supervise serve   supervisord's `vllm` program
    python -m k3rocm.supervise listen  supervisord's `guard` event listener

``run`` clears what a previous start left in ``K3_RUN_DIR``, fills in the
defaults the config interpolates, runs supervisord in the foreground, hands
it SIGTERM/SIGINT, and exits with the guard's stop reason: supervisord exits
0 when the guard stops it, the container must not.

Exit codes of ``run``: 0 stopped on request; 3 vLLM could not be kept running
(fatal at start, or more than ``K3_VLLM_MAX_RESTARTS`` deaths); 4 the smoke
test failed under ``K3_SMOKE_ON_FAILURE=stop``; otherwise supervisord's own.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from k3rocm.contract import (
    DEFAULT_RUN_DIR,
    READY_MARK,
    RUN_DIR_ENV,
    SMOKE_REPORT_ENV,
    SMOKE_REPORT_NAME,
    STAGE1_GATE,
    run_dir,
)

EXIT_VLLM, EXIT_SMOKE = 3, 4
DEFAULTS = {
    RUN_DIR_ENV: str(DEFAULT_RUN_DIR),
    "K3_SUPERVISORD_CONF": "/opt/k3rocm/docker/supervisord.conf",
    # vLLM counts as started after this long; dying sooner is a failed start.
    "K3_VLLM_START_SECONDS": "10",
    "K3_VLLM_MAX_RESTARTS": "3",
    # How long vLLM may take to drain on SIGTERM before SIGKILL; compose's
    # stop_grace_period must leave room for it.
    "K3_STOP_GRACE_SECONDS": "120",
    "K3_SMOKE_STAGE1_TIMEOUT": "900",
}
REASON_FILE = "exit-reason.json"
# The process group of the running vLLM, for reaping after a crash.
VLLM_GROUP_FILE = "vllm.pgid"
# What a previous start may have left behind; none of it holds for this one.
_STALE = (READY_MARK, STAGE1_GATE, REASON_FILE, VLLM_GROUP_FILE, SMOKE_REPORT_NAME)


def _log(message: str) -> None:
    print(f"k3rocm.supervise: {message}", file=sys.stderr, flush=True)


def run() -> int:
    for name, value in DEFAULTS.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("K3_PYTHON", sys.executable)
    directory = run_dir()
    os.environ.setdefault(SMOKE_REPORT_ENV, str(directory / SMOKE_REPORT_NAME))
    directory.mkdir(parents=True, exist_ok=True)
    for name in _STALE:
        (directory / name).unlink(missing_ok=True)
    Path(os.environ[SMOKE_REPORT_ENV]).unlink(missing_ok=True)

    supervisord = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor.supervisord",
            "--nodaemon",
            "--configuration",
            os.environ["K3_SUPERVISORD_CONF"],
        ]
    )

    def forward(signum: int, _frame: object) -> None:
        supervisord.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    status = supervisord.wait()

    reason_file = directory / REASON_FILE
    if reason_file.is_file():
        reason = json.loads(reason_file.read_text())
        _log(f"container stopped: {reason['reason']} (exit {reason['exit_code']})")
        return reason["exit_code"]
    if status != 0:
        _log(f"supervisord exited with status {status}")
    return status


def serve() -> int:
    """Wait for smoke stage 1 (vLLM takes no traffic before it), then become
    the launcher, so supervisord's signals reach vLLM itself."""
    gate = run_dir() / STAGE1_GATE
    timeout = float(os.environ.get("K3_SMOKE_STAGE1_TIMEOUT", "900")) + 60
    deadline = time.monotonic() + timeout
    while not gate.is_file():
        if time.monotonic() > deadline:
            _log(f"smoke stage 1 did not open {gate} within {timeout:.0f} s")
            return 1
        time.sleep(0.5)
    reap_previous_vllm(run_dir() / VLLM_GROUP_FILE)
    os.execv(sys.executable, [sys.executable, "-m", "k3rocm.launcher"])
    return 1  # not reached: execv replaces this process


def reap_previous_vllm(group_file: Path) -> None:
    """A vLLM that died abruptly leaves its engine processes running (holding
    GPU memory); kill what is left of its process group, then record ours.
    supervisord starts each program as a process group leader."""
    if group_file.is_file():
        group = int(group_file.read_text())
        if kill_group(group, timeout=30):
            _log(f"killed what was left of the previous vLLM (process group {group})")
    group_file.write_text(f"{os.getpgrp()}\n")


def kill_group(group: int, timeout: float) -> bool:
    """SIGKILL a process group and wait until it is gone; False if it was
    already empty."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    _log(f"process group {group} outlived SIGKILL for {timeout:.0f} s")
    return True


class Guard:
    """Decides, event by event, whether the container must stop."""

    def __init__(self, max_restarts: int):
        self.max_restarts = max_restarts
        self.vllm_deaths = 0

    def judge(self, event: str, process: str, expected: bool) -> tuple[int, str] | None:
        """(exit code, reason) when the container must stop, else None."""
        if process == "vllm" and event == "PROCESS_STATE_FATAL":
            return EXIT_VLLM, (
                "vLLM failed to start (died within K3_VLLM_START_SECONDS "
                f"{self.max_restarts + 1} times in a row)"
            )
        if process == "vllm" and event == "PROCESS_STATE_EXITED" and not expected:
            self.vllm_deaths += 1
            if self.vllm_deaths > self.max_restarts:
                return EXIT_VLLM, (
                    f"vLLM died {self.vllm_deaths} times; K3_VLLM_MAX_RESTARTS="
                    f"{self.max_restarts} restarts allowed"
                )
            _log(
                f"vLLM died; restart {self.vllm_deaths} of {self.max_restarts} "
                "(K3_VLLM_MAX_RESTARTS)"
            )
        if process == "smoke" and (
            event == "PROCESS_STATE_FATAL"
            or (event == "PROCESS_STATE_EXITED" and not expected)
        ):
            report = os.environ.get(SMOKE_REPORT_ENV, "the smoke report")
            return EXIT_SMOKE, (
                f"smoke test failed under K3_SMOKE_ON_FAILURE=stop (see {report})"
            )
        return None


def listen() -> int:
    from supervisor import childutils

    guard = Guard(int(os.environ.get("K3_VLLM_MAX_RESTARTS", "3")))
    reason_file = run_dir() / REASON_FILE
    while True:
        headers, payload = childutils.listener.wait(sys.stdin, sys.stdout)
        body = childutils.get_headers(payload.split("\n", 1)[0])
        verdict = guard.judge(
            headers["eventname"], body["processname"], body.get("expected") == "1"
        )
        if verdict and not reason_file.exists():
            code, reason = verdict
            tmp = reason_file.with_name(REASON_FILE + ".tmp")
            tmp.write_text(json.dumps({"exit_code": code, "reason": reason}) + "\n")
            os.replace(tmp, reason_file)
            _log(f"stopping the container: {reason}")
            # Our parent is supervisord: SIGTERM makes it stop every program
            # (vLLM gracefully) and exit; `run` then exits with `code`.
            os.kill(os.getppid(), signal.SIGTERM)
        childutils.listener.ok(sys.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3rocm.supervise", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", choices=["run", "serve", "listen"])
    command = parser.parse_args(argv).command
    return {"run": run, "serve": serve, "listen": listen}[command]()


if __name__ == "__main__":
    sys.exit(main())
