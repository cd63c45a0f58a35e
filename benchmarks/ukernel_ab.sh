#!/usr/bin/env bash
# One WoQ micro-kernel at a git revision (a) against the working tree (b),
# side by side in one process (benchmarks/ukernel_ab.c):
#   bash benchmarks/ukernel_ab.sh REV FILE SYMBOL int8 NR KR MR NC KC XDT DT [ROUNDS]
#   bash benchmarks/ukernel_ab.sh REV FILE SYMBOL int4 GROUP MR NC KC DT [ROUNDS]
#   bash benchmarks/ukernel_ab.sh REV FILE SYMBOL kblock WIDENS M NC K DT [ROUNDS]
#   bash benchmarks/ukernel_ab.sh REV FILE SYMBOL int4kblock WIDENED GROUP M NC K DT [ROUNDS]
# e.g. the AVX-512 int4 kernel (float32 y) on 8 rows, 128 columns,
# K = 4096, groups of 128, against the commit before the last:
#   bash benchmarks/ukernel_ab.sh HEAD~1 src/woq/f32-qb4w-gemm-x32c1-avx512.c \
#       qk_woq_f32_qb4w_gemm_ukernel_8x32c1__avx512 int4 128 8 128 4096 f32
# FILE is compiled twice, at REV (with REV's headers) and as it is now,
# with the flags setup.py gives its ISA library and the kernels' own
# flags, SYMBOL renamed qk_ab_a and qk_ab_b.  Prints each one's min and
# median per call, the ratio b / a and whether both wrote the same bits.
# The CPU must run FILE's ISA; MR must not exceed the kernel's (the 8 of
# ..._8x32c1__...), and XDT is the dtype the kernel reads x in (f32 where
# the driver converts x for it, xt where it packs x transposed, else DT).
# AB_COPIES=C in the environment: the calls read C copies of the weight in
# turn, cold weights when they exceed the last-level cache (e.g. NC = KC =
# 4096, C = 8 on a 32 MiB L3).  AB_W_OFFSET=B (0..63, KR = 0): the
# row-major weight starts B bytes past a 64-byte line.
# kblock: an AMX K-block kernel walked over one chunk of NC columns as the
# driver walks it, M rows (WIDENS 1: the kernel widens each K block on its
# first row step, the bf16w kernel), e.g. 128 rows, 256 columns, K = 4096:
#   bash benchmarks/ukernel_ab.sh HEAD~1 src/woq/bf16-gemm-x32c2-amx.c \
#       qk_woq_bf16w_gemm_kblock_32x32c2__amx kblock 1 128 256 4096 bf16
# int4kblock: an int4 AMX K-block kernel walked the same way (K blocks of
# 1024 rounded down to whole groups of GROUP), over packed int4 panels
# (WIDENED 0, tile_qb4w) or panels widened beforehand as the driver widens
# them (WIDENED 1, tilew_qb4w), e.g. 128 rows, groups of 128:
#   bash benchmarks/ukernel_ab.sh HEAD~1 src/woq/tile-qb4w-gemm-x32c1-amx.c \
#       qk_woq_tilew_qb4w_gemm_kblock_32x32c1__amx int4kblock 1 128 128 256 4096 bf16
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 9 ]; then
  sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
rev=$1 file=${2#./} symbol=$3
shift 3
kind=$1
case "$kind" in
  int8) define= ;;
  int4) define=-DAB_INT4 ;;
  kblock) define=-DAB_KBLOCK ;;
  int4kblock) define="-DAB_KBLOCK -DAB_INT4" ;;
  *) echo "ukernel_ab: the kind is int8, int4, kblock or int4kblock, not $kind" >&2; exit 2 ;;
esac
python=${PYTHON:-python3}
# setup.py's flags: the ISA library's, COMMON_CFLAGS and KERNEL_CFLAGS
flags=$("$python" - "$file" <<'EOF'
import ast, os, sys
tree = ast.parse(open("setup.py").read())
values = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
          for t in node.targets if isinstance(t, ast.Name)}
def literal(name):
    node = values[name]
    if isinstance(node, ast.BinOp):  # COMMON_CFLAGS = [...] + SANITIZE_FLAGS
        node = node.left
    return ast.literal_eval(node)
file = os.path.normpath(sys.argv[1])
isa = [lib[2] for lib in literal("ISA_LIBRARIES") if file in lib[4]]
if not isa and file not in literal("BASE_SOURCES"):
    sys.exit(f"ukernel_ab: setup.py builds no {file}")
print(" ".join((isa[0] if isa else []) + literal("COMMON_CFLAGS") + literal("KERNEL_CFLAGS")))
EOF
) || exit 2
cc=${CC:-cc}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git archive "$rev" include src | tar -x -C "$work"
# each copy keeps only the kernel global (a file may define several), and
# takes the packing helpers (qk_woq_group_len) from the working tree
"$cc" $flags -w -I"$work/include" -I"$work/$(dirname "$file")" "-D$symbol=qk_ab_a" \
  -c "$work/$file" -o "$work/a.o"
"$cc" $flags -w -Iinclude -I"$(dirname "$file")" "-D$symbol=qk_ab_b" -c "$file" -o "$work/b.o"
objcopy --keep-global-symbol=qk_ab_a "$work/a.o"
objcopy --keep-global-symbol=qk_ab_b "$work/b.o"
"$cc" $flags $define -ffunction-sections -Wl,--gc-sections -Iinclude -Isrc/woq \
  benchmarks/ukernel_ab.c src/woq/woq_pack.c src/cpu/cpu_detect.c "$work/a.o" "$work/b.o" \
  -o "$work/ukernel_ab"
"$work/ukernel_ab" "$@"
