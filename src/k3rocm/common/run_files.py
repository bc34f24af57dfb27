"""The container's run directory (K3_RUN_DIR): the files its processes
share (RUN_FILES, docs/container.md's table "The run directory"), where the
smoke report goes, and the stack handlers' files."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from k3rocm.common.setting_table import RUN_DIR, SMOKE_REPORT


def smoke_report_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the smoke test writes its JSON report: K3_SMOKE_REPORT, by
    default in the run directory (SMOKE_REPORT_NAME below)."""
    environ = os.environ if environ is None else environ
    return SMOKE_REPORT.read(environ) or run_dir(environ) / SMOKE_REPORT_NAME


@dataclass(frozen=True)
class RunFile:
    """A file of the container's run directory (K3_RUN_DIR): the state its
    processes share. ``k3rocm.container.supervise run`` removes every one at start."""

    name: str
    writer: str
    readers: str
    meaning: str
    lifetime: str

    # The modules join it to the run directory as they would its name.
    def __fspath__(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name


_UNTIL_NEXT_START = "until the container's next start"
STAGE1_GATE = RunFile(
    "stage1-done",
    "k3rocm.smoke",
    "k3rocm.container.supervise serve; k3rocm.container.status",
    "Smoke stage 1 is over (its verdict inside); vLLM may start.",
    _UNTIL_NEXT_START,
)
READY_MARK = RunFile(
    "ready",
    "k3rocm.smoke",
    "k3rocm.container.health; k3rocm.container.status",
    "Smoke stage 2 is over and serving goes on (its verdict inside: pass, or "
    "fail under K3_SMOKE_ON_FAILURE=warn); the health check needs it.",
    _UNTIL_NEXT_START,
)
SMOKE_REPORT_NAME = RunFile(
    "smoke-report.json",
    "k3rocm.smoke",
    "k3rocm.plugin.smoke_verdict (metrics plugin); k3rocm.container.status; "
    "k3rocm.container.supervise listen",
    "The smoke test's JSON report, rewritten as each stage ends (K3_SMOKE_REPORT "
    "may put it elsewhere).",
    _UNTIL_NEXT_START,
)
DRAIN_MARK = RunFile(
    "draining",
    "k3rocm.container.supervise run (k3rocm.container.drain)",
    "k3rocm.container.drain in vLLM's API server; k3rocm.container.health; "
    "k3rocm.container.status",
    "A stop is draining: new requests get 503 until the deadline inside.",
    "from the stop signal to the container's exit",
)
REASON_FILE = RunFile(
    "exit-reason.json",
    "k3rocm.container.supervise listen (the guard)",
    "k3rocm.container.supervise run; k3rocm.container.status",
    "Why the container stops and its exit code.",
    "until the next start, which refuses to load again when it records a "
    "failed smoke test",
)
PHASE_SINCE = RunFile(
    "phase-since.json",
    "k3rocm.container.status",
    "k3rocm.container.status",
    "When the start-up phases without a mark of their own (stage1, stage2) "
    "were first seen, so that a restarted status server keeps counting.",
    _UNTIL_NEXT_START,
)
STALL_MARK = RunFile(
    "stalled",
    "k3rocm.container.watchdog",
    "k3rocm.container.health; k3rocm.container.watchdog",
    "The engine stalled: since when, and how many requests were pending "
    "(JSON); the container is capturing stacks and about to exit 5.",
    "from the stall to the container's exit",
)
DEATHS_FILE = RunFile(
    "vllm-deaths",
    "k3rocm.container.supervise listen (the guard)",
    "k3rocm.container.supervise listen (the guard)",
    "vLLM deaths so far, so that a restarted guard keeps the count.",
    _UNTIL_NEXT_START,
)
VLLM_GROUP_FILE = RunFile(
    "vllm.pgid",
    "k3rocm.container.supervise serve",
    "k3rocm.container.supervise serve; k3rocm.container.watchdog; "
    "k3rocm.container.supervise listen (stacks)",
    "The running vLLM's process group; the next vLLM start kills what is left "
    "of it, a stall's stack capture dumps every process in it.",
    "replaced by each vLLM start",
)
STACK_HANDLERS = RunFile(
    "stack-handlers",
    "k3rocm.plugin.stack_handler (in every vLLM process)",
    "k3rocm.container.forensics (a stall's stack capture)",
    "A directory: one file per vLLM process that writes its Python stacks "
    "there on SIGUSR2 (faulthandler), named by its pid and start time; the "
    "capture signals these where py-spy cannot attach.",
    _UNTIL_NEXT_START,
)
RUN_FILES = (
    STAGE1_GATE,
    READY_MARK,
    SMOKE_REPORT_NAME,
    DRAIN_MARK,
    REASON_FILE,
    PHASE_SINCE,
    STALL_MARK,
    DEATHS_FILE,
    VLLM_GROUP_FILE,
    STACK_HANDLERS,
)

# The signal on which a vLLM process writes its stacks (faulthandler); vLLM
# and torch use neither SIGUSR1 nor SIGUSR2 (checked on 0.27.1).
STACK_SIGNAL = signal.SIGUSR2


def stack_handler_file(directory: Path, pid: int) -> Path | None:
    """The stack file of the process ``pid`` now is, in ``directory``
    (STACK_HANDLERS): named by pid and start time, so that a pid a dead vLLM
    process left behind is never taken for the process that has it now.
    None where the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # After the parenthesised name: state is field 3, start time field 22.
    started = stat[stat.rindex(")") + 2 :].split()[19]
    return directory / f"{pid}-{started}.txt"


def run_files_table() -> str:
    """README's table of the run directory."""
    lines = [
        "| file | writer | readers | meaning | lifetime |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| `{f.name}` | {f.writer} | {f.readers} | {f.meaning} | {f.lifetime} |"
        for f in RUN_FILES
    ]
    return "\n".join(lines) + "\n"


def run_dir(environ: Mapping[str, str] | None = None) -> Path:
    return Path(RUN_DIR.read(os.environ if environ is None else environ))


@dataclass(frozen=True)
class StopReason:
    """The stop-reason file (REASON_FILE): why the container stops and the
    exit code it stops with; written once by the guard or the watchdog, read
    by ``supervise``."""

    exit_code: int
    reason: str

    def text(self) -> str:
        return json.dumps({"exit_code": self.exit_code, "reason": self.reason}) + "\n"

    @classmethod
    def read(cls, directory: Path) -> StopReason | None:
        """The recorded reason; None when there is none; ValueError (or
        OSError) when the file cannot be read as one."""
        try:
            text = (directory / REASON_FILE).read_text()
        except FileNotFoundError:
            return None
        document = json.loads(text)
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        code, reason = document.get("exit_code"), document.get("reason")
        if not isinstance(code, int) or isinstance(code, bool):
            raise ValueError(f"exit_code is {code!r}")
        return cls(code, str(reason))
