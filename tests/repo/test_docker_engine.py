"""scripts/docker-engine's contract with scripts/test: `start` prints
`started` only when it started dockerd (and `stop` then stops that one), and
`existing` when an engine already answered (which `stop` leaves alone: it
may be another run's). Run with stand-ins for `docker` and `dockerd` on
PATH, since a second real engine cannot start beside the suite's."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "docker-engine"

# Stand-in dockerd: marks itself up and runs until killed.
DOCKERD = """#!/usr/bin/env bash
echo $$ > "$K3_STANDIN_UP"
trap 'rm -f "$K3_STANDIN_UP"; exit 0' TERM
while :; do sleep 0.1; done
"""
# Stand-in docker: `docker info` answers while an engine is up.
DOCKER = """#!/usr/bin/env bash
[ "$1" = info ] && [ -f "$K3_STANDIN_UP" ]
"""


def engine(tmp_path: Path, command: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    if not bin_dir.is_dir():
        bin_dir.mkdir()
        for name, text in (("dockerd", DOCKERD), ("docker", DOCKER)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "K3_DOCKER_ROOT": str(tmp_path / "state"),
        "K3_STANDIN_UP": str(tmp_path / "up"),
    }
    return subprocess.run(
        ["bash", str(SCRIPT), command],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_engine_it_started_is_said_and_stopped(tmp_path):
    started = engine(tmp_path, "start")
    assert started.returncode == 0, started.stderr
    assert started.stdout == "started\n"
    assert "started dockerd" in started.stderr
    pid = int((tmp_path / "up").read_text())
    assert alive(pid)
    stopped = engine(tmp_path, "stop")
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)
    assert not (tmp_path / "state" / "dockerd.pid").exists()


def test_an_engine_that_answered_is_said_and_left_running(tmp_path):
    other = subprocess.Popen(["sleep", "60"])  # another run's engine
    try:
        (tmp_path / "up").write_text(str(other.pid))
        started = engine(tmp_path, "start")
        assert started.returncode == 0, started.stderr
        assert started.stdout == "existing\n"
        assert engine(tmp_path, "stop").returncode == 0
        assert other.poll() is None, "stop stopped an engine it did not start"
    finally:
        other.kill()
        other.wait()
