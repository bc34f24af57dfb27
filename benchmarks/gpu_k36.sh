#!/usr/bin/env bash
# Issue 28 on the lent GPU (series k3.6): the reference check and the peel's
# cost, from the repository root with .gpu/ carried (gpu_bundle.py):
#
#     bash benchmarks/gpu_k36.sh     # results under $OUT (default /tmp/k3-gpu)
set -uo pipefail
export OUT=${OUT:-/tmp/k3-gpu} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
cd benchmarks
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
nproc
status=0
start=$SECONDS
python3 gpu_reference.py || { echo "!! reference exited $?"; status=1; }
echo "== reference: $((SECONDS - start)) s"
start=$SECONDS
python3 gpu_peel.py || { echo "!! peel exited $?"; status=1; }
echo "== peel: $((SECONDS - start)) s"
exit $status
