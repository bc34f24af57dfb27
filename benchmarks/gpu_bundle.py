"""Gather what the GPU harness runs on the lent machine into .gpu/ (ignored
by git, carried to the device): the vLLM 0.27.1 kernel files as the series
patched them, the same files unpatched, upstream's metadata kernel from
the vLLM 0.28.0 wheel (for comparison only; never committed), and series
k3.6's launch module beside the patched one (gpu_peel.py times its
recurrent launch against this revision's in one process).

    .venv/bin/python benchmarks/gpu_bundle.py
    .venv-0.32.0/bin/python benchmarks/gpu_bundle.py   # then: .gpu/line-0.32.0/

Run in another release line's environment it bundles that line into
.gpu/line-<version>/ (the scripts read it with K3_LINE=<version>): its
patched and pristine kernel files, and as "upstream" that release's own
metadata builder module. Bundle the default line first: it replaces .gpu/.
"""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.vllm_trees import (  # noqa: E402
    SERIES,
    UPSTREAM_TREE,
    installed_root,
    patched_tree,
)

from k3rocm.patchtool.lines import default_line_dir  # noqa: E402

DEFAULT_LINE = SERIES.directory == default_line_dir()
BUNDLE = REPO / ".gpu" / ("" if DEFAULT_LINE else f"line-{SERIES.vllm_version}")
KERNEL_FILES = [
    "vllm/utils/math_utils.py",
    *(
        f"vllm/third_party/flash_linear_attention/ops/{name}.py"
        for name in ("utils", "op", "index", "l2norm", "cumsum", "chunk_delta_h")
    ),
    *(
        f"vllm/models/kimi_k3/amd/ops/third_party/kda/{name}.py"
        for name in (
            "__init__",
            "chunk",
            "chunk_intra",
            "chunk_intra_token_parallel",
            "fused_recurrent",
        )
    ),
]
SERIES_MODULE = "vllm/models/kimi_k3/amd/kda_metadata.py"
SERIES_MODULES = [
    SERIES_MODULE,
    "vllm/models/kimi_k3/amd/kda_metadata_launch.py",
    "vllm/models/kimi_k3/amd/kda_metadata_kernel.py",
    # The launches of patch 0005: the module the series imports and the
    # modules it re-exports from.
    *(
        f"vllm/models/kimi_k3/amd/ops/third_party/kda/{name}.py"
        for name in (
            "kda_chunk_launch",
            "kda_direct_launch",
            "kda_chunk_forward",
            "kda_chunk_plans",
            "kda_recurrent_plans",
            "kda_launch_entry",
            "kda_launch_warm_up",
        )
    ),
    # Read, not imported (no vLLM there): gpu_kda_launch.py compiles the
    # layer's split_projection from it for its stand-in layers.
    "vllm/model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py",
]
# Modules only another line's series adds: the 0.32.0 line's recurrent
# warm-up (gpu_recurrent_warm_up.py runs it) and direct recurrent launch
# (its patched fused_recurrent.py imports it; gpu_recurrent_launch.py).
LINE_MODULES = [
    f"vllm/models/kimi_k3/amd/{name}.py"
    for name in ("kda_recurrent_warm_up", "kda_direct_launch", "kda_recurrent_launch")
]
# The last commit before the kernel became a source file (gpu_ablation.py
# times its kernel as "previous").
PREVIOUS = "35938ce"
# Series k3.6 as released, and where its launch module goes in the bundle.
K36 = "b46b0b0"
K36_SOURCE = "src/k3rocm/kernels/kda_chunk_launch.py"
K36_MODULE = "vllm/models/kimi_k3/amd/ops/third_party/kda/kda_chunk_launch_k36.py"


def copy(src_root: Path, dest_root: Path, files: list[str]) -> None:
    for rel in files:
        if not DEFAULT_LINE and not (src_root / rel).is_file():
            continue  # another line's series has fewer modules
        (dest_root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src_root / rel, dest_root / rel)
    # An empty package root of our own, so an installed vLLM elsewhere on
    # sys.path cannot shadow the bundle (vLLM's own __init__ imports too much).
    (dest_root / "vllm" / "__init__.py").write_text("")


def git_show(commit: str, path: str) -> str | None:
    shown = subprocess.run(
        ["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True, text=True
    )
    return None if shown.returncode else shown.stdout


def save_previous_kernel() -> None:
    """The kernel of the last series revision before it became a source file
    (for gpu_ablation.py), cut out of that revision's patch 0002 if this
    checkout's git history has it."""
    shown = git_show(PREVIOUS, "patches/0002-kimi-k3-rocm-kda-backend.patch")
    if shown is None:
        return
    body = shown.split("\n@@ -0,0 ", 1)[1].split("\n", 1)[1]
    code = "".join(line[1:] + "\n" for line in body.splitlines())
    (BUNDLE / "previous_kda_metadata.py").write_text(code)


def main() -> None:
    shutil.rmtree(BUNDLE, ignore_errors=True)
    line_modules = [] if DEFAULT_LINE else LINE_MODULES
    copy(
        patched_tree(),
        BUNDLE / "patched",
        [*KERNEL_FILES, *SERIES_MODULES, *line_modules],
    )
    copy(installed_root(), BUNDLE / "pristine", KERNEL_FILES)
    if not DEFAULT_LINE:
        # The release's own metadata builder module is the upstream side.
        copy(installed_root(), BUNDLE / "upstream", [SERIES_MODULE])
        print(f"bundle in {BUNDLE}")
        return
    copy(UPSTREAM_TREE, BUNDLE / "upstream", [SERIES_MODULE])
    save_previous_kernel()
    k36 = git_show(K36, K36_SOURCE)
    if k36 is not None:
        (BUNDLE / "patched" / K36_MODULE).write_text(k36)
    print(f"bundle in {BUNDLE}")


if __name__ == "__main__":
    main()
