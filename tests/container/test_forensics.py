"""Stack capture (k3rocm.container.forensics) with the real py-spy on real, stopped
Python processes, and the file capability the image gives py-spy, checked by
the kernel."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3rocm.container import forensics

# A process-group leader and a child in its group, each parked in a function
# whose name the dump must show.
PROGRAM = """
import multiprocessing, time

def stalled_worker_loop():
    time.sleep(1000)

def stalled_engine_loop():
    child = multiprocessing.get_context("fork").Process(target=stalled_worker_loop)
    child.start()
    print(child.pid, flush=True)
    time.sleep(1000)

stalled_engine_loop()
"""


@pytest.fixture
def stopped_group():
    """A process group of two Python processes, both stopped (SIGSTOP), as a
    hung engine is; yields (group, leader pid, child pid)."""
    leader = subprocess.Popen(
        [sys.executable, "-c", PROGRAM],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    child = int(leader.stdout.readline())
    time.sleep(0.5)  # both inside their sleep
    os.killpg(leader.pid, signal.SIGSTOP)
    try:
        yield leader.pid, leader.pid, child
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_every_process_of_the_group_is_found_leader_first(stopped_group):
    group, leader, child = stopped_group
    members = forensics.process_group_members(group)
    assert [m.pid for m in members] == [leader, child]
    assert members[0].role == "vLLM main process"


def test_capture_dumps_each_stopped_process_into_the_log_and_a_file(
    stopped_group, tmp_path
):
    group, leader, child = stopped_group
    logged, lines = [], []
    path = forensics.capture(
        "test stall", group, tmp_path / "f", lines.append, logged.append
    )
    assert path is not None and path.parent == tmp_path / "f"
    assert len(logged) == 2
    for block, pid, frame in zip(
        logged,
        (leader, child),
        ("stalled_engine_loop", "stalled_worker_loop"),
        strict=True,
    ):
        first, *body, last = block.splitlines()
        assert first.startswith(f"{forensics.BEGIN} pid {pid} ")
        assert last == f"{forensics.END} pid {pid} ====="
        assert any(frame in line for line in body), block
    kept = path.read_text()
    assert kept.startswith("k3rocm stack capture ") and "test stall" in kept
    assert all(block in kept for block in logged)
    # Still stopped: the dump did not resume what it read.
    assert _state(leader) == "T" and _state(child) == "T"


def test_without_py_spy_each_block_says_so_and_the_capture_goes_on(
    stopped_group, tmp_path, monkeypatch
):
    group, *_ = stopped_group
    monkeypatch.setattr(forensics, "py_spy", lambda: None)
    logged = []
    forensics.capture("x", group, tmp_path, lambda _: None, logged.append)
    assert len(logged) == 2
    assert all("no stacks: py-spy is not installed" in block for block in logged)


def test_an_unwritable_forensics_dir_is_one_line_and_the_log_keeps_the_stacks(
    stopped_group, tmp_path
):
    group, *_ = stopped_group
    blocker = tmp_path / "file"
    blocker.write_text("")
    lines, logged = [], []
    assert (
        forensics.capture("x", group, blocker / "sub", lines.append, logged.append)
        is None
    )
    assert len(logged) == 2 and "they are in this log" in lines[-1]


@pytest.mark.skipif(os.geteuid() != 0, reason="setting a file capability needs root")
def test_the_granted_capability_is_what_the_kernel_gives_a_non_root_user(tmp_path):
    """A copy of cat with the capability, run as uid 1000: the kernel puts
    CAP_SYS_PTRACE (and nothing else) into its effective set."""
    cat = tmp_path / "cat"
    shutil.copy(shutil.which("cat"), cat)
    cat.chmod(0o755)
    tmp_path.chmod(0o755)
    forensics.grant_ptrace(cat)
    status = subprocess.run(
        [
            "setpriv",
            "--reuid=1000",
            "--regid=1000",
            "--clear-groups",
            str(cat),
            "/proc/self/status",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    effective = next(line for line in status.splitlines() if line.startswith("CapEff:"))
    assert int(effective.split()[1], 16) == 1 << forensics.CAP_SYS_PTRACE


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


# A group whose processes registered the real stack handler (the general
# plugin vLLM would call) and then hang for real: the leader on a lock it
# already holds, its forked child in a sleep. A third process, never
# registered, is in the group too.
HANDLED_PROGRAM = """
import multiprocessing, subprocess, sys, threading, time
from k3rocm.plugin import stack_handler

def worker_sleeping_forever():
    stack_handler.register()
    time.sleep(1000)

def engine_deadlocked_on_its_lock():
    stack_handler.register()
    child = multiprocessing.get_context("fork").Process(target=worker_sleeping_forever)
    child.start()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(999)"])
    print(child.pid, bystander.pid, flush=True)
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()

engine_deadlocked_on_its_lock()
"""


@pytest.fixture
def hung_group(tmp_path):
    """(group, leader, child, bystander, handlers directory)."""
    run = tmp_path / "run"
    run.mkdir()
    leader = subprocess.Popen(
        [sys.executable, "-c", HANDLED_PROGRAM],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "K3_RUN_DIR": str(run)},
    )
    child, bystander = map(int, leader.stdout.readline().split())
    handlers = run / "stack-handlers"
    deadline = time.monotonic() + 10
    while len(list(handlers.glob("*.txt"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # both inside their hang
    try:
        yield leader.pid, leader.pid, child, bystander, handlers
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_where_py_spy_cannot_read_a_hung_process_it_writes_its_own_stacks(
    hung_group, tmp_path, monkeypatch
):
    """py-spy absent stands in for one without SYS_PTRACE (the container test
    under --cap-drop ALL has the real refusal): each registered process's
    block holds its own frames, from faulthandler, the parent's file none of
    its forked child's; the unregistered process is not signalled (SIGUSR2
    would kill it) and says why."""
    group, leader, child, bystander, handlers = hung_group
    monkeypatch.setattr(forensics, "py_spy", lambda: None)
    logged = []
    forensics.capture(
        "hang", group, tmp_path / "f", lambda _: None, logged.append, handlers
    )
    blocks = {int(block.split()[4]): block for block in logged}
    assert set(blocks) == {leader, child, bystander}
    # (The child's stack holds its parent's frames below its own: a fork.)
    for pid in (leader, child):
        assert "py-spy: py-spy is not installed" in blocks[pid], blocks[pid]
        assert "faulthandler on SIGUSR2" in blocks[pid]
    assert "in engine_deadlocked_on_its_lock" in blocks[leader], blocks[leader]
    assert "worker_sleeping_forever" not in blocks[leader], blocks[leader]
    assert "in worker_sleeping_forever" in blocks[child], blocks[child]
    assert (
        "no stacks: py-spy is not installed; no stacks on a signal either: "
        "it registered no stack handler" in blocks[bystander]
    ), blocks[bystander]
    assert _state(bystander) != "Z" and Path(f"/proc/{bystander}").exists()
    # Asked again, each answers again with only the new dump.
    again = forensics.signalled_stacks(leader, handlers)
    assert again[0] and again[1].count("engine_deadlocked_on_its_lock") == 1


def test_a_stopped_process_does_not_answer_and_a_reused_pid_is_not_signalled(
    hung_group,
):
    *_, child, bystander, handlers = hung_group
    os.kill(child, signal.SIGSTOP)
    answered, why = forensics.signalled_stacks(child, handlers, wait=1)
    assert not answered and "did not answer SIGUSR2 within 1 s" in why, why
    # A file another process of the same pid left (another start time).
    (handlers / f"{bystander}-1.txt").write_bytes(b"")
    answered, why = forensics.signalled_stacks(bystander, handlers, wait=1)
    assert not answered and "registered no stack handler" in why
    assert _state(bystander) in "SR", _state(bystander)


def test_the_stack_handler_registers_nothing_outside_the_container(tmp_path):
    absent = tmp_path / "no-run-dir"
    code = (
        "import faulthandler, signal\n"
        "from k3rocm.plugin import stack_handler\n"
        "stack_handler.register()\n"
        "print(faulthandler.unregister(signal.SIGUSR2))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "K3_RUN_DIR": str(absent)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "False" and not absent.exists()
