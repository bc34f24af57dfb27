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
