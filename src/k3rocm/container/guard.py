"""The container's guard: supervisord's event listener
(``python -m k3rocm.container.supervise listen``), which decides from each process
event whether the container must stop, and with which exit code.

The exit codes are k3rocm.common.exit_codes.ExitCode (``k3rocm.container.supervise
run`` exits with them): SETTINGS when the smoke test could not run (its
settings or environment; a start after the fix loads again), VLLM when vLLM
could not be kept running (fatal at start; more than ``K3_VLLM_MAX_RESTARTS``
deaths; any death on a node of a multi-node job, which cannot rejoin alone;
or, on a headless node, node 0 gone for ``LOST_NODE0_SECONDS``, which vLLM
there would wait for forever), SMOKE when the smoke test failed under
``K3_SMOKE_ON_FAILURE=stop``; the watchdog (k3rocm.container.watchdog) stops
the container with STALL through ``stop_container`` too.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from k3rocm.common.exit_codes import ExitCode
from k3rocm.common.json_file import UnreadableJson, read_json_file
from k3rocm.common.line_log import line_logger
from k3rocm.common.node import Node, connected_to, node_from_env
from k3rocm.common.run_files import (
    DEATHS_FILE,
    DRAIN_MARK,
    READY_MARK,
    REASON_FILE,
    VLLM_GROUP_FILE,
    StopReason,
    run_dir,
    smoke_report_path,
)
from k3rocm.common.setting_table import FORENSICS_DIR, VLLM_MAX_RESTARTS
from k3rocm.container.forensics import capture

# A headless node whose connection to node 0 stays gone this long after it
# joined has lost the job: its vLLM would wait for node 0 forever.
LOST_NODE0_SECONDS = 15


log = line_logger("k3rocm.container.guard")


def smoke_failure(report: Path) -> str:
    """The failed checks' names as the report lists them, and where the
    report was kept or why it was not, for a reason line."""
    try:
        document = read_json_file(report)
        names = [
            f"{stage_name} {check['name']}"
            for stage_name, stage in document["stages"].items()
            for check in stage["checks"]
            if check["status"] == "fail"
        ]
    except (FileNotFoundError, UnreadableJson, KeyError, TypeError, AttributeError):
        return f"see {report}"
    checks = ", ".join(names)[:300] or f"see {report}"
    kept, not_kept = document.get("kept"), document.get("not_kept")
    if isinstance(kept, str):
        return f"{checks} (report kept in {kept[:300]})"
    if isinstance(not_kept, str):
        return f"{checks} ({not_kept[:500]})"
    return checks


class Guard:
    """Decides, event by event, whether the container must stop. The count of
    vLLM deaths lives in ``deaths_file``, so a restarted guard keeps it."""

    def __init__(self, max_restarts: int, deaths_file: Path, node: Node | None = None):
        self.max_restarts = max_restarts
        self.deaths_file = deaths_file
        # A node of a multi-node job: a lone restart cannot rejoin it.
        self.multi_node = node if node is not None and node.multi_node else None
        self.lost_since: float | None = None

    @property
    def vllm_deaths(self) -> int:
        try:
            return int(self.deaths_file.read_text())
        except (OSError, ValueError):
            return 0

    def _count_death(self) -> int:
        deaths = self.vllm_deaths + 1
        tmp = self.deaths_file.with_name(f".{self.deaths_file.name}.tmp")
        tmp.write_text(f"{deaths}\n")
        os.replace(tmp, self.deaths_file)
        return deaths

    def judge(
        self, event: str, process: str, expected: bool, from_state: str = "RUNNING"
    ) -> tuple[int, str] | None:
        """(exit code, reason) when the container must stop, else None."""
        if process == "vllm" and event == "PROCESS_STATE_FATAL":
            return ExitCode.VLLM, (
                "vLLM failed to start (died within K3_VLLM_START_SECONDS "
                f"{self.max_restarts + 1} times in a row)"
            )
        # A stop that supervisord was asked for ends in STOPPED, never EXITED:
        # every EXITED of a running vLLM is a death, whatever its status (an
        # engine death can end in a clean exit of the API server). Exits while
        # STARTING are failed starts: supervisord retries them, then FATAL.
        if (
            process == "vllm"
            and event == "PROCESS_STATE_EXITED"
            and from_state == "RUNNING"
        ):
            deaths = self._count_death()
            if self.multi_node is not None:
                return ExitCode.VLLM, (
                    f"vLLM exited on node {self.multi_node.rank} of a multi-node "
                    f"deployment ({self.multi_node.profile}); one node cannot "
                    "rejoin a running job alone, so every node stops and must "
                    "start again together (see the other nodes' logs for the "
                    "first failure)"
                )
            if deaths > self.max_restarts:
                return ExitCode.VLLM, (
                    f"vLLM died {deaths} times; K3_VLLM_MAX_RESTARTS="
                    f"{self.max_restarts} restarts allowed"
                )
            log(
                f"vLLM exited unasked; restart {deaths} of {self.max_restarts} "
                "(K3_VLLM_MAX_RESTARTS)"
            )
        if process == "smoke" and (
            event == "PROCESS_STATE_FATAL"
            or (event == "PROCESS_STATE_EXITED" and not expected)
        ):
            report = smoke_report_path()
            if not report.is_file():
                # It stopped before its first check: its settings or its
                # environment (said in its own log line), not the path.
                return ExitCode.SETTINGS, (
                    "the smoke test could not run (no report at "
                    f"{report}; its error is logged above); fix it and start "
                    "the container again"
                )
            return ExitCode.SMOKE, (
                "smoke test failed under K3_SMOKE_ON_FAILURE=stop: "
                f"{smoke_failure(report)}; "
                "this container will not load the model again: fix the cause, "
                "then recreate it (docker compose up -d --force-recreate)"
            )
        return None

    def tick(self, now: float) -> tuple[int, str] | None:
        """On a headless node that has joined (ready mark) and is not being
        stopped: (exit code, reason) once node 0 has been gone for
        LOST_NODE0_SECONDS."""
        node = self.multi_node
        directory = self.deaths_file.parent
        if (
            node is None
            or not node.headless
            or not (directory / READY_MARK).exists()
            or (directory / DRAIN_MARK).exists()
            or connected_to(str(node.master_addr), node.master_port)
        ):
            self.lost_since = None
            return None
        if self.lost_since is None:
            self.lost_since = now
        if now - self.lost_since < LOST_NODE0_SECONDS:
            return None
        return ExitCode.VLLM, (
            f"headless node {node.rank} lost its connection to node 0 at "
            f"{node.master_addr}:{node.master_port} for {LOST_NODE0_SECONDS} s; "
            "the job is gone, so every node stops and must start again together"
        )


def record_stop_reason(directory: Path, code: int, reason: str) -> bool:
    """Record why the container stops, unless a reason is recorded already:
    True for the one caller (the guard or the watchdog) whose reason holds.
    A hard link creates the file whole and only where none exists."""
    reason_file = directory / REASON_FILE
    tmp = reason_file.with_name(f".{REASON_FILE}.{os.getpid()}.tmp")
    tmp.write_text(StopReason(code, reason).text())
    try:
        os.link(tmp, reason_file)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    log(f"stopping the container: {reason}")
    return True


def stop_supervisord() -> None:
    """supervisord is the parent of the guard and the watchdog: SIGTERM makes
    it stop every program and exit; ``supervise run`` then exits with the
    recorded reason's code."""
    os.kill(os.getppid(), signal.SIGTERM)


def stop_container(directory: Path, code: int, reason: str) -> None:
    if record_stop_reason(directory, code, reason):
        stop_supervisord()


def capture_before_stopping(directory: Path, reason: str) -> None:
    """A headless node that lost node 0 dumps its own vLLM's stacks first:
    where node 0 stalled on this node, they show where."""
    try:
        group = int((directory / VLLM_GROUP_FILE).read_text())
    except (OSError, ValueError):
        return
    capture(reason, group, FORENSICS_DIR.read(os.environ), log)


def listen() -> int:
    from supervisor import childutils

    directory = run_dir()
    try:
        node = node_from_env(os.environ)
    except ValueError:
        node = None  # the launcher refuses these settings, saying why
    guard = Guard(VLLM_MAX_RESTARTS.read(os.environ), directory / DEATHS_FILE, node)
    while True:
        headers, payload = childutils.listener.wait(sys.stdin, sys.stdout)
        body = childutils.get_headers(payload.split("\n", 1)[0])
        if (directory / REASON_FILE).exists():
            verdict = None  # stopping already: later events change nothing
        elif headers["eventname"].startswith("TICK_"):
            verdict = guard.tick(time.monotonic())
        else:
            verdict = guard.judge(
                headers["eventname"],
                body["processname"],
                body.get("expected") == "1",
                body.get("from_state", "RUNNING"),
            )
        if verdict:
            code, reason = verdict
            if headers["eventname"].startswith("TICK_"):
                capture_before_stopping(directory, reason)
            stop_container(directory, code, reason)
        childutils.listener.ok(sys.stdout)
