#!/usr/bin/env bash
# Issue 28 item 5 on the lent GPU (series k3.7), from the repository root with
# .gpu/ carried (gpu_bundle.py); results under $OUT (default /tmp/k3-gpu):
#
#     bash benchmarks/gpu_k37.sh peel        # call 1: gpu_peel.py alone (host
#                                            # timings want a quiet machine)
#     bash benchmarks/gpu_k37.sh reference   # call 2: gpu_reference.py, with the
#                                            # smoke check's cold compile beside
#                                            # it, then its warm-cache timings;
#                                            # K3_PER_CALL=1: then gpu_peel.py's
#                                            # per-call times (K3_PEEL_ONLY)
#     bash benchmarks/gpu_k37.sh heads       # issue 38 item 3 (and issue 37's
#                                            # spec run): gpu_reference.py at 6,
#                                            # 12 and 96 heads side by side
#                                            # (correctness only), then gpu_peel.py
#                                            # at 12 heads on a quiet machine with
#                                            # 0.27.1's layer as the step model's
#                                            # other side, then gpu_spec.py where
#                                            # it exists; each under a time limit
set -uo pipefail
export OUT=${OUT:-/tmp/k3-gpu} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
cd benchmarks || exit 2
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv,noheader
nproc
status=0
start=$SECONDS
case ${1:-} in
peel)
  python3 gpu_peel.py || { echo "!! peel exited $?"; status=1; }
  echo "== peel: $((SECONDS - start)) s"
  ;;
reference)
  # The smoke check's own Triton cache, empty: its first run is a cold start.
  smoke_cache=$(mktemp -d)
  TRITON_CACHE_DIR=$smoke_cache python3 gpu_smoke_time.py cold &
  cold=$!
  python3 gpu_reference.py || { echo "!! reference exited $?"; status=1; }
  echo "== reference: $((SECONDS - start)) s"
  wait "$cold" || { echo "!! smoke cold exited $?"; status=1; }
  for mode in warm-uncached "warm 1"; do
    # shellcheck disable=SC2086  # "warm 1": mode and label
    TRITON_CACHE_DIR=$smoke_cache python3 gpu_smoke_time.py $mode ||
      { echo "!! smoke $mode exited $?"; status=1; }
  done
  TRITON_CACHE_DIR=$smoke_cache K3_SMOKE_PROFILE=1 python3 gpu_smoke_time.py warm profile ||
    { echo "!! smoke profile exited $?"; status=1; }
  if [ -n "${K3_PER_CALL:-}" ]; then
    # Host time per layer call again, on a quiet machine (the kernels are in
    # Triton's cache by now).
    K3_PEEL_ONLY=per_call python3 gpu_peel.py || { echo "!! per-call exited $?"; status=1; }
  fi
  echo "== all: $((SECONDS - start)) s"
  ;;
heads)
  for heads in 6 12 96; do
    mkdir -p "$OUT/heads-$heads"
    K3_HEADS=$heads OUT=$OUT/heads-$heads K3_REF_SECONDS=${K3_REF_SECONDS:-30} \
      timeout "${K3_REF_LIMIT:-180}" python3 gpu_reference.py >"/tmp/reference-$heads.log" 2>&1 &
  done
  for job in $(jobs -p); do
    wait "$job" || { echo "!! a reference run exited $?"; status=1; }
  done
  for heads in 6 12 96; do
    echo "== reference at $heads heads"
    tail -n 40 "/tmp/reference-$heads.log"  # here: $OUT keeps 8 files at most
  done
  echo "== references: $((SECONDS - start)) s"
  K3_PEEL_BEFORE=0.27.1 timeout "${K3_PEEL_LIMIT:-260}" python3 gpu_peel.py ||
    { echo "!! peel exited $?"; status=1; }
  echo "== peel: $((SECONDS - start)) s"
  if [ -f gpu_spec.py ]; then
    timeout "${K3_SPEC_LIMIT:-150}" python3 gpu_spec.py || { echo "!! spec exited $?"; status=1; }
    echo "== spec: $((SECONDS - start)) s"
  fi
  ;;
*)
  echo "usage: gpu_k37.sh peel|reference|heads" >&2
  exit 2
  ;;
esac
exit $status
