"""What lets two test workers share one machine (tests/support/workers.py,
./scripts/test): a lock the other worker waits on, ports no other worker is
given, the order the files start in, and the files one worker runs
together."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from support.vllm_trees import REPO
from support.workers import (
    RUN_TOGETHER,
    free_port,
    start_order,
    together,
    worker_lock,
    worker_ports,
)

HOLD = """
import sys
sys.path.insert(0, sys.argv[1])
from support.workers import worker_lock
with worker_lock(sys.argv[2]):
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_lock_another_worker_holds_is_waited_for(tmp_path):
    name = f"test-{os.getpid()}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(REPO / "tests"), name],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline() == "held\n"
    got = threading.Event()

    def take():
        with worker_lock(name):
            got.set()

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    assert not got.wait(2), "took a lock the other worker holds"
    holder.stdin.close()  # the holder leaves its block and exits
    holder.wait(30)
    assert got.wait(30), "the lock was not released with its holder"
    # The same worker takes a lock it holds again (a build inside a build).
    with worker_lock(name), worker_lock(name):
        pass


def test_each_worker_has_ports_of_its_own_that_bind_0_never_hands_out():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first, second = set(worker_ports(0)), set(worker_ports(1))
    assert not first & second
    assert max(first | second) < low, "bind(0) may hand a worker's port to anyone"
    given = [free_port() for _ in range(5)]
    assert len(set(given)) == 5 and set(given) <= set(worker_ports())
    for port in given:  # free: this process can listen on each
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


@dataclass(frozen=True, eq=False)
class Item:
    path: str
    marks: tuple[str, ...] = field(default=())

    def get_closest_marker(self, name: str):
        return name if name in self.marks else None


def test_the_first_container_file_starts_beside_the_server_files():
    items = [
        Item("quick.py"),
        Item("server.py", ("server",)),
        Item("image.py"),  # a unit test before the file's container tests
        Item("image.py", ("docker",)),
        Item("server.py", ("server",)),
        Item("compose.py", ("docker",)),
        Item("quick.py"),
        Item("other_quick.py"),
    ]
    keys = start_order(items)
    ordered = sorted(items, key=keys.__getitem__)
    assert [item.path for item in ordered] == [
        "image.py", "image.py", "server.py", "server.py", "compose.py",
        "quick.py", "quick.py", "other_quick.py",
    ]  # fmt: skip
    # Within a file, the order it was written in.
    assert ordered[0].marks == () and ordered[1].marks == ("docker",)


SCRATCH_CONFTEST = """
import sys
sys.path.insert(0, {support!r})
from support.workers import TogetherScheduling

def pytest_xdist_make_scheduler(config, log):
    return TogetherScheduling(config, log) if {grouped} else None
"""
SCRATCH_TEST = """
import os
from pathlib import Path

def test_where():
    Path({record!r}).write_text(os.environ["PYTEST_XDIST_WORKER"])
"""


def workers_of_files(tmp_path: Path, grouped: bool) -> dict[str, str]:
    """Run a scratch project of RUN_TOGETHER's files (first) and four
    others on two real pytest-xdist workers: the worker each file ran on."""
    project = tmp_path / f"grouped-{grouped}"
    files = [*RUN_TOGETHER, *(f"tests/test_other_{i}.py" for i in range(4))]
    for path in files:
        record = project / "ran-on" / path.replace("/", "-")
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(SCRATCH_TEST.format(record=str(record)))
    (project / "ran-on").mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "conftest.py").write_text(
        SCRATCH_CONFTEST.format(support=str(REPO / "tests"), grouped=grouped)
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadfile", "--no-loadscope-reorder", *files],
        cwd=project, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return {
        path: (project / "ran-on" / path.replace("/", "-")).read_text()
        for path in files
    }


def test_the_files_that_share_the_pushed_image_run_on_one_worker(tmp_path):
    for path in RUN_TOGETHER:  # the files exist and do use the image
        assert "pushed_image" in (REPO / path).read_text(), path
    assert len({together(path) for path in RUN_TOGETHER}) == 1
    ran_on = workers_of_files(tmp_path, grouped=True)
    assert len({ran_on[path] for path in RUN_TOGETHER}) == 1, ran_on
    # Plain loadfile hands the first two files to different workers: one
    # worker for both is the scheduler's doing, not the order's.
    ran_on = workers_of_files(tmp_path, grouped=False)
    assert len({ran_on[path] for path in RUN_TOGETHER}) == 2, ran_on
