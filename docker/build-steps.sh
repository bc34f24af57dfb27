#!/usr/bin/env bash
# The steps of docker/Dockerfile, one per RUN, kept here so the tests run the
# very same commands without a Docker engine.
#   build-steps.sh install   pinned, hash-checked tools + the k3rocm wheel
#   build-steps.sh patch     assert the base (vLLM, ROCm), apply the series
#   build-steps.sh finish    versions file, runtime user and directories
# Inputs (build arguments in the Dockerfile): K3_WHEELS (dir), ROCM_VERSION,
# K3_SERIES_ID, K3_UID. K3_PYTHON picks the interpreter, K3_ROCM_ROOT the ROCm
# install; K3_ROOT is a prefix for the files `finish` writes (empty in the
# image).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${K3_PYTHON:-python3}
rocm_root=${K3_ROCM_ROOT:-/opt/rocm}
root=${K3_ROOT:-}

install() {
  "$python" -m pip install --no-cache-dir --require-hashes --no-deps \
    -r "$here/requirements.txt"
  # Our own wheel, built from this checkout by scripts/build-image.
  "$python" -m pip install --no-cache-dir --no-deps "${K3_WHEELS:?}"/k3rocm-*.whl
}

patch() {
  "$python" -m k3rocm.image verify-base --rocm-version "${ROCM_VERSION:?}" \
    --rocm-root "$rocm_root"
  "$python" -m k3rocm.image patch --series-id "${K3_SERIES_ID:?}"
  "$python" -m k3rocm.patchset status
}

finish() {
  "$python" -m k3rocm.image versions --rocm-root "$rocm_root" \
    --out "$root/etc/k3rocm/versions.json"
  # The GPU device nodes belong to video and render; the base image may lack
  # a render group (its GID is the host's anyway: compose adds it by number).
  local group
  for group in video render; do
    grep -q "^$group:" "$root/etc/group" \
      || groupadd ${root:+--prefix "$root"} --system "$group"
  done
  useradd ${root:+--prefix "$root"} --uid "${K3_UID:?}" --create-home \
    --groups video,render --shell /bin/bash k3
  mkdir -p "$root/run/k3rocm" "$root/home/k3/.cache"
  chown -R "$K3_UID" "$root/run/k3rocm" "$root/home/k3/.cache"
}

case ${1:-} in
  install | patch | finish) "$1" ;;
  *)
    echo "usage: $0 {install|patch|finish}" >&2
    exit 2
    ;;
esac
