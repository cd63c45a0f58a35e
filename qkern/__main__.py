"""Command line: ``python -m qkern info``, ``bench`` and ``tune``.

``info`` describes what qkern sees on this machine: versions, CPU features,
the ISA level and its cap, OpenMP threads, the kernel registry and the
kernel chosen per dtype. ``bench`` measures this machine's roofline and
times each kernel (see :mod:`qkern.bench`); the comparison with NumPy and
PyTorch is ``benchmarks/woq_bench.py``, which takes the same options and more.
``tune`` tunes shapes ahead of time (:mod:`qkern.tuning`) and prints what
won, by how much over the static rule, and what the tuning cost.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import ml_dtypes
import numpy as np

import qkern
from qkern import bench, tuning
from qkern.dispatch import CPU_ISA, CPU_VENDOR, ISA_CAP, choose_kernel

_CHOICE_DTYPES = ("bfloat16", "float16", "float32")
_CHOICE_MS = (1, 64)


def openmp_threads() -> str:
    """The OpenMP runtime's default thread count, and where the figure comes from.

    Read from the loaded OpenMP runtime through ``threadpoolctl`` when it is
    installed; otherwise the number of cores this process may use.

    Returns
    -------
    str
        For example ``"2 (libgomp, via threadpoolctl)"``.
    """
    if importlib.util.find_spec("threadpoolctl") is not None:
        from threadpoolctl import threadpool_info

        found = [f"{i['num_threads']} ({i['prefix']}, via threadpoolctl)"
                 for i in threadpool_info() if i["user_api"] == "openmp"]
        if found:
            return "; ".join(found)
    return f"{bench.all_cores()} (cores available; install threadpoolctl to read the runtime)"


def _table_lines(header: tuple, rows: list) -> list:
    """Left-aligned text-table lines: header, rule, one line per row."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in [header, tuple("-" * w for w in widths), *rows]]


def _traits(k) -> str:
    traits = [t for t, on in (("widened", k.widened), ("dequantizes", k.dequantizes),
                              ("converts-x", k.converts_x), ("packs-x", k.packs_x),
                              ("splits-x", k.splits_x), ("sums-bytes", k.sums_bytes),
                              ("flushes-subnormals", k.flushes_subnormals)) if on]
    return ",".join(traits) or "-"


def kernel_lines() -> list:
    """The kernel registry as text-table lines, one kernel per row.

    Returns
    -------
    list of str
        Header, rule, then per kernel: name, ISA, kind, MRxNRxKR, weight
        format, dtypes, numerical and reading traits, the instruction that
        bounds it, and whether it may run here.
    """
    rows = [(k.name, k.isa, k.kind, f"{k.mr}x{k.nr}x{k.kr}",
             k.weight_format + (f"/g{k.group_size}" if k.group_size else ""),
             ",".join(k.dtypes), _traits(k), k.bound_by, "yes" if k.available else "no")
            for k in qkern.kernels()]
    return _table_lines(("kernel", "isa", "kind", "MRxNRxKR", "weight", "dtypes", "traits",
                         "bound by", "available"), rows)


def choice_lines() -> list:
    """The kernel :func:`qkern.dispatch.choose_kernel` picks per dtype and M for a wide
    weight (N unconstrained), as table lines.

    Returns
    -------
    list of str
        Header, rule, then one line per activation dtype.
    """
    rows = [(dtype, *(choose_kernel(dtype, m).name for m in _CHOICE_MS))
            for dtype in _CHOICE_DTYPES]
    return _table_lines(("dtype", *(f"M={m}" for m in _CHOICE_MS)), rows)


def info() -> str:
    """Everything ``python -m qkern info`` prints.

    Returns
    -------
    str
        Versions, CPU features, ISA and cap, OpenMP threads, the registry
        and the kernel choices, one item per line.
    """
    features = qkern.cpu_features()
    on = " ".join(f for f, v in features.items() if v) or "-"
    off = " ".join(f for f, v in features.items() if not v) or "-"
    asked = os.environ.get("QKERN_ISA", "").strip()
    cap_src = f"QKERN_ISA={asked}" if asked else "QKERN_ISA unset"
    return "\n".join([
        f"qkern {qkern.__version__} (numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
        f"Python {sys.version.split()[0]})",
        f"CPU vendor: {CPU_VENDOR or '-'}",
        f"CPU features on:  {on}",
        f"CPU features off: {off}",
        f"ISA levels: {' < '.join(qkern.ISA_LEVELS)}",
        f"ISA of this CPU: {CPU_ISA}; cap: {ISA_CAP} ({cap_src})",
        f"OpenMP default threads: {openmp_threads()}",
        "",
        "Kernels:",
        *kernel_lines(),
        "",
        "Kernel chosen (qkern.dispatch.choose_kernel):",
        *choice_lines(),
    ])


def _positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _thread_list(text: str) -> list:
    """argparse type: comma-separated integers >= 1."""
    return [_positive_int(part) for part in text.split(",")]


def output_path(text: str) -> str:
    """argparse type: a file name in a folder that exists.

    Parameters
    ----------
    text : str
        The argument.

    Returns
    -------
    str
        ``text``.

    Raises
    ------
    argparse.ArgumentTypeError
        If the folder does not exist or ``text`` is a folder.
    """
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"folder {folder!r} does not exist")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder, expected a file name")
    return text


def _shape_list(text: str) -> tuple:
    """argparse type: ``NxK`` (N columns, K inner), e.g. ``4096x11008``."""
    try:
        n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NxK, e.g. 4096x4096, got {text!r}") from None
    if n < 1 or k < 1:
        raise argparse.ArgumentTypeError(f"expected N, K >= 1, got {text!r}")
    return n, k


def _dtype_list(text: str) -> list:
    """argparse type: comma-separated activation dtype names."""
    names = text.split(",")
    bad = [n for n in names if n not in _CHOICE_DTYPES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown dtype(s) {', '.join(bad)}; expected "
                                         f"{', '.join(_CHOICE_DTYPES)}")
    return names


def _describe(c: tuning.Choice) -> str:
    b = c.blocking
    return (f"{c.kernel}{' on widened copy' if c.weight_form == 'widened' else ''} "
            f"rows={b.rows} chunk={b.chunk_bytes >> 10}K split={b.split}"
            + (f" k_block={b.k_block}" if b.k_block else "") + f" thr={c.threads}")


def tune_lines(results: list, extra: tuple = ()) -> list:
    """The table ``python -m qkern tune`` prints, one row per tuned key.

    Parameters
    ----------
    results : list of (key, qkern.tuning.Choice)
        As :func:`qkern.tune` returns them.
    extra : tuple of (header, cells)
        More columns: a header and one cell per key each (the exhaustive
        sweep's best and the tuned choice's time over it; the choice
        without a widened copy and the time with it over without).

    Returns
    -------
    list of str
    """
    rows = []
    for i, ((dtype, m, n, k, threads, group_size), c) in enumerate(results):
        rows.append((dtype, f"int4 g{group_size}" if group_size else "int8", str(m), str(n),
                     str(k), str(threads), c.static_kernel, f"{c.static_seconds * 1e3:.3f}",
                     _describe(c), f"{c.seconds * 1e3:.3f}", f"{c.gain:.2f}",
                     str(c.candidates), f"{c.tuning_seconds:.2f}")
                    + tuple(cells[i] for _, cells in extra))
    header = ("dtype", "weight", "M", "N", "K", "thr", "static kernel", "static ms",
              "tuned choice", "tuned ms", "gain", "cands", "tune s")
    return _table_lines(header + tuple(h for h, _ in extra), rows)


def _widened_mib(key: tuple, c: tuning.Choice) -> str:
    """The MiB of the widened copy a choice runs on, or "-"."""
    if c.weight_form != "widened":
        return "-"
    _, _, n, k, _, _ = key
    return f"{qkern.dispatch.widened_nbytes(qkern.dispatch.get_kernel(c.kernel), n, k) / 2**20:.0f}"


def _bytes_arg(text: str) -> int:
    """A byte count: an int, or with a K, M or G suffix (powers of 1024)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    try:
        value = int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected bytes such as 512M or 2G, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected bytes >= 0, got {text!r}")
    return value


def add_bench_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the options of ``python -m qkern bench``: ``--quick``, ``--threads``, ``--json``.

    ``benchmarks/woq_bench.py`` adds the same to its own.

    Parameters
    ----------
    parser : argparse.ArgumentParser

    Returns
    -------
    argparse.ArgumentParser
        ``parser``.
    """
    parser.add_argument("--quick", action="store_true",
                        help="fewer and smaller problems (under a minute on two cores)")
    parser.add_argument("--threads", type=_thread_list, metavar="N[,N...]",
                        help="thread counts, each measured in turn; the kernels table runs on "
                             "the last (default: all cores)")
    parser.add_argument("--json", type=output_path, metavar="FILE",
                        help="also write the roofline and every row to FILE as JSON")
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m qkern`` argument parser, one subcommand per action.

    Returns
    -------
    argparse.ArgumentParser
        With the subcommands ``info``, ``bench`` and ``tune``.
    """
    parser = argparse.ArgumentParser(prog="python -m qkern",
                                     description="qkern: quantized CPU kernels for NumPy.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    sub.add_parser("info", help="versions, CPU features, ISA, threads, kernel registry",
                   description="Show what qkern sees on this machine.")
    add_bench_arguments(sub.add_parser(
        "bench", help="measure this machine's roofline and time each kernel",
        description="Measure this machine's DRAM bandwidth and instruction peaks, and time "
                    "every kernel this CPU runs against the portable reference (on the "
                    "last thread count).",
        epilog="The comparison with NumPy and PyTorch, the end-to-end MLP and the plot: "
               "python benchmarks/woq_bench.py in qkern's source tree."))
    tune_parser = sub.add_parser(
        "tune", help="tune shapes ahead of time and show what won",
        description="Tune every (M, N, K) of the shapes for each dtype and thread count "
                    "(qkern.tuning: verified candidates, results kept in the tuning file), "
                    "and print what won, by how much over the static rule, and the cost.")
    tune_parser.add_argument("--shapes", type=_shape_list, nargs="+", metavar="NxK",
                             default=[(4096, 4096), (11008, 4096), (4096, 11008)],
                             help="weight shapes (default: the bench grid)")
    tune_parser.add_argument("--m", type=_thread_list, metavar="M[,M...]",
                             default=[1, 4, 16, 32, 64, 128, 256, 1024],
                             help="rows of activations (default: the bench grid)")
    tune_parser.add_argument("--dtypes", type=_dtype_list, default=["bfloat16", "float32"],
                             metavar="D[,D...]", help="activation dtypes")
    tune_parser.add_argument("--threads", type=_thread_list, metavar="N[,N...]",
                             help="thread counts (default: the count a call uses, OpenMP's)")
    tune_parser.add_argument("--int4-group", type=int, default=0, metavar="G",
                             choices=(0, 32, 64, 128, 256),
                             help="tune int4 weights in groups of G (qkern.Int4Linear) instead "
                                  "of int8")
    tune_parser.add_argument("--exhaustive", action="store_true",
                             help="also time every candidate of the search space, and show the "
                                  "tuned choice's time over the sweep's best")
    tune_parser.add_argument("--memory-budget", type=_bytes_arg, default=0, metavar="BYTES",
                             help="let a layer hold a copy of its weight widened beforehand of "
                                  "up to BYTES (e.g. 512M; WoqLinear's memory_budget), and show "
                                  "the choice without it, the time with over without (side by "
                                  "side) and the copy's size")
    return parser


def main(argv=None) -> int:
    """Run the command line.

    Parameters
    ----------
    argv : list of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        Exit status.
    """
    args = build_parser().parse_args(argv)
    if args.command == "info":
        print(info())
    elif args.command == "tune":
        shapes = [(m, n, k) for n, k in args.shapes for m in args.m]
        threads = args.threads  # None: the count a call would use (qkern.tune)
        group = args.int4_group
        if group and any(k % group for _, k in args.shapes):
            build_parser().error(f"--int4-group {group}: every K of --shapes must be a "
                                 "multiple of it")
        budget = args.memory_budget
        results = qkern.tune(shapes, args.dtypes, threads, progress=True, group_size=group,
                             memory_budget=budget)
        extra = []
        if args.exhaustive:
            sweep = qkern.tune(shapes, args.dtypes, threads, exhaustive=True, progress=True,
                               group_size=group, memory_budget=budget)
            extra += [("sweep's best", [_describe(best) for _, best in sweep]),
                      ("tuned / best", [f"{tuning.compare(key, c, best):.3f}"
                                        for (key, c), (_, best) in zip(results, sweep)])]
        if budget:
            packed = qkern.tune(shapes, args.dtypes, threads, group_size=group)
            extra += [("without widened copy", [_describe(c) for _, c in packed]),
                      ("with / without", [f"{tuning.compare(key, c, p):.3f}"
                                          for (key, c), (_, p) in zip(results, packed)]),
                      ("copy MiB", [_widened_mib(key, c) for key, c in results])]
        print(f"tuning file: {tuning.cache_path()}")
        print("\n".join(tune_lines(results, tuple(extra))))
        spent = sorted(c.tuning_seconds for _, c in results)
        if spent:
            print(f"tuning time per key: median {spent[len(spent) // 2]:.2f} s, "
                  f"max {spent[-1]:.2f} s (as measured when each key was tuned)")
    else:
        bench.run(quick=args.quick, threads=args.threads, json_path=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
