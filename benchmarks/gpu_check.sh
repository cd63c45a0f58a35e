#!/usr/bin/env bash
# The GPU check, for the device machine (nvidia-h200 image: python3 with torch,
# CuPy, cuda-core, cuda-bindings, nvidia-cudnn-cu13, Cython, pytest, hypothesis).
#   bash benchmarks/gpu_check.sh            # results under $OUT (default /tmp/qkern-gpu-check)
# Wheels missing there (nvidia-cudnn-frontend) may be carried in .whl/ (see
# docs/qconv2d.rst, "The GPU check").  Builds qkern in place, then runs
# benchmarks/gpu_check.py; exits 2 with a message where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/qkern-site .whl/*.whl
  export PYTHONPATH=/tmp/qkern-site${PYTHONPATH:+:$PYTHONPATH}
fi
start=$(date +%s)
$PY setup.py -q build_clib build_ext --inplace >/tmp/qkern-build.log 2>&1 || { tail -40 /tmp/qkern-build.log; exit 1; }
echo "gpu_check.sh: built qkern in $(( $(date +%s) - start )) s"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
exec $PY benchmarks/gpu_check.py --out "${OUT:-/tmp/qkern-gpu-check}" "$@"
