"""tests/sanitizer_report.py on the canary's real AddressSanitizer reports.

The fixtures in tests/tooling/data/asan are whole reports of ``tests/oob_canary.py``
run as ``make sanitize`` runs it, on an AMD Zen 3 (AVX2, no AVX-512) with
GCC 12.2's ASan runtime:

* ``canary-avx2-unknown-crash.txt``: QKERN_ISA=avx2; the 32-byte store of
  f32_gemm_4x16c1__avx2 starts on addressable bytes and straddles the end;
* ``canary-ref-heap-buffer-overflow.txt``: QKERN_ISA=ref; a 4-byte store just
  past the end.

Every other case is one of them with the smallest edit that turns it into
that case, stated with it; `edit` fails when a pattern it is given does not
occur, so that no case passes on an unchanged report.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from sanitizer_report import Refused, classify

DATA = Path(__file__).parent / "data" / "asan"
SCRIPT = Path(__file__).parent.parent / "sanitizer_report.py"
AVX2 = "canary-avx2-unknown-crash.txt"
REF = "canary-ref-heap-buffer-overflow.txt"


def edit(name, *subs):
    """The fixture `name` with each (regex, replacement) of `subs` applied."""
    text = (DATA / name).read_text()
    for pattern, repl in subs:
        text, n = re.subn(pattern, repl, text, flags=re.S)
        assert n, f"{pattern!r} is not in {name}"
    return text


@pytest.mark.parametrize("name, verdict", [
    (AVX2, "unknown-crash WRITE of size 32 in qk_woq_f32_gemm_ukernel_4x16c1__avx2"),
    (REF, "heap-buffer-overflow WRITE of size 4 in qk_woq_f32_gemm_ukernel_4x32c2__ref"),
])
def test_accepts_the_recorded_reports(name, verdict):
    assert classify((DATA / name).read_text()) == verdict


def test_accepts_the_newer_runtimes_wording():
    # Newer ASan runtimes than GCC 12's say "after" for "to the right of".
    text = edit(REF, ("0 bytes to the right of", "0 bytes after"))
    assert classify(text).startswith("heap-buffer-overflow WRITE of size 4 in ")


def test_names_the_driver_when_the_stack_starts_there():
    # Frames #0-#2 (the store and the kernel) cut: the stack starts in the
    # driver, as it can for sanitize.h's check, which passes the kernel's
    # return address as the pc.  qk_woq_gemm._omp_fn.0 names qk_woq_gemm.
    text = edit(REF, (r"    #0 .*?(?=    #3 )", ""))
    assert classify(text) == "heap-buffer-overflow WRITE of size 4 in qk_woq_gemm"


NUMPY_SO = ("(/work/main/.venv/lib/python3.11/site-packages/numpy/"
            "_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so+0x1a2b3c)")
NUMPY_FRAME = f"in PyArray_AssignArray {NUMPY_SO}"
NUMPY_ONLY = ((r"    #0 .*?(?=    #9 )", f"    #0 0x7f36f57a2b3c {NUMPY_FRAME}\n"),
              (r"src/woq/scalar-convert.h:62 in qk_store_from_f32",
               f"{NUMPY_SO} in PyArray_AssignArray"))
SEGV_HEADER = ("==2734==ERROR: AddressSanitizer: SEGV on unknown address 0x61d000111a7c "
               "(pc 0x7f36edd1d8a2 bp 0x7ffd53c3e960 sp 0x7ffd53c3e958 T0)\n"
               "==2734==The signal is caused by a WRITE memory access.\n")

REFUSED = {
    # WRITE -> READ in the access line.
    "read": (edit(REF, ("WRITE of size 4", "READ of size 4")),
             "the access is READ of size 4, not a WRITE"),
    # The kind (ERROR and SUMMARY lines) -> heap-use-after-free; the region
    # made 2048 bytes, so that the address lies inside it; a "freed by" stack
    # (free called from numpy) before "previously allocated by".
    "use-after-free": (edit(REF, ("heap-buffer-overflow", "heap-use-after-free"),
                            (r"0 bytes to the right of 2044-byte region \[(\w+),0x61d000111a7c\)\n",
                             r"2044 bytes inside of 2048-byte region [\1,0x61d000111a80)\n"
                             "freed by thread T0 here:\n"
                             "    #0 0x7f36f80b8e8f in __interceptor_free ../../../../src/"
                             "libsanitizer/asan/asan_malloc_linux.cpp:52\n"
                             "    #1 0x7f36f5773f1b " + NUMPY_FRAME + "\n\n"
                             "previously ")),
                       "the error is heap-use-after-free, not"),
    # The two header lines as a SEGV report has them; what follows the stack,
    # up to ABORTING, -> the SEGV report's last two lines.
    "segv": (edit(REF, (r"^=+\n.*?thread T0\n", "=" * 65 + "\n" + SEGV_HEADER),
                  (r"\n\n0x61d000111a7c is located .*(?===2734==ABORTING)",
                   "\nAddressSanitizer can not provide additional info.\n"
                   "SUMMARY: AddressSanitizer: SEGV src/woq/scalar-convert.h:62 in "
                   "qk_store_from_f32\n")),
             "the error is SEGV, not"),
    # qkern's frames #0-#8 (the kernel, the driver, GOMP, the Cython layer)
    # -> one numpy frame, and the SUMMARY line names it: the write happened
    # outside qkern.
    "numpy-only": (edit(REF, *NUMPY_ONLY), "no frame of the faulting access is in src/woq/"),
    # As "numpy-only", and numpy's default_malloc frame under "allocated by"
    # -> the driver's run_task: a src/woq frame there does not count.
    "woq-only-in-allocation": (
        edit(REF, *NUMPY_ONLY, (r"in default_malloc \S+", "in run_task src/woq/woq_driver.c:93")),
        "no frame of the faulting access is in src/woq/"),
    # "0 bytes to the right of" -> "4 bytes to the left of", the region moved
    # to start 4 bytes after the address.
    "left-of-region": (edit(REF, (r"0 bytes to the right of 2044-byte region \[\w+,\w+\)",
                                  "4 bytes to the left of 2044-byte region "
                                  "[0x61d000111a80,0x61d00011227c)")),
                       "not just past the end of a heap region: 4 bytes to the left of"),
    # AVX2 report: the addresses -> stack addresses, the heap description
    # (up to SUMMARY) -> a stack frame's (shadow bytes left as recorded).
    "stack-buffer": (edit(AVX2, ("0x61d000111a60", "0x7fffa05921e0"),
                          (r"0x61d000111a7c is located .*?(?=\n\nSUMMARY)",
                           "Address 0x7fffa05921fc is located in stack of thread T0 at offset 92 "
                           "in frame\n    #0 0x7fcbda32b0a0 in f32_gemm_x16c1 "
                           "src/woq/f32-gemm-x16c1-avx2.c:60\n\n"
                           "  This frame has 1 object(s):\n"
                           "    [32, 92) 'acc' (line 62) <== Memory access at offset 92 "
                           "overflows this variable")),
                     "not just past the end of a heap region: in stack of thread T0"),
    # AVX2 report: the heap description (up to SUMMARY) -> a global's.
    "global-buffer": (edit(AVX2, (r"is located 0 bytes to the right of 2044-byte region .*?"
                                  r"(?=\n\nSUMMARY)",
                                  "is located 0 bytes to the right of global variable 'out' "
                                  "defined in 'canary.c:3:7' (0x61d000111280) of size 2044")),
                      "not just past the end of a heap region: 0 bytes to the right of global"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_refuses_with_the_reason(case):
    text, reason = REFUSED[case]
    with pytest.raises(Refused, match=re.escape(reason)):
        classify(text)


def test_refuses_no_report():
    with pytest.raises(Refused, match="no AddressSanitizer ERROR"):
        classify("")


def run_cli(folder):
    return subprocess.run([sys.executable, str(SCRIPT), str(folder)],
                          capture_output=True, text=True)


def test_cli_passes_on_a_folder_with_the_report(tmp_path):
    (tmp_path / "ubsan.1").write_text("")
    (tmp_path / "asan.2740").write_text((DATA / AVX2).read_text())
    result = run_cli(tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (
        0, "unknown-crash WRITE of size 32 in qk_woq_f32_gemm_ukernel_4x16c1__avx2\n", "")


def test_cli_refuses_an_empty_folder(tmp_path):
    result = run_cli(tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert f"no report files in {tmp_path}" in result.stderr


def test_cli_refuses_with_each_files_reason(tmp_path):
    (tmp_path / "asan.1").write_text(REFUSED["read"][0])
    (tmp_path / "asan.2").write_text(REFUSED["numpy-only"][0])
    result = run_cli(tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.splitlines() == [
        "sanitizer_report: refused: asan.1: the access is READ of size 4, not a WRITE",
        "sanitizer_report: refused: asan.2: no frame of the faulting access is in src/woq/",
    ]
