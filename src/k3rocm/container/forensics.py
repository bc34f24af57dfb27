"""Where a stalled vLLM was: the Python stacks of every vLLM process.

Taken with ``py-spy dump`` (pinned in the image) before the container stops,
so the evidence is not lost with the processes. Each process's stacks go to
the container's log as one delimited block and, all together, to a file under
``K3_FORENSICS_DIR`` (the cache volume by default: the run directory is
wiped at the next start).

py-spy reads another process's memory, which the kernel allows a process of
the same user unless Yama's ``ptrace_scope`` is 1 or more (Ubuntu's default);
then it needs CAP_SYS_PTRACE. The image gives the py-spy binary that
capability as a file capability, which works only where the container's
bounding set holds it: compose.yaml adds SYS_PTRACE for that reason. Where
py-spy cannot read a process, the capture asks the process itself: every vLLM
process registered faulthandler on STACK_SIGNAL (k3rocm.plugin.stack_handler),
which needs no capability but cannot reach a stopped process. Where neither
works, the block says why in one line and the capture goes on.

    python -m k3rocm.container.forensics grant-ptrace    (a build step, as root)
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from k3rocm.common.line_log import line_logger
from k3rocm.common.run_files import STACK_SIGNAL, stack_handler_file
from k3rocm.common.vllm_release import TARGET

log = line_logger("k3rocm.container.forensics")

# A dump that takes longer than this is given up (the process may be in a
# state py-spy cannot read); the next process is still dumped.
DUMP_TIMEOUT_SECONDS = 30
# A process that has not written its stacks this long after the signal is
# not answering it (stopped, or its handler's file is gone).
SIGNAL_ANSWER_SECONDS = 5.0
# The handler writes in one go; a file this long unchanged is complete.
_SETTLED_SECONDS = 0.3
BEGIN, END = "===== k3rocm stacks", "===== end of k3rocm stacks"
# The xattr a file capability lives in, and its revision-2 layout: magic with
# the effective bit, then permitted and inheritable sets (low, high words).
_CAPABILITY_XATTR = "security.capability"
_VFS_CAP_REVISION_2 = 0x02000000
_VFS_CAP_EFFECTIVE = 0x000001
CAP_SYS_PTRACE = 19


@dataclass(frozen=True)
class Process:
    pid: int
    name: str  # the kernel's comm: VLLM::EngineCore, VLLM::Worker..., python3
    role: str


def process_group_members(group: int, proc: Path = Path("/proc")) -> list[Process]:
    """Every process of the process group, its leader (vLLM's API server, or
    the headless node's vLLM) first."""
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # comm is in parentheses and may hold spaces or parentheses itself.
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) != group:
            continue
        name = _title(entry) or name
        pid = int(entry.name)
        role = "vLLM main process" if pid == group else _role(name)
        members.append(Process(pid, name, role))
    return sorted(members, key=lambda p: (p.pid != group, p.pid))


def _title(entry: Path) -> str | None:
    """vLLM's process title (``VLLM::EngineCore``, set in its command line);
    comm cuts names at 15 characters."""
    try:
        first = (entry / "cmdline").read_bytes().split(b"\0", 1)[0].decode()
    except (OSError, UnicodeDecodeError):
        return None
    return first.split()[0] if first.startswith(TARGET.process_title_prefix) else None


def _role(name: str) -> str:
    if name.startswith(TARGET.engine_core_title):
        return "engine core"
    if name.startswith(TARGET.worker_title):
        return "worker"
    return "vLLM process"


def py_spy() -> str | None:
    """The py-spy binary pip installed beside this Python (the one the image
    gave the capability), else one on PATH."""
    try:
        files = metadata.distribution("py-spy").files or []
    except metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == "py-spy" and file.parent.name == "bin":
            path = Path(str(file.locate())).resolve()
            if path.is_file():
                return str(path)
    return shutil.which("py-spy")


def dump_stacks(pid: int, binary: str) -> tuple[bool, str]:
    """(True, stacks) or (False, why not). Without pausing the process first:
    a stalled one holds still anyway, and a slow one must not be stopped; a
    read torn by a running process is retried once with the process paused."""
    why = ""
    for extra in (["--nonblocking"], []):
        try:
            result = subprocess.run(
                [binary, "dump", "--pid", str(pid), *extra],
                capture_output=True,
                text=True,
                timeout=DUMP_TIMEOUT_SECONDS,
            )
        except subprocess.TimeoutExpired:
            why = f"py-spy did not finish within {DUMP_TIMEOUT_SECONDS} s"
            continue
        except OSError as err:
            return False, f"py-spy cannot run: {err}{_PTRACE_HINT}"
        if result.returncode == 0 and result.stdout.strip():
            return True, result.stdout.rstrip()
        why = (result.stderr.strip() or result.stdout.strip()).splitlines()
        why = why[-1] if why else f"py-spy exited {result.returncode}"
        if "Permission denied" in why or "Operation not permitted" in why:
            return False, f"py-spy cannot attach: {why}{_PTRACE_HINT}"
    return False, why


_PTRACE_HINT = (
    " (the container needs the SYS_PTRACE capability: compose.yaml's cap_add; "
    "with docker run, --cap-add SYS_PTRACE)"
)


def signalled_stacks(
    pid: int, handlers: Path, wait: float = SIGNAL_ANSWER_SECONDS
) -> tuple[bool, str]:
    """(True, stacks) that the process wrote on STACK_SIGNAL into its file
    under ``handlers`` (k3rocm.plugin.stack_handler), or (False, why not).
    Only a process with a file of its own is signalled: to one without a
    handler the signal would be fatal."""
    path = stack_handler_file(handlers, pid)
    if path is None or not path.is_file():
        return False, "it registered no stack handler (it loaded no vLLM plugins)"
    before = path.stat().st_size
    try:
        os.kill(pid, STACK_SIGNAL)
    except OSError as err:
        return False, f"cannot signal it: {err}"
    deadline = time.monotonic() + wait
    size, changed_at = before, None
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now_size = path.stat().st_size
        if now_size != size:
            size, changed_at = now_size, time.monotonic()
        elif changed_at and time.monotonic() - changed_at >= _SETTLED_SECONDS:
            break
    if size == before:
        return False, (
            f"it did not answer {STACK_SIGNAL.name} within {wait:g} s (a "
            "stopped process holds signals; py-spy with SYS_PTRACE reads it)"
        )
    with path.open("rb") as kept:
        kept.seek(before)
        text = kept.read(size - before).decode(errors="replace").rstrip()
    return True, f"(faulthandler on {STACK_SIGNAL.name}: Python frames only)\n{text}"


def process_stacks(
    pid: int, binary: str | None, handlers: Path | None
) -> tuple[bool, str]:
    """py-spy's dump, else the stacks the process writes on a signal."""
    if binary is None:
        ok, text = False, "py-spy is not installed"
    else:
        ok, text = dump_stacks(pid, binary)
    if ok or handlers is None:
        return ok, text
    answered, signalled = signalled_stacks(pid, handlers)
    if answered:
        return True, f"py-spy: {text}\n{signalled}"
    return False, f"{text}; no stacks on a signal either: {signalled}"


def capture(
    reason: str,
    group: int,
    out_dir: Path,
    log: Callable[[str], None],
    write: Callable[[str], None] = lambda text: print(
        text, file=sys.stderr, flush=True
    ),
    handlers: Path | None = None,
) -> Path | None:
    """Dump every process of vLLM's process group into the log (``write``,
    one block each) and into one file under ``out_dir``; that file, or None
    where it could not be written (said in one line). ``handlers``: the run
    directory's STACK_HANDLERS, asked where py-spy cannot read a process."""
    members = process_group_members(group)
    binary = py_spy()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    blocks = [f"k3rocm stack capture {stamp}: {reason}"]
    log(f"capturing the stacks of {len(members)} vLLM process(es): {reason}")
    for process in members:
        ok, text = process_stacks(process.pid, binary, handlers)
        header = f"{BEGIN} pid {process.pid} {process.name} ({process.role}) ====="
        body = text if ok else f"no stacks: {text}"
        block = f"{header}\n{body}\n{END} pid {process.pid} ====="
        write(block)
        blocks.append(block)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"stacks-{stamp}-{os.getpid()}.txt"
        path.write_text("\n".join(blocks) + "\n")
    except OSError as err:
        log(f"could not keep the stacks in {out_dir} ({err}); they are in this log")
        return None
    log(f"stacks kept in {path}")
    return path


def ptrace_capability() -> bytes:
    """A revision-2 file capability: CAP_SYS_PTRACE, permitted and effective."""
    return struct.pack(
        "<IIIII", _VFS_CAP_REVISION_2 | _VFS_CAP_EFFECTIVE, 1 << CAP_SYS_PTRACE, 0, 0, 0
    )


def grant_ptrace(binary: Path) -> None:
    """Give ``binary`` CAP_SYS_PTRACE as a file capability (as setcap
    cap_sys_ptrace+ep would; the base image may lack setcap)."""
    os.setxattr(binary.resolve(), _CAPABILITY_XATTR, ptrace_capability())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["grant-ptrace"]:
        log("usage: python -m k3rocm.container.forensics grant-ptrace")
        return 2
    binary = py_spy()
    if binary is None:
        log("py-spy is not installed")
        return 1
    try:
        grant_ptrace(Path(binary))
    except OSError as err:
        log(f"cannot set the capability on {binary}: {err}")
        return 1
    print(f"k3rocm.container.forensics: {binary} has CAP_SYS_PTRACE (file capability)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
