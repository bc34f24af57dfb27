# This wing's tests run vLLM: the patched tree, kernels interpreted.
import subprocess
import sys

import pytest
import support.vllm_session  # noqa: F401
from support.vllm_trees import ON_DEFAULT_LINE, REPO, SERIES


@pytest.fixture(scope="module")
def bundle():
    """.gpu/ as gpu_bundle.py makes it from this line's trees (the default
    line's replaces .gpu/ whole; another line's is .gpu/line-<version>)."""
    subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_bundle.py")],
        check=True,
        cwd=REPO,
    )
    gpu = REPO / ".gpu"
    return gpu if ON_DEFAULT_LINE else gpu / f"line-{SERIES.vllm_version}"
