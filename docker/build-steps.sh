#!/usr/bin/env bash
# The steps of docker/Dockerfile, one per RUN, kept here so the tests run the
# very same commands without a Docker engine.
#   build-steps.sh wheel     build the k3rocm wheel from the checkout (builder stage)
#   build-steps.sh install   pinned, hash-checked tools + the k3rocm wheel
#   build-steps.sh patch     assert the base (vLLM, ROCm), apply the series
#   build-steps.sh finish    versions file, SBOM, runtime user and directories
# Inputs (build arguments in the Dockerfile): K3_SOURCE_DIR (checkout, wheel),
# K3_DIST (where the wheel goes / comes from), K3_WHEELHOUSE (offline wheels;
# PyPI when it holds none), ROCM_VERSION, K3_SERIES_ID, K3_UID. K3_PYTHON
# picks the interpreter, K3_ROCM_ROOT the ROCm install; K3_ROOT is a prefix
# for the files `finish` writes (empty in the image).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${K3_PYTHON:-python3}
rocm_root=${K3_ROCM_ROOT:-/opt/rocm}
root=${K3_ROOT:-}
# pip refuses system-wide installs into a Python marked externally managed
# (PEP 668, e.g. Debian's); the image owns its Python, so install anyway.
# Older pips ignore the variable.
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# Offline from the wheelhouse when it holds wheels, else from PyPI; pinned
# with hashes either way.
pip_sources() {
  local wheelhouse=${K3_WHEELHOUSE:-}
  if [ -n "$wheelhouse" ] && compgen -G "$wheelhouse/*.whl" >/dev/null; then
    echo "--no-index --find-links $wheelhouse"
  fi
}

wheel() {
  local backend
  backend=$(mktemp -d)
  # shellcheck disable=SC2046  # word splitting of the source options is wanted
  "$python" -m pip install --quiet --require-hashes --no-deps $(pip_sources) \
    --target "$backend" -r "$here/build-requirements.txt"
  # shellcheck disable=SC2046
  PYTHONPATH=$backend "$python" -m pip wheel --quiet --no-deps \
    --no-build-isolation --no-index --wheel-dir "${K3_DIST:?}" "${K3_SOURCE_DIR:?}"
  rm -rf "$backend"
  ls "$K3_DIST"/k3rocm-*.whl
}

install() {
  # shellcheck disable=SC2046
  "$python" -m pip install --require-hashes --no-deps $(pip_sources) \
    -r "$here/requirements.txt"
  # Our own wheel, built by the `wheel` step from this checkout.
  "$python" -m pip install --no-deps --no-index "${K3_DIST:?}"/k3rocm-*.whl
  # py-spy reads vLLM's processes on a stall; where Yama restricts ptrace
  # (Ubuntu hosts) that takes CAP_SYS_PTRACE, which a non-root user only gets
  # from a file capability (and the container's cap_add: SYS_PTRACE).
  "$python" -m k3rocm.container.forensics grant-ptrace
}

patch() {
  "$python" -m k3rocm.supply_chain.image verify-base --rocm-version "${ROCM_VERSION:?}" \
    --rocm-root "$rocm_root"
  "$python" -m k3rocm.supply_chain.image patch --series-id "${K3_SERIES_ID:-}"
  "$python" -m k3rocm.patchtool.patchset status
}

finish() {
  "$python" -m k3rocm.supply_chain.image versions --rocm-root "$rocm_root" \
    --out "$root/etc/k3rocm/versions.json"
  # What the image holds, for scanners: Python and OS packages, and the
  # patched vLLM's pedigree (the series' patches).
  "$python" -m k3rocm.supply_chain.sbom --out "$root/etc/k3rocm/sbom.cdx.json" \
    --require "$here/requirements.txt"
  # The GPU device nodes belong to video and render; the base image may lack
  # a render group (its GID is the host's anyway: compose adds it by number).
  local group
  for group in video render; do
    grep -q "^$group:" "$root/etc/group" \
      || groupadd ${root:+--prefix "$root"} --system "$group"
  done
  useradd ${root:+--prefix "$root"} --uid "${K3_UID:?}" --create-home \
    --groups video,render --shell /bin/bash k3
  # The compile caches (Triton, AITER JIT) and Hugging Face live under
  # ~/.cache, the volume that survives a recreated container.
  # The run directory's default lives in k3rocm.common.setting_table.
  local run_dir
  run_dir=$("$python" -c 'from k3rocm.common.run_files import run_dir; print(run_dir({}))')
  mkdir -p "$root$run_dir" "$root/home/k3/.cache/triton" "$root/home/k3/.cache/aiter"
  chown -R "$K3_UID" "$root$run_dir" "$root/home/k3"
}

case ${1:-} in
  wheel | install | patch | finish) "$1" ;;
  *)
    echo "usage: $0 {wheel|install|patch|finish}" >&2
    exit 2
    ;;
esac
