#!/usr/bin/env bash
# The AMX check, for a machine whose CPU and OS offer AMX-BF16 (the only
# place the AMX kernels run natively):
#   bash benchmarks/amx_check.sh       # output under $OUT (default /tmp/qkern-amx-check)
# Records the CPU's AMX flags, builds qkern in place, runs the WoQ tests
# (every AMX kernel natively, int8 and int4, against the bound, every
# blocking and thread count; the tuner) and times the static choice of int8
# and int4 against the same calls capped at AVX-512-BF16 (QKERN_ISA),
# weights cold, so that the M from which the tile kernels win shows side by
# side; the timings run whatever the tests gave, and the script exits with
# the tests' status.  Wheels missing there (numpy, ml_dtypes, pytest,
# hypothesis, simde-py) may be carried in .whl/.  Exits 2 with a message
# where the CPU, the OS or the compiler gives no AMX kernel, before the
# tests.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/qkern-amx-check}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/qkern-site .whl/*.whl
  export PYTHONPATH=/tmp/qkern-site${PYTHONPATH:+:$PYTHONPATH}
fi
{ grep -m1 "model name" /proc/cpuinfo; grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u || true; } |
  tee "$OUT/cpu.txt"
start=$(date +%s)
$PY setup.py -q build_clib build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "amx_check.sh: built qkern in $(( $(date +%s) - start )) s"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$PY -c "import qkern"
$PY -c "import qkern, sys; sys.exit(0 if any(k.isa == 'amx' and k.available for k in qkern.kernels()) else 2)" || {
  echo "amx_check.sh: no AMX kernel may run here (CPU, OS or compiler); nothing run"; exit 2; }
$PY -m qkern info | tee "$OUT/info.txt"
# the tests: the AMX kernels against the bound, all blockings and threads,
# and the vdpbf16ps kernels against the model of their order
tests=0
$PY -m pytest -q -p no:cacheprovider -rs tests/woq/test_kernels.py tests/woq/test_int4.py \
  tests/woq/test_dispatch.py tests/woq/test_tuning.py tests/woq/test_emulated.py \
  >"$OUT/tests.txt" 2>&1 || tests=$?
tail -5 "$OUT/tests.txt"
for isa in amx avx512_bf16; do
  echo "=== QKERN_ISA=$isa"
  QKERN_ISA=$isa $PY benchmarks/woq_minof.py 4096:4096:1,9,32,33,128,512 11008:4096:128 \
    --weights int8,int4 --dtypes bfloat16,float32 --threads 1,2 --copies 4 --reps 8 |
    tee "$OUT/minof-$isa.txt"
done
exit $tests
