"""Did AddressSanitizer catch the canary's write past the end, in qkern's code?

``make sanitize`` first runs ``tests/oob_canary.py``, where a real kernel
writes one float32 past the end of its output, and then asks this script
whether the reports in the canary's folder show that write caught.  The rule
is the same on every CPU class; a report passes when it has

* an AddressSanitizer ERROR of kind ``heap-buffer-overflow`` or
  ``unknown-crash``.  A scalar store past the end (the reference kernel) and
  the explicit check of ``src/woq/sanitize.h`` (AVX-512 masked stores) give
  ``heap-buffer-overflow``; a wide vector store that straddles the end of the
  allocation (the AVX2 kernel's 32-byte store) starts on addressable bytes,
  and ASan names that ``unknown-crash``;
* a ``WRITE of size N``;
* at least one frame in ``src/woq/`` in the stack of the faulting access
  (before the "is located" description, so not in "allocated by");
* the address located just past the end of a heap region: "N bytes to the
  right of M-byte region" (GCC 12's runtime; newer ones say "after"),
  followed by "allocated by thread".

Anything else (no report, a READ, a use-after-free, a SEGV, a stack or global
buffer, an address to the left of a region, no frame in ``src/woq/``) is
refused, with the reason.

Usage::

    python tests/sanitizer_report.py DIR

prints one line, such as ``heap-buffer-overflow WRITE of size 4 in
qk_woq_f32_gemm_ukernel_4x32c2__ref``, and exits 0 when a report file in DIR
passes; otherwise it prints each file's reason on stderr and exits 1.
"""

import argparse
import re
import sys
from pathlib import Path

KINDS = ("heap-buffer-overflow", "unknown-crash")
_ERROR = re.compile(r"ERROR: AddressSanitizer: ([\w-]+)")
_ACCESS = re.compile(r"^(READ|WRITE) of size (\d+)", re.M)
_FRAME = re.compile(r"^ +#\d+ 0x[0-9a-f]+ in (\S+) (\S+)$", re.M)
_PAST_END = re.compile(r"\d+ bytes (?:to the right of|after) \d+-byte region .*\n"
                       r"allocated by thread")


class Refused(ValueError):
    """The report does not show the canary's write caught in qkern's code."""


def classify(report):
    """Decide whether one ASan report shows the canary's write caught in qkern.

    Parameters
    ----------
    report : str
        The text of one report file (``log_path`` of ``ASAN_OPTIONS``).

    Returns
    -------
    str
        One line: the error kind, the access and the qkern function, e.g.
        ``unknown-crash WRITE of size 32 in qk_woq_f32_gemm_ukernel_4x16c1__avx2``.
        The function is the innermost ``qk_woq_*`` function among the frames
        in ``src/woq/``, or the innermost of those frames if none is.

    Raises
    ------
    Refused
        When the report is not that, with the reason as its message.
    """
    error = _ERROR.search(report)
    if error is None:
        raise Refused("no AddressSanitizer ERROR in the report")
    kind = error[1]
    if kind not in KINDS:
        raise Refused(f"the error is {kind}, not {' or '.join(KINDS)}")
    access = _ACCESS.search(report, error.end())
    if access is None or access[1] != "WRITE":
        raise Refused(f"the access is {access[0] if access else 'not given'}, not a WRITE")
    stack, _, where = report[access.end():].partition(" is located ")
    woq = [func for func, place in _FRAME.findall(stack) if "src/woq/" in place]
    if not woq:
        raise Refused("no frame of the faulting access is in src/woq/")
    if not _PAST_END.match(where):
        located = where.partition("\n")[0] or "not given"
        raise Refused(f"the address is not just past the end of a heap region: {located}")
    name = next((m[0] for func in woq if (m := re.match(r"qk_woq_\w+", func))), woq[0])
    return f"{kind} WRITE of size {access[2]} in {name}"


def main(argv=None):
    """Run the command line: classify every file in a folder of reports.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default: ``sys.argv[1:]``): the folder.

    Returns
    -------
    int
        0 when a file passes (its line is printed on stdout), 1 otherwise
        (each file's reason, or that there is none, is printed on stderr).
    """
    parser = argparse.ArgumentParser(prog="python tests/sanitizer_report.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="the folder of report files")
    folder = parser.parse_args(argv).folder
    files = sorted(path for path in folder.glob("*") if path.is_file())
    if not files:
        print(f"sanitizer_report: refused: no report files in {folder}", file=sys.stderr)
        return 1
    reasons = []
    for path in files:
        try:
            print(classify(path.read_text(errors="replace")))
            return 0
        except Refused as refused:
            reasons.append(f"sanitizer_report: refused: {path.name}: {refused}")
    print(*reasons, sep="\n", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
