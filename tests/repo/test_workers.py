"""What lets two test workers share one machine (tests/support/workers.py,
./scripts/test): a lock the other worker waits on, ports no other worker is
given, and the order the files start in."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from support.vllm_trees import REPO
from support.workers import free_port, start_order, worker_lock, worker_ports

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
