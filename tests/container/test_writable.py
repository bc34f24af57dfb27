"""The start-up check of what must be writable (k3rocm.container.writable), on real
mounts: a read-only one and a noexec one, as `docker run --read-only` and
Docker's default --tmpfs make them, and a root-owned one checked by a process
running as uid 1000, as the container's user k3 is."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.mounts import mounted

from k3rocm.container import writable


def environ(tmp_path: Path, **changes: str) -> dict[str, str]:
    base = {
        "HOME": str(tmp_path / "home"),
        "TMPDIR": str(tmp_path / "tmp"),
        "K3_RUN_DIR": str(tmp_path / "run"),
        "K3_FORENSICS_DIR": str(tmp_path / "cache" / "forensics"),
        "TRITON_CACHE_DIR": str(tmp_path / "cache" / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "torchinductor"),
        "NUMBA_CACHE_DIR": str(tmp_path / "cache" / "numba"),
        "AITER_JIT_DIR": str(tmp_path / "cache" / "aiter"),
        "HF_HOME": str(tmp_path / "cache" / "huggingface"),
    }
    return {**base, **changes}


def test_everything_writable_is_no_problem(tmp_path):
    assert writable.problems(environ(tmp_path)) == []


def test_a_read_only_run_directory_is_named_with_its_setting(tmp_path):
    with mounted(tmp_path / "ro", "ro") as read_only:
        found = writable.problems(environ(tmp_path, K3_RUN_DIR=str(read_only / "run")))
    assert len(found) == 1
    assert found[0].startswith(
        f"the run directory at {read_only / 'run'} (K3_RUN_DIR) "
    )
    assert "is not writable" in found[0] and "mount a volume or tmpfs there" in found[0]


@pytest.mark.parametrize("variable", ["TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"])
def test_a_compile_cache_on_noexec_is_refused(tmp_path, variable):
    with mounted(tmp_path / "noexec", "noexec") as noexec:
        found = writable.problems(environ(tmp_path, **{variable: str(noexec / "c")}))
    assert len(found) == 1 and f"({variable})" in found[0]
    assert "mounted noexec" in found[0]


def test_no_writable_place_at_all_is_named_not_raised(tmp_path):
    """--read-only with no mount: even the temporary directory is refused,
    in a line, not by tempfile's exception."""
    with mounted(tmp_path / "ro", "ro") as read_only:
        found = writable.problems(
            {"HOME": str(read_only / "home"), "TMPDIR": str(read_only / "tmp")}
        )
    assert any(line.startswith("temporary files at ") for line in found), found


def test_noexec_is_fine_where_nothing_is_loaded(tmp_path):
    """Docker's default --tmpfs for /tmp and the run directory is noexec."""
    with mounted(tmp_path / "noexec", "noexec") as noexec:
        found = writable.problems(
            environ(tmp_path, TMPDIR=str(noexec / "tmp"), K3_RUN_DIR=str(noexec / "r"))
        )
    assert found == []


# The container's user (docker/Dockerfile: k3, uid 1000).
K3_UID = 1000
# Imports first (the interpreter's own files may not be readable by uid
# 1000), then the check as that user with no capabilities, as in the image.
AS_K3 = f"""
import json, os, sys
from k3rocm.container import writable
os.setgroups([])
os.setgid({K3_UID})
os.setuid({K3_UID})
print(json.dumps(writable.problems(json.loads(sys.argv[1]))))
"""


@pytest.fixture
def reachable_dir():
    """A directory uid 1000 can reach (pytest's tmp_path is root's, 0700)."""
    top = Path(tempfile.mkdtemp(prefix="k3rocm-writable-", dir="/tmp"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top)


def test_a_root_owned_cache_tmpfs_is_named_by_owner_not_as_a_missing_mount(
    reachable_dir,
):
    """The k3-cache place as a tmpfs mounted without uid= (root's, 0755) and a
    directory of k3's own without write permission, checked as uid 1000:
    each line says who owns what is in the way and what to change."""
    home = reachable_dir / "home"
    for own in (home, reachable_dir / "tmp", reachable_dir / "run"):
        own.mkdir()
        os.chown(own, K3_UID, K3_UID)
    locked = home / "locked"
    locked.mkdir(mode=0o555)
    os.chown(locked, K3_UID, K3_UID)
    with mounted(home / ".cache", "mode=0755") as cache:
        checked = subprocess.run(
            [sys.executable, "-c", AS_K3, json.dumps({
                "HOME": str(home),
                "TMPDIR": str(reachable_dir / "tmp"),
                "K3_RUN_DIR": str(reachable_dir / "run"),
                "K3_FORENSICS_DIR": str(cache / "k3rocm" / "forensics"),
                "TRITON_CACHE_DIR": str(locked / "triton"),
            })],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    found = json.loads(checked.stdout)
    assert [line.split(" (")[1].split(")")[0] for line in found] == [
        "TRITON_CACHE_DIR",
        "VLLM_CACHE_ROOT",
        "HF_HOME",
        "K3_FORENSICS_DIR",
    ], found
    triton, *in_cache = found
    assert triton == (
        f"Triton's kernel cache at {locked / 'triton'} (TRITON_CACHE_DIR) is not "
        f"writable (Permission denied); {locked} is owned by this process's uid "
        f"{K3_UID} but its mode 0555 does not let it write there; chmod u+rwx it, "
        "or set TRITON_CACHE_DIR to a writable place"
    )
    for line in in_cache:
        assert (
            f"is not writable (Permission denied); {cache} is owned by uid 0 (mode "
            f"0755) and this process runs as uid {K3_UID}; chown it to uid "
            f"{K3_UID} (a tmpfs: mount it with uid={K3_UID},gid={K3_UID}, or "
            "mode=1777), or set "
        ) in line
        assert "mount a volume or tmpfs there" not in line
