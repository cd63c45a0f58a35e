#!/usr/bin/env bash
# The check of one ISA level's kernels on a CPU that has it, the only place
# they run natively:
#   bash benchmarks/isa_check.sh amx      # a CPU and OS with AMX-BF16
#   bash benchmarks/isa_check.sh avx512   # a CPU with AVX-512 (Zen 4/5, Xeon)
#   TUNE=1 bash benchmarks/isa_check.sh avx512   # and the tuner's runs
# Output under $OUT (default /tmp/qkern-<level>-check).  Records the CPU's
# flags of that level, builds qkern in place, runs the WoQ tests (every
# kernel of the level natively, int8 and int4, against the bound or the
# model of its order, every blocking and thread count; the tuner), then
# times, weights cold, calls alternating:
#   amx     the static choice of int8 and int4 against the same calls
#           capped at AVX-512-BF16 (QKERN_ISA; the AVX-512 FMA kernels
#           there), around the M from which the static rule takes the tile
#           kernels (qkern.dispatch.AMX_FROM_M); the functional op's
#           kernels on the unpacked weight side by side (the two AMX ones
#           and the AVX-512 GEMV, around AMX_UNPACKED_FROM_M and 8 rows),
#           and the functional op against WoqLinear at M <= 8;
#   avx512  int8 on packed panels against the f32w copy widened
#           beforehand, int4 against the kernel on dequantized weights,
#           where the CPU has AVX-512-BF16 (and VBMI) the vdpbf16ps kernels against
#           the FMA ones on bfloat16 x (qkern.dispatch.AVX512_BF16_FROM_M,
#           per CPU vendor), and with TUNE=1 the tuner's runs of both
#           formats (docs/tuning.rst).
# The timings run whatever the tests gave, and the script exits with the
# tests' status.  Wheels missing there (numpy, ml_dtypes, pytest,
# hypothesis, simde-py) may be carried in .whl/.  Exits 2 with a message
# where the CPU, the OS or the compiler gives no kernel of the level,
# before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
level=${1:-}
case "$level" in
  amx) flags='amx[a-z_0-9]*' ;;
  avx512) flags='avx512[a-z_0-9]*' ;;
  *) echo "usage: bash benchmarks/isa_check.sh amx|avx512" >&2; exit 64 ;;
esac
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/qkern-$level-check}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/qkern-site .whl/*.whl
  export PYTHONPATH=/tmp/qkern-site${PYTHONPATH:+:$PYTHONPATH}
fi
{ grep -m1 "model name" /proc/cpuinfo; grep -o "$flags" /proc/cpuinfo | sort -u || true; } |
  tee "$OUT/cpu.txt"
start=$(date +%s)
$PY setup.py -q build_clib build_ext --inplace >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "isa_check.sh: built qkern in $(( $(date +%s) - start )) s"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$PY -c "import qkern"
$PY -c "import qkern, sys; sys.exit(0 if any(k.isa == '$level' and k.available for k in qkern.kernels()) else 2)" || {
  echo "isa_check.sh: no $level kernel may run here (CPU, OS or compiler); nothing run"; exit 2; }
$PY -m qkern info | tee "$OUT/info.txt"
tests=0
$PY -m pytest -q -p no:cacheprovider -rs tests/woq/test_ukernels.py tests/woq/test_kernels.py \
  tests/woq/test_int4.py tests/woq/test_dispatch.py tests/woq/test_tuning.py \
  tests/woq/test_emulated.py >"$OUT/tests.txt" 2>&1 || tests=$?
tail -5 "$OUT/tests.txt"
if [ "$level" = amx ]; then
  for isa in amx avx512_bf16; do
    echo "=== QKERN_ISA=$isa"
    QKERN_ISA=$isa $PY benchmarks/woq_minof.py 4096:4096:1,3,4,6,8,32,33,128,512 11008:4096:128 \
      --weights int8,int4 --dtypes bfloat16,float32 --threads 1,2 --copies 4 --reps 8 |
      tee "$OUT/minof-$isa.txt"
  done
  echo "=== the functional op's kernels, and the op against WoqLinear"
  $PY benchmarks/woq_minof.py 4096:4096:4,5,6,8,9 --dtypes float32,float16,bfloat16 \
    --weights int8:bf16_gemv_8x1c0__amx,int8:bf16_gemv_32x1c0__amx,int8:f32_gemv_8x1c0__avx512 \
    --threads 1,2 --copies 4 --reps 8 | tee "$OUT/minof-gemv.txt"
  $PY benchmarks/woq_minof.py 4096:4096:1,4,5,6,8 --dtypes float32,float16,bfloat16 \
    --weights int8,int8-functional --threads 1,2 --copies 4 --reps 16 | tee -a "$OUT/minof-gemv.txt"
else
  # float32: the AVX-512 kernels run it on every AVX-512 CPU (bfloat16 runs
  # vdpbf16ps where the CPU has AVX-512-BF16)
  QKERN_ISA=avx512 $PY benchmarks/woq_minof.py 4096:4096:1,2,16,48,64,128,512 11008:4096:128 \
    --weights int8,int8-widened,int4:f32_qb4w_gemm_8x32c1__avx512,int4-dequantized \
    --dtypes float32 --threads 1,2 \
    --copies 4 --reps 8 | tee "$OUT/minof-avx512.txt"
  # the avx512_bf16 level needs AVX512_VBMI too (qkern.dispatch._ISA_REQUIRES)
  if grep -qx avx512_bf16 "$OUT/cpu.txt" && grep -qx avx512vbmi "$OUT/cpu.txt"; then
    $PY benchmarks/woq_minof.py 4096:4096:1 11008:4096:1 --dtypes bfloat16 --threads 1,2 \
      --weights int8:bf16_gemm_1x32c2__avx512bf16,int8:f32_gemm_1x32c2__avx512,int4:bf16_qb4w_gemm_8x32c1__avx512bf16,int4:f32_qb4w_gemm_8x32c1__avx512 \
      --copies 4 --reps 12 | tee "$OUT/minof-bf16.txt"
    $PY benchmarks/woq_minof.py 4096:4096:2,4,16,128 --dtypes bfloat16 --threads 1,2 \
      --weights int8:bf16_gemm_8x32c2__avx512bf16,int8:f32_gemm_4x32c2__avx512,int8:f32_gemm_6x32c2__avx512,int4:bf16_qb4w_gemm_8x32c1__avx512bf16,int4:f32_qb4w_gemm_8x32c1__avx512 \
      --copies 4 --reps 8 | tee -a "$OUT/minof-bf16.txt"
  fi
  if [ "${TUNE:-0}" = 1 ]; then
    for group in "" "--int4-group 128"; do
      $PY -m qkern tune --shapes 4096x4096 11008x4096 --m 1,16,64,128,512 \
        --dtypes bfloat16,float32 --threads 1,2 --exhaustive $group |
        tee -a "$OUT/tune.txt"
    done
  fi
fi
exit $tests
