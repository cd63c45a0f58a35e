"""benchmarks/ukernel_ab.sh: one micro-kernel at a git revision against
the working tree, side by side in one process. Run on the portable
reference kernel (any x86-64 CPU), and its K-block walk on an AMX kernel
(CPUs with AMX), in a clone of this checkout so that its working tree can
differ from the revision."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import qkern

ROOT = Path(__file__).resolve().parents[2]
# they build and run their own programs, which QKERN_ISA does not cap:
# make test runs them once, in its uncapped pass
pytestmark = pytest.mark.skipif("QKERN_ISA" in os.environ,
                                reason="not capped by QKERN_ISA; the uncapped pass runs it")
KERNEL = ("src/woq/f32-gemm-ref.c", "qk_woq_f32_gemm_ukernel_4x16c1__ref")
# rows of x in the kernel's dtype (the reference converts none), y bfloat16
ARGS = ["int8", "16", "1", "4", "33", "40", "bf16", "bf16", "5"]
AMX_KERNEL = ("src/woq/bf16-gemm-x32c2-amx.c", "qk_woq_bf16w_gemm_kblock_32x32c2__amx")
# widening on the first row step; 40 rows (a partial second row step), 64
# columns, K = 1100 (a second, partial K block), float16 x (two planes)
KBLOCK_ARGS = ["kblock", "1", "40", "64", "1100", "f16", "3"]
# the row-major weight (KR = 0), 3 rows, 40 columns, K = 70
ROW_MAJOR_KERNEL = ("src/woq/f32-gemm-ref.c", "qk_woq_f32_gemm_ukernel_4x1c0__ref")
ROW_MAJOR_ARGS = ["int8", "1", "0", "3", "40", "70", "f32", "f32", "3"]
# the AMX kernel on the row-major weight, over packed x^T: 20 rows (both
# halves of its B tiles), 40 columns, K = 300 (three blocks, the last
# partial), float16 x (two planes)
AMX_GEMV_KERNEL = ("src/woq/bf16-gemv-x1c0-amx.c", "qk_woq_bf16_gemv_ukernel_32x1c0__amx")
AMX_GEMV_ARGS = ["int8", "1", "0", "20", "40", "300", "xt", "f16", "3"]
INT4_AMX_KERNEL = ("src/woq/tile-qb4w-gemm-x32c1-amx.c",
                   "qk_woq_tile_qb4w_gemm_kblock_32x32c1__amx")
INT4_AMXW_KERNEL = (INT4_AMX_KERNEL[0], "qk_woq_tilew_qb4w_gemm_kblock_32x32c1__amx")
# groups of 64, 40 rows, 64 columns, K = 1152 (K blocks of 1024 and 128),
# float32 x (three planes)
INT4_KBLOCK_ARGS = ["int4kblock", "0", "64", "40", "64", "1152", "f32", "3"]
KBLOCK_CASES = [
    pytest.param(AMX_KERNEL, KBLOCK_ARGS, id="int8"),
    pytest.param(INT4_AMX_KERNEL, INT4_KBLOCK_ARGS, id="int4"),
    pytest.param(INT4_AMXW_KERNEL, ["int4kblock", "1", *INT4_KBLOCK_ARGS[2:]], id="int4-widened")]
needs_amx = pytest.mark.skipif(not qkern.cpu_features()["amx_bf16"],
                               reason="the kblock walk runs an AMX kernel; this CPU has no AMX")


def _clone(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout")
    for tool in ("cc", "objcopy"):
        if shutil.which(tool) is None:
            pytest.skip(f"needs {tool}")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    for path in ("benchmarks/ukernel_ab.sh", "benchmarks/ukernel_ab.c"):  # this tree's tool
        shutil.copy(ROOT / path, clone / path)
    return clone


def _run(clone, copies=None, ok=True, kernel=KERNEL, args=ARGS, offset=None):
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("AB_COPIES", None)
    env.pop("AB_W_OFFSET", None)
    if copies is not None:
        env["AB_COPIES"] = copies
    if offset is not None:
        env["AB_W_OFFSET"] = offset
    out = subprocess.run(["bash", "benchmarks/ukernel_ab.sh", "HEAD", *kernel, *args], cwd=clone,
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == (0 if ok else 2), out.stderr
    return out.stdout if ok else out.stderr


def test_the_same_kernel_gives_the_same_bits_and_a_ratio(tmp_path):
    report = _run(_clone(tmp_path))
    for side in ("a", "b"):
        assert re.search(rf"^{side}: min \d+\.\d+ us  median \d+\.\d+ us$", report, re.M), report
    ratio = re.search(r"^b / a: min (\d+\.\d+)  median (\d+\.\d+)", report, re.M)
    assert ratio and all(float(r) > 0 for r in ratio.groups()), report
    assert "bits: the same" in report
    assert "alternating, 1 weight)" in report


def test_weight_copies_in_turn_give_the_same_bits(tmp_path):
    """AB_COPIES: the calls rotate through copies of the weight (cold
    weights when they exceed the last-level cache); a count that is not
    1 to 4096 is refused."""
    clone = _clone(tmp_path)
    report = _run(clone, copies="3")
    assert "alternating, 3 weight copies in turn)" in report
    assert "bits: the same" in report
    for bad in ("0", "-1", "3x", "4097"):
        assert "AB_COPIES must be at least 1 and at most 4096" in _run(clone, bad, ok=False), bad


def test_a_row_major_weight_off_a_line_gives_the_same_bits(tmp_path):
    """AB_W_OFFSET: the row-major weight (KR = 0) starts that many bytes
    past a 64-byte line, as a caller's array may; an offset of 64 or more,
    or one for a packed layout, is refused."""
    clone = _clone(tmp_path)
    for offset in ("1", "16", "63"):
        report = _run(clone, kernel=ROW_MAJOR_KERNEL, args=ROW_MAJOR_ARGS, offset=offset)
        assert "bits: the same" in report, offset
    message = "AB_W_OFFSET must be 0..63, and only with KR = 0"
    assert message in _run(clone, ok=False, kernel=ROW_MAJOR_KERNEL, args=ROW_MAJOR_ARGS,
                           offset="64")
    assert message in _run(clone, ok=False, offset="16")


def test_a_changed_kernel_is_reported_different(tmp_path):
    """Control: the working tree's kernel adds the scale instead of
    multiplying by it."""
    clone = _clone(tmp_path)
    source = clone / KERNEL[0]
    text = source.read_text()
    assert "float v = acc * scale[n0 + j];" in text
    source.write_text(text.replace("float v = acc * scale[n0 + j];",
                                   "float v = acc + scale[n0 + j];"))
    assert "bits: DIFFERENT" in _run(clone)


def test_a_file_setup_py_does_not_build_is_refused(tmp_path):
    clone = _clone(tmp_path)
    out = subprocess.run(["bash", "benchmarks/ukernel_ab.sh", "HEAD", "src/woq/absent.c",
                          KERNEL[1], *ARGS], cwd=clone, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert out.returncode == 2 and "setup.py builds no src/woq/absent.c" in out.stderr


@needs_amx
@pytest.mark.parametrize("kernel, args", KBLOCK_CASES)
def test_kblock_walk_of_the_same_kernel_gives_the_same_bits(tmp_path, kernel, args):
    report = _run(_clone(tmp_path), copies="2", kernel=kernel, args=args)
    ratio = re.search(r"^b / a: min (\d+\.\d+)  median (\d+\.\d+)", report, re.M)
    assert ratio and all(float(r) > 0 for r in ratio.groups()), report
    assert "alternating, 2 weight copies in turn)" in report
    assert "bits: the same" in report


@needs_amx
def test_the_amx_gemv_on_packed_x_transposed_gives_the_same_bits(tmp_path):
    """XDT xt: the AMX kernel on the row-major weight reads one group of
    packed x^T, here with the weight 16 bytes past a line."""
    report = _run(_clone(tmp_path), copies="2", kernel=AMX_GEMV_KERNEL, args=AMX_GEMV_ARGS,
                  offset="16")
    assert "alternating, 2 weight copies in turn)" in report
    assert "bits: the same" in report


@needs_amx
@pytest.mark.parametrize("kernel, args, old, new", [
    (AMX_KERNEL, KBLOCK_ARGS, "_mm512_loadu_ps(scale + col)", "_mm512_set1_ps(1.0f)"),
    (INT4_AMX_KERNEL, INT4_KBLOCK_ARGS,
     "v = _mm512_fmadd_ps(_mm512_set1_ps(xs[i * xs_stride]), zp, v);", "")],
    ids=["int8-scales-ignored", "int4-zeros-dropped"])
def test_kblock_walk_reports_a_changed_kernel_different(tmp_path, kernel, args, old, new):
    """Control: the working tree's AMX kernel ignores the scales (int8) or
    drops the zeros (int4)."""
    clone = _clone(tmp_path)
    source = clone / kernel[0]
    text = source.read_text()
    assert old in text
    source.write_text(text.replace(old, new))
    assert "bits: DIFFERENT" in _run(clone, kernel=kernel, args=args)


@needs_amx
@pytest.mark.parametrize("kernel, bad_args, message", [
    (AMX_KERNEL,
     [["kblock", *bad, "1100", "f16", "3"]
      for bad in (["2", "40", "64"], ["1", "0", "64"], ["1", "40", "48"])],
     "expected WIDENS 0 or 1, M >= 1, NC a multiple of 32"),
    (INT4_AMX_KERNEL,
     [["int4kblock", *bad, "f32", "3"]
      for bad in (["2", "64", "40", "64", "1152"], ["0", "48", "40", "64", "1152"],
                  ["0", "64", "40", "64", "1100"], ["0", "2048", "40", "64", "4096"],
                  ["0", "64", "0", "64", "1152"], ["0", "64", "40", "48", "1152"])],
     "expected WIDENED 0 or 1, GROUP a multiple of 32 up to 1024 dividing K")],
    ids=["int8", "int4"])
def test_kblock_walk_refuses_bad_shapes(tmp_path, kernel, bad_args, message):
    clone = _clone(tmp_path)
    for args in bad_args:
        assert message in _run(clone, ok=False, kernel=kernel, args=args), args
