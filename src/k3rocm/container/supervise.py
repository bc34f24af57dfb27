"""The container's process tree around supervisord (docker/supervisord.conf).

    python -m k3rocm.container.supervise run     the container's main process
                                                 (under an init)
    python -m k3rocm.container.supervise serve   supervisord's `vllm` program
    python -m k3rocm.container.supervise listen  supervisord's `guard` event
                                                 listener
    python -m k3rocm.container.supervise ctl [ARGS]  supervisorctl on the running tree
                                           (e.g. `ctl status`)

``run`` clears what a previous start left in ``K3_RUN_DIR``, fills in the
defaults the config interpolates, runs supervisord in the foreground, and
exits with the guard's stop reason: supervisord exits 0 when the guard stops
it, the container must not. On SIGTERM/SIGINT it first drains (k3rocm.container.drain:
new requests get 503, accepted ones finish, within K3_STOP_GRACE_SECONDS'
drain share), then stops supervisord; a second signal skips the rest of the
drain.

Exit codes of ``run``: 0 stopped on request; 2 a malformed setting; 3 vLLM
could not be kept running (fatal at start, or more than
``K3_VLLM_MAX_RESTARTS`` deaths); 4 the smoke test failed under
``K3_SMOKE_ON_FAILURE=stop`` (a restart of the same container exits 4 again
at once instead of loading the model again: recreate the container to
retry); 5 the engine stalled (k3rocm.container.watchdog; a restart loads again);
128+N supervisord was killed by signal N; otherwise supervisord's own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from k3rocm.common.api_address import api_url
from k3rocm.common.exit_codes import ExitCode
from k3rocm.common.line_log import line_logger
from k3rocm.common.run_files import (
    DEATHS_FILE,
    DRAIN_MARK,
    READY_MARK,
    REASON_FILE,
    SMOKE_REPORT_NAME,
    STACK_HANDLERS,
    STAGE1_GATE,
    STALL_MARK,
    VLLM_GROUP_FILE,
    StopReason,
    run_dir,
    smoke_report_path,
)
from k3rocm.common.setting_kinds import env_text, read_all
from k3rocm.common.setting_table import (
    HOST,
    PORT,
    RUN_DIR,
    SMOKE_REPORT,
    SMOKE_STAGE1_TIMEOUT,
    STOP_GRACE_SECONDS,
    SUPERVISORD_CONF,
    VLLM_MAX_RESTARTS,
    VLLM_START_SECONDS,
)
from k3rocm.common.stop_budget import StopBudget
from k3rocm.container.drain import write_drain_mark
from k3rocm.container.drain_wait import wait_drained
from k3rocm.container.guard import listen
from k3rocm.container.jit_locks import sweep as sweep_jit_locks
from k3rocm.container.writable import problems as unwritable
from k3rocm.launcher.preflight import check as check_launch

# What `run` fills in for the config's %(ENV_...)s and its own programs.
log = line_logger("k3rocm.container.supervise")
DEFAULTS = {
    setting.env: env_text(setting.default)
    for setting in (
        RUN_DIR,
        SUPERVISORD_CONF,
        VLLM_START_SECONDS,
        VLLM_MAX_RESTARTS,
        SMOKE_STAGE1_TIMEOUT,
    )
}
# supervisord's wait between SIGTERM and SIGKILL for vLLM, derived from the
# stop budget (k3rocm.common.stop_budget), for %(ENV_...)s in supervisord.conf.
STOPWAIT_ENV = "K3_VLLM_STOPWAIT_SECONDS"
# What a previous start may have left behind; none of it holds for this one.
_STALE = (
    READY_MARK,
    STAGE1_GATE,
    DRAIN_MARK,
    REASON_FILE,
    STALL_MARK,
    VLLM_GROUP_FILE,
    DEATHS_FILE,
    SMOKE_REPORT_NAME,
)


def _previous_smoke_failure(directory: Path) -> str | None:
    """The reason of a previous start of this container that failed the smoke
    test; Docker's restart policy must not buy a second multi-hour load."""
    try:
        reason = StopReason.read(directory)
    except (OSError, ValueError):
        return None
    if reason is not None and reason.exit_code == ExitCode.SMOKE:
        return reason.reason
    return None


def _fill_defaults() -> None:
    """What supervisord.conf interpolates; compose passes every allowed
    variable, unset ones as empty strings."""
    for name, value in (*DEFAULTS.items(), ("K3_PYTHON", sys.executable)):
        if not os.environ.get(name, "").strip():
            os.environ[name] = value


def ctl(args: list[str]) -> int:
    """supervisorctl with the configuration's variables filled in as ``run``
    fills them (a `docker exec` shell lacks them)."""
    _fill_defaults()
    conf = os.environ[SUPERVISORD_CONF.env]
    command = [sys.executable, "-m", "supervisor.supervisorctl", "-c", conf, *args]
    os.execv(sys.executable, command)
    return 1  # not reached: execv replaces this process


def run() -> int:
    _fill_defaults()
    # Every setting problem at once, refused now: once, at once, with exit 2,
    # not as a vLLM that supervisord retries and the guard counts as crashes.
    _, _, problems = check_launch([], os.environ)  # container settings too
    problems += unwritable(os.environ)
    # The launcher's check above reports these settings' problems; a refused
    # one reads as its default here, and the start is refused below.
    launch = read_all(os.environ, (STOP_GRACE_SECONDS, HOST, PORT))[0]
    budget = StopBudget(launch[STOP_GRACE_SECONDS.name])
    base_url = api_url(launch[HOST.name], launch[PORT.name])
    if problems:
        for problem in problems:
            log(f"cannot start: {problem}")
        log("cannot start: fix the settings above, then start the container again")
        return ExitCode.SETTINGS
    os.environ[STOPWAIT_ENV] = str(budget.stopwait_seconds)
    directory = run_dir()
    # Resolved once (unset, empty or padded alike) for every process below.
    os.environ[SMOKE_REPORT.env] = str(smoke_report_path(os.environ))
    directory.mkdir(parents=True, exist_ok=True)
    failed = _previous_smoke_failure(directory)
    if failed is not None:
        log(
            f"not starting again: a previous start of this container failed "
            f"({failed}); "
            "fix the cause, then recreate the container (docker compose up "
            "--force-recreate, or docker rm and docker run)"
        )
        return ExitCode.SMOKE
    for name in _STALE:
        (directory / name).unlink(missing_ok=True)
    shutil.rmtree(directory / STACK_HANDLERS, ignore_errors=True)
    Path(os.environ[SMOKE_REPORT.env]).unlink(missing_ok=True)
    # Before anything builds: a lock left by a build killed with an earlier
    # container would make this start wait for ever.
    try:
        sweep_jit_locks(os.environ, log)
    except OSError as err:
        log(f"could not sweep the JIT locks ({err}); starting anyway")

    supervisord = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "supervisor.supervisord",
            "--nodaemon",
            "--configuration",
            os.environ[SUPERVISORD_CONF.env],
        ]
    )
    signals: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        signals.append(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    while supervisord.poll() is None and not signals:
        time.sleep(0.2)
    if signals and supervisord.poll() is None:
        log(f"stop requested (signal {signals[0]}); draining first")
        stop_gracefully(supervisord, directory, budget, base_url, signals)
    status = supervisord.wait()
    return _exit_code(directory, status)


def stop_gracefully(
    supervisord: subprocess.Popen,
    directory: Path,
    budget: StopBudget,
    base_url: str,
    signals: list[int],
) -> None:
    deadline = time.time() + budget.drain_seconds
    write_drain_mark(directory, deadline)
    wait_drained(
        f"{base_url}/metrics",
        deadline,
        interrupted=lambda: len(signals) > 1 or supervisord.poll() is not None,
        log=log,
    )
    if len(signals) > 1:
        # The drain is over now: streams still open are cut off with the
        # error event, as at the deadline.
        write_drain_mark(directory, time.time())
    if supervisord.poll() is None:
        supervisord.send_signal(signal.SIGTERM)


def _exit_code(directory: Path, status: int) -> int:
    try:
        reason = StopReason.read(directory)
    except (OSError, ValueError) as err:
        log(
            f"unreadable stop reason {directory / REASON_FILE} ({err}); exiting "
            f"with {ExitCode.VLLM}"
        )
        return ExitCode.VLLM
    if reason is not None:
        log(f"container stopped: {reason.reason} (exit {reason.exit_code})")
        return reason.exit_code
    if status < 0:
        log(f"supervisord was killed by signal {-status}; exiting with {128 - status}")
        return 128 - status
    if status != 0:
        log(f"supervisord exited with status {status}")
    return status


def serve() -> int:
    """Wait for smoke stage 1 (vLLM takes no traffic before it), then become
    the launcher, so supervisord's signals reach vLLM itself."""
    gate = run_dir() / STAGE1_GATE
    timeout = SMOKE_STAGE1_TIMEOUT.read(os.environ) + 60
    deadline = time.monotonic() + timeout
    while not gate.is_file():
        if time.monotonic() > deadline:
            log(f"smoke stage 1 did not open {gate} within {timeout:.0f} s")
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
            log(f"killed what was left of the previous vLLM (process group {group})")
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
    log(f"process group {group} outlived SIGKILL for {timeout:.0f} s")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m k3rocm.container.supervise",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("command", choices=["run", "serve", "listen", "ctl"])
    parser.add_argument("args", nargs=argparse.REMAINDER, help="ctl: supervisorctl's")
    parsed = parser.parse_args(argv)
    if parsed.command == "ctl":
        return ctl(parsed.args)
    return {"run": run, "serve": serve, "listen": listen}[parsed.command]()


if __name__ == "__main__":
    sys.exit(main())
