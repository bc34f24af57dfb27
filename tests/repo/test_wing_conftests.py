"""Each wing's conftest.py says whether its tests run vLLM (support.vllm_session);
the root conftest sets up nothing of vLLM, so the shared floor's tests
(tests/common) run, and pass, in a Python where `import vllm` fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.without_vllm import WITHOUT_VLLM

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def test_the_common_wing_passes_without_vllm():
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_VLLM, "pytest", "tests/common", "-q",
         "-p", "no:cacheprovider"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-500:]


def test_every_other_wing_says_it_runs_vllm():
    """A wing without the session would import the installed, unpatched vLLM
    instead of the series' tree: every wing but common declares it."""
    wings = {path.parent.name for path in TESTS.glob("*/test_*.py")}
    declaring = {
        path.parent.name
        for path in TESTS.glob("*/conftest.py")
        if "import support.vllm_session" in path.read_text()
    }
    assert declaring == wings - {"common"}
