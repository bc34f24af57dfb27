#!/usr/bin/env bash
# The runs docs/benchmarks-log.md reports up to series k3.6 (k3.7's:
# gpu_k37.sh), in one call on the lent GPU, from
# the repository root with .gpu/ carried (made here by gpu_bundle.py):
#
#     bash benchmarks/gpu_run.sh     # results under $OUT (default /tmp/k3-gpu)
#
# $OUT/all.json gathers the machine, the versions and every script's JSON.
set -uo pipefail
export OUT=${OUT:-/tmp/k3-gpu} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
cd benchmarks
status=0
run() {
    local name=$1
    shift
    local start=$SECONDS
    echo "== $name"
    "$@" || { echo "!! $name exited $?"; status=1; }
    echo "== $name: $((SECONDS - start)) s"
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
nproc
run check python3 gpu_check.py >"$OUT/check.out"
cat "$OUT/check.out"
run compiles python3 gpu_compiles.py
run bench python3 gpu_bench.py
run kda_launch python3 gpu_kda_launch.py
run ablation python3 gpu_ablation.py
run smoke python3 -c "
from kda_harness import load_tree; load_tree('patched')
from k3rocm import smoke
from vllm.models.kimi_k3.amd.kda_metadata import prepare_chunk_metadata_device as build
from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices
print(smoke.compare_with_reference(build, 'cuda'))
print(smoke.sync_check(build, lambda cu, _c: prepare_chunk_indices(cu, smoke.CHUNK_SIZE)))"
python3 - <<'PY'
import json, os, platform, subprocess
from pathlib import Path

out = Path(os.environ["OUT"])
import numpy, torch, triton

def load(name):
    path = out / name
    return json.loads(path.read_text()) if path.is_file() else None

check = (out / "check.out").read_text() if (out / "check.out").is_file() else ""
gpu = subprocess.run(
    ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
    capture_output=True, text=True,
).stdout.strip()
report = {
    "machine": {"gpu": gpu, "cpus": os.cpu_count(), "python": platform.python_version(),
                "torch": torch.__version__, "triton": triton.__version__,
                "numpy": numpy.__version__},
    "command": "bash benchmarks/gpu_run.sh",
    "gpu_check": json.loads(check[check.index("{"):check.rindex("}") + 1]) if "{" in check else check,
    "gpu_compiles": load("compiles.json"),
    "gpu_bench": load("bench.json"),
    "gpu_ablation": load("ablation.json"),
    "gpu_kda_launch": load("kda_launch.json"),
}
(out / "all.json").write_text(json.dumps(report, indent=1))
(out / "pristine_kda.pt").unlink(missing_ok=True)
PY
exit $status
