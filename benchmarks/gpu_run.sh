#!/usr/bin/env bash
# Every GPU run of docs/benchmarks.md, by scenario, on the lent GPU from the
# repository root with .gpu/ carried (made here by gpu_bundle.py); results
# under $OUT (default /tmp/k3-gpu). A comparison with a past series revision
# reads that revision from git (gpu_bundle.py), not from a script of its own.
#
#     bash benchmarks/gpu_run.sh [all]     # the proof and the figures: gpu_check,
#                                          # compiles, bench, kda_launch, ablation,
#                                          # the metadata smoke checks; $OUT/all.json
#     bash benchmarks/gpu_run.sh reference-peel  # gpu_reference.py, then gpu_peel.py
#     bash benchmarks/gpu_run.sh peel      # gpu_peel.py alone (host timings want a
#                                          # quiet machine)
#     bash benchmarks/gpu_run.sh reference # gpu_reference.py with the smoke check's
#                                          # cold compile beside it, then its
#                                          # warm-cache timings; K3_PER_CALL=1: then
#                                          # gpu_peel.py's per-call times
#     bash benchmarks/gpu_run.sh heads     # gpu_reference.py at 6, 12 and 96 heads
#                                          # side by side (correctness only), then
#                                          # gpu_peel.py at 12 heads against 0.27.1's
#                                          # layer, then gpu_spec.py; each under a
#                                          # time limit
#     K3_LINE=0.32.0 bash benchmarks/gpu_run.sh line  # another release line's
#                                          # bundle (.gpu/line-0.32.0): the long
#                                          # steps on its own and its series'
#                                          # kernels, compiles after ready
#     bash benchmarks/gpu_run.sh warm-up   # gpu_recurrent_warm_up.py on the
#                                          # 0.32.0 line: recurrent binaries
#                                          # compiled while serving after its
#                                          # series' warm-up and after 50 calls
#     bash benchmarks/gpu_run.sh recurrent-launch  # gpu_recurrent_launch.py
#                                          # on the 0.32.0 line at 12, 6 and
#                                          # 96 heads: series k4.2's direct
#                                          # launch against 0.32.0's wrapper
#     bash benchmarks/gpu_run.sh line-layer  # gpu_line_layer.py on the
#                                          # 0.32.0 line: the KDA layer call
#                                          # and modelled step, series
#                                          # against 0.32.0's own path
#     bash benchmarks/gpu_run.sh spec-warm-up  # gpu_spec_warm_up.py on the
#                                          # default line: k3.11's spec
#                                          # warm-up, then dspark calls
#     (the per-head scenarios run 12, 6 and 96 heads, or K3_HEAD_COUNTS)
#     bash benchmarks/gpu_run.sh spec-lines  # gpu_spec.py on the 0.32.0
#                                          # line at 12, 6 and 96 heads, then
#                                          # on the default line at 12 heads
#                                          # (needs both bundles)
set -uo pipefail
export OUT=${OUT:-/tmp/k3-gpu} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
cd benchmarks || exit 2
status=0
started=$SECONDS
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

scenario_all() {
    run check python3 gpu_check.py >"$OUT/check.out"
    cat "$OUT/check.out"
    run compiles python3 gpu_compiles.py
    run bench python3 gpu_bench.py
    run kda_launch python3 gpu_kda_launch.py
    run ablation python3 gpu_ablation.py
    run smoke python3 -c "
from kda_harness import load_tree; load_tree('patched')
from k3rocm import smoke
from vllm.models.kimi_k3.amd.kda_metadata_launch import prepare_chunk_metadata_device as build
from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices
print(smoke.compare_with_reference(build, 'cuda'))
print(smoke.sync_check(build, lambda cu, _c: prepare_chunk_indices(cu, smoke.CHUNK_SIZE)))"
    python3 gpu_report.py "$OUT"
}

scenario_reference() {
    # The smoke check's own Triton cache, empty: its first run is a cold start.
    local smoke_cache cold mode
    smoke_cache=$(mktemp -d)
    TRITON_CACHE_DIR=$smoke_cache python3 gpu_smoke_time.py cold &
    cold=$!
    run reference python3 gpu_reference.py
    wait "$cold" || { echo "!! smoke cold exited $?"; status=1; }
    for mode in warm-uncached "warm 1"; do
        # shellcheck disable=SC2086  # "warm 1": mode and label
        run "smoke $mode" env TRITON_CACHE_DIR="$smoke_cache" python3 gpu_smoke_time.py $mode
    done
    run "smoke profile" env TRITON_CACHE_DIR="$smoke_cache" K3_SMOKE_PROFILE=1 \
        python3 gpu_smoke_time.py warm profile
    if [ -n "${K3_PER_CALL:-}" ]; then
        # Host time per layer call again, on a quiet machine (the kernels are
        # in Triton's cache by now).
        run per-call env K3_PEEL_ONLY=per_call python3 gpu_peel.py
    fi
}

scenario_heads() {
    local heads job
    for heads in 6 12 96; do
        mkdir -p "$OUT/heads-$heads"
        K3_HEADS=$heads OUT=$OUT/heads-$heads K3_REF_SECONDS=${K3_REF_SECONDS:-30} \
            timeout "${K3_REF_LIMIT:-180}" python3 gpu_reference.py \
            >"/tmp/reference-$heads.log" 2>&1 &
    done
    for job in $(jobs -p); do
        wait "$job" || { echo "!! a reference run exited $?"; status=1; }
    done
    for heads in 6 12 96; do
        echo "== reference at $heads heads"
        tail -n 40 "/tmp/reference-$heads.log" # here: $OUT keeps 8 files at most
    done
    run peel env K3_PEEL_BEFORE=0.27.1 timeout "${K3_PEEL_LIMIT:-260}" python3 gpu_peel.py
    run spec timeout "${K3_SPEC_LIMIT:-150}" python3 gpu_spec.py
}

scenario_line() {
    [ -n "${K3_LINE:-}" ] || { echo "line: set K3_LINE (a line's version)" >&2; exit 2; }
    run long_steps python3 gpu_long_steps.py
    run compiles python3 gpu_compiles.py
}

need_line_bundle() {
    # tests/benchmarks rebuilds .gpu for the default line alone.
    [ -d ../.gpu/line-0.32.0 ] || {
        echo "$1: no .gpu/line-0.32.0: run .venv-0.32.0/bin/python benchmarks/gpu_bundle.py" >&2
        exit 2
    }
}

scenario_warm_up() {
    need_line_bundle warm-up
    run "recurrent warm-up" env K3_LINE=0.32.0 python3 gpu_recurrent_warm_up.py
}

on_line_heads() {
    # on_line_heads LABEL DIR LIMIT SCRIPT [VAR=VALUE...]: SCRIPT on the
    # 0.32.0 line at 12, 6 and 96 heads (or K3_HEAD_COUNTS), one process
    # each, its JSON in $OUT/DIR-<heads>, each under LIMIT seconds.
    on_heads "$@" K3_LINE=0.32.0
}

on_heads() {
    # on_heads LABEL DIR LIMIT SCRIPT [VAR=VALUE...]: the same on the line
    # the variables name (the default line without K3_LINE).
    local label=$1 dir=$2 limit=$3 script=$4 heads
    shift 4
    for heads in ${K3_HEAD_COUNTS:-12 6 96}; do
        mkdir -p "$OUT/$dir-$heads"
        run "$label $heads heads" env K3_HEADS="$heads" "$@" \
            OUT="$OUT/$dir-$heads" timeout "$limit" python3 "$script"
    done
}

scenario_recurrent_launch() {
    need_line_bundle recurrent-launch
    on_line_heads "recurrent launch" launch "${K3_LAUNCH_LIMIT:-150}" \
        gpu_recurrent_launch.py
}

scenario_line_layer() {
    need_line_bundle line-layer
    on_line_heads "line layer" layer "${K3_LAYER_LIMIT:-150}" gpu_line_layer.py
}

scenario_spec_warm_up() {
    on_heads "spec warm-up" spec-warm "${K3_SPEC_LIMIT:-60}" gpu_spec_warm_up.py
}

scenario_spec_lines() {
    need_line_bundle spec-lines
    on_line_heads "spec 0.32.0" line "${K3_SPEC_LIMIT:-150}" gpu_spec.py \
        K3_SPEC_SECONDS="${K3_SPEC_SECONDS:-30}"
    mkdir -p "$OUT/default-12"
    run "spec 0.27.1 12 heads" env K3_HEADS=12 K3_SPEC_SECONDS=10 \
        K3_SPEC_COMPILE_SECONDS=5 OUT="$OUT/default-12" \
        timeout "${K3_SPEC_LIMIT:-150}" python3 gpu_spec.py >/tmp/spec-default-12.log
    tail -n 5 /tmp/spec-default-12.log
}

scenario=${1:-all}
case $scenario in
all) scenario_all ;;
reference-peel)
    run reference python3 gpu_reference.py
    run peel python3 gpu_peel.py
    ;;
peel) run peel python3 gpu_peel.py ;;
reference) scenario_reference ;;
heads) scenario_heads ;;
line) scenario_line ;;
spec-lines) scenario_spec_lines ;;
recurrent-launch) scenario_recurrent_launch ;;
warm-up) scenario_warm_up ;;
line-layer) scenario_line_layer ;;
spec-warm-up) scenario_spec_warm_up ;;
*)
    echo "usage: gpu_run.sh [all|reference-peel|peel|reference|heads|line|spec-lines|warm-up|recurrent-launch|line-layer|spec-warm-up]" >&2
    exit 2
    ;;
esac
echo "== $scenario: $((SECONDS - started)) s"
exit $status
