"""The all scenario's report (bash benchmarks/gpu_run.sh all): the machine,
the versions and every script's JSON in one file, OUT/all.json.

    python3 gpu_report.py OUT
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy
import torch
import triton


def load(out: Path, name: str):
    path = out / name
    return json.loads(path.read_text()) if path.is_file() else None


def gpu_check(out: Path):
    """gpu_check.py's printed JSON (its report), else what it printed."""
    path = out / "check.out"
    text = path.read_text() if path.is_file() else ""
    if "{" not in text:
        return text
    return json.loads(text[text.index("{") : text.rindex("}") + 1])


def main(out: Path) -> None:
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    report = {
        "machine": {
            "gpu": gpu,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "numpy": numpy.__version__,
        },
        "command": "bash benchmarks/gpu_run.sh all",
        "gpu_check": gpu_check(out),
        "gpu_compiles": load(out, "compiles.json"),
        "gpu_bench": load(out, "bench.json"),
        "gpu_ablation": load(out, "ablation.json"),
        "gpu_kda_launch": load(out, "kda_launch.json"),
    }
    (out / "all.json").write_text(json.dumps(report, indent=1))
    (out / "pristine_kda.pt").unlink(missing_ok=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
