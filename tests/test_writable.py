"""The start-up check of what must be writable (k3rocm.container.writable), on real
mounts: a read-only one and a noexec one, as `docker run --read-only` and
Docker's default --tmpfs make them."""

from __future__ import annotations

from pathlib import Path

import pytest
from mounts import mounted

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
