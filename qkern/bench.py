"""``python -m qkern bench``: this machine's roofline and each of qkern's kernels.

Measured in one run:

``roofline``
    DRAM read bandwidth and the peak rate of each instruction the kernels
    use (``vfmadd231ps``, ``vdpbf16ps``, ``tdpbf16ps``), from the C loops of
    :mod:`qkern.roofline`, for each thread count.

``kernels``
    Each registry kernel this process may run, forced through
    ``qkern.WoqLinear(w, scales, kernel=name)``, on M = 1 and M = 64, with its
    speedup over the portable reference ``f32_gemm_4x16c1__ref``: shows that
    each SIMD kernel does the work.

Each row: median time of one call with min and max (:func:`qkern.timing.time_call`),
GFLOP/s and weight GB/s (bytes of the weight / t). The comparison with
NumPy and PyTorch, the end-to-end MLP and the plot are the full benchmark,
``benchmarks/woq_bench.py`` in the source tree, which prints these tables
first through :func:`report`.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np

import qkern
from qkern import roofline
from qkern._dtypes import DTYPES
from qkern.dispatch import CPU_ISA, INT4, INT8, ISA_CAP
from qkern.timing import WARMUP, Timing, time_call

__all__ = ["DTYPES", "TIME_COLUMNS", "all_cores", "thread_counts", "random_problem",
           "int4_group_size", "random_int4_layer", "layer_weight_bytes", "result_row",
           "format_table", "print_table", "kernels_table", "roofline_lines", "header", "report",
           "write_json", "closing_line", "run"]

# The reference kernel each weight format's kernels are measured against.
REFERENCES = {INT8: "f32_gemm_4x16c1__ref", INT4: "f32_qb4w_gemm_4x32c1__ref"}
# k per scale of the int4 rows (the usual choice for LLM weights)
INT4_GROUP_SIZE = 128


_KERNELS_MS = (1, 64)
_KERNELS_NK = {True: 2048, False: 4096}


def all_cores() -> int:
    """Number of CPUs this process may run on.

    Returns
    -------
    int
        The size of the affinity mask where the OS has one, else ``os.cpu_count()``.
    """
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def thread_counts(threads=None) -> list:
    """The thread counts to measure with.

    Parameters
    ----------
    threads : int or list of int, optional
        Default: all cores (:func:`all_cores`).

    Returns
    -------
    list of int
    """
    return [threads] if isinstance(threads, int) else list(threads or [all_cores()])


def result_row(table: str, name: str, dtype: str, m: int, n: int, k: int, t: Timing,
               weight_bytes: int, **extra) -> dict:
    """One result as a flat dict (the JSON form): problem, timing and rates.

    Parameters
    ----------
    table : str
        The table the row belongs to (``"kernels"``, ...).
    name : str
        What was timed.
    dtype : str
        Activation dtype.
    m, n, k : int
        The problem: ``(M, K) @ (K, N)``.
    t : Timing
        Its timing.
    weight_bytes : int
        Bytes of weight one call reads.
    **extra
        Further columns, placed after ``K``.

    Returns
    -------
    dict
        With ``median_ms``, ``min_ms``, ``max_ms``, ``reps``, ``gflops``
        (2MNK / median) and ``weight_gbs`` (weight bytes / median).
    """
    return {
        "table": table, "name": name, "dtype": dtype, "M": m, "N": n, "K": k, **extra,
        "median_ms": t.median * 1e3, "min_ms": t.min * 1e3, "max_ms": t.max * 1e3,
        "reps": t.reps,
        "gflops": 2.0 * m * n * k / t.median / 1e9,
        "weight_gbs": weight_bytes / t.median / 1e9,
    }


def random_problem(rng, m: int, n: int, k: int, dtype) -> tuple:
    """``(x, w, scales)``: x standard normal, w uniform int8, scales in [0.001, 0.01].

    Parameters
    ----------
    rng : numpy.random.Generator
    m, n, k : int
        x is ``(m, k)``, w ``(n, k)``.
    dtype : numpy.dtype
        Of x and scales.

    Returns
    -------
    tuple of numpy.ndarray
    """
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    scales = rng.uniform(0.001, 0.01, n).astype(dtype)
    return x, w, scales


def format_table(title: str, columns: list, rows: list) -> str:
    """Render ``rows`` (dicts) as a text table.

    Parameters
    ----------
    title : str
        The line above the table.
    columns : list of tuple
        ``(header, key, format)`` triples; the first column is left-aligned,
        the others right-aligned.
    rows : list of dict
        A missing value or None prints as an empty cell.

    Returns
    -------
    str

    Examples
    --------
    >>> print(format_table("T", [("name", "n", "{}"), ("ms", "t", "{:.1f}")],
    ...                    [{"n": "a", "t": 1.25}, {"n": "bbbbb", "t": 10.0}]))
    T
    name     ms
    -----  ----
    a       1.2
    bbbbb  10.0
    """
    cells = [["" if r.get(key) is None else fmt.format(r[key]) for _, key, fmt in columns]
             for r in rows]
    headers = [h for h, _, _ in columns]
    widths = [max(len(c) for c in col) for col in zip(headers, *cells)]
    first, *rest = widths

    def line(values):
        return "  ".join([values[0].ljust(first)] +
                         [v.rjust(w) for v, w in zip(values[1:], rest)])

    out = [title, line(headers), line(["-" * w for w in widths])]
    out += [line(c) for c in cells]
    return "\n".join(out)


def print_table(title: str, columns: list, rows: list) -> None:
    """Print :func:`format_table` and a blank line, at once."""
    print(format_table(title, columns, rows), end="\n\n", flush=True)


TIME_COLUMNS = [
    ("median ms", "median_ms", "{:.3f}"),
    ("min ms", "min_ms", "{:.3f}"),
    ("max ms", "max_ms", "{:.3f}"),
    ("reps", "reps", "{}"),
    ("GFLOP/s", "gflops", "{:.1f}"),
    ("weight GB/s", "weight_gbs", "{:.2f}"),
]

KERNELS_COLUMNS = [("kernel", "name", "{}"), ("isa", "isa", "{}"), ("dtype", "dtype", "{}"),
                   ("M", "M", "{}")] + TIME_COLUMNS + [("x ref", "speedup_vs_ref", "{:.1f}")]


def int4_group_size(k: int) -> int:
    """The group size of the benchmarks' int4 problems with ``k`` (a multiple
    of 32) inputs: :data:`INT4_GROUP_SIZE`, or 32 where that does not divide ``k``."""
    return INT4_GROUP_SIZE if k % INT4_GROUP_SIZE == 0 else 32


def random_int4_layer(rng, n: int, k: int, dtype, kernel: str | None = None):
    """A :class:`qkern.Int4Linear` of random 4-bit values, scales in [0.001,
    0.01] and zeros in [-0.01, 0.01], groups of :func:`int4_group_size`."""
    group_size = int4_group_size(k)
    q = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    groups = k // group_size
    sz = np.stack([rng.uniform(0.001, 0.01, (groups, n)), rng.uniform(-0.01, 0.01, (groups, n))],
                  axis=-1).astype(dtype)
    return qkern.Int4Linear(qkern.pack_int4(q), group_size, sz, kernel=kernel)


def layer_weight_bytes(layer) -> int:
    """Bytes of weight a call of ``layer`` reads: the packed weight, and
    for int4 its scales and zeros."""
    if isinstance(layer, qkern.Int4Linear):
        return layer.packed_weight.nbytes + layer.scales_and_zeros.nbytes
    return layer.packed_weight.nbytes


def kernels_table(threads: int, quick: bool) -> list:
    """Time every available registry kernel against its weight format's
    reference kernel (:data:`REFERENCES`).

    Parameters
    ----------
    threads : int
        ``num_threads`` for every call.
    quick : bool
        N = K = 2048 when true, else 4096.

    Returns
    -------
    list of dict
        One row per (kernel, dtype, M), with ``speedup_vs_ref`` (reference
        median / kernel median, same weight format, dtype and M).
    """
    n = k = _KERNELS_NK[quick]
    rng = np.random.default_rng(0)
    rows = []
    for weight_format, reference in REFERENCES.items():
        for dtype_name in ("bfloat16", "float32"):
            dtype = DTYPES[dtype_name]
            x_max, w, scales = random_problem(rng, max(_KERNELS_MS), n, k, dtype)
            kernels = [kern for kern in qkern.kernels()
                       if kern.available and dtype_name in kern.dtypes
                       and kern.weight_format == weight_format]
            kernels.sort(key=lambda kern: kern.name != reference)
            ref_median = {}
            for kern in kernels:
                layer = (qkern.WoqLinear(w, scales, kernel=kern.name) if weight_format == INT8
                         else random_int4_layer(rng, n, k, dtype, kern.name))
                for m in _KERNELS_MS:
                    x = x_max[:m]
                    t = time_call(lambda: layer(x, num_threads=threads))
                    if kern.name == reference:
                        ref_median[m] = t.median
                    rows.append(result_row("kernels", kern.name, dtype_name, m, n, k, t,
                                           layer_weight_bytes(layer), isa=kern.isa,
                                           threads=threads,
                                           speedup_vs_ref=ref_median[m] / t.median))
    return rows


def roofline_lines(roof) -> list:
    """The measured roofline as text lines (median and min-max per thread count).

    Parameters
    ----------
    roof : qkern.roofline.Roofline

    Returns
    -------
    list of str
    """
    def fmt(values):
        return f"{statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f})"

    lines = ["Roofline measured in this run (median (min-max)):"]
    for t, values in roof.bandwidth.items():
        lines.append(f"  DRAM read, {t} thread(s): {fmt(values)} GB/s")
    for name, per_threads in roof.peaks.items():
        for t, values in per_threads.items():
            lines.append(f"  {name:16s} {t} thread(s): {fmt(values)} GFLOP/s")
    return lines


def header(threads: list, quick: bool, roof, notes=()) -> str:
    """The lines printed above the tables: machine, threads, notes, roofline.

    Parameters
    ----------
    threads : list of int
        The thread counts of the run.
    quick : bool
        Whether the run is the quick one.
    roof : qkern.roofline.Roofline
        Measured in the run.
    notes : sequence of str
        Further lines, placed after the load average.

    Returns
    -------
    str
    """
    features = [name for name, on in qkern.cpu_features().items() if on]
    return "\n".join([
        f"qkern {qkern.__version__} bench, {'quick' if quick else 'full'}; numpy {np.__version__}",
        f"CPU features: {' '.join(features) or 'none of the listed'}",
        f"ISA: this CPU {CPU_ISA}, cap {ISA_CAP}; threads: {threads} of {all_cores()} core(s)",
        f"load average (1 min) at start: {os.getloadavg()[0]:.2f}",
        *notes,
        f"Times per call: median of the timed reps (after {WARMUP} warm-up calls), min, max.",
        *roofline_lines(roof),
    ])


def report(threads: list, quick: bool, notes=()) -> tuple:
    """Measure the roofline, print it under the header, then time and print the kernels table.

    Parameters
    ----------
    threads : list of int
        The roofline is measured for each; the kernels run on the last.
    quick : bool
        The smaller kernels problem (:func:`kernels_table`).
    notes : sequence of str
        Further header lines (:func:`header`).

    Returns
    -------
    roof : qkern.roofline.Roofline
        The roofline measured.
    rows : list of dict
        The kernels table's rows.
    """
    roof = roofline.measure(tuple(threads))
    print(header(threads, quick, roof, notes), end="\n\n", flush=True)
    rows = kernels_table(threads[-1], quick)
    print_table(f"Table 1 - kernels, {threads[-1]} thread(s) (speedup vs the reference "
                f"kernel of the same weight format, dtype and M: "
                f"{', '.join(REFERENCES.values())}; int4 in groups of {INT4_GROUP_SIZE})",
                KERNELS_COLUMNS, rows)
    return roof, rows


def write_json(path: str, roof, rows: list) -> None:
    """Write the roofline and ``rows`` to ``path`` as JSON and say so.

    Parameters
    ----------
    path : str
        The file, replaced.
    roof : qkern.roofline.Roofline
        Written as ``{"bandwidth_gbs": ..., "peaks_gflops": ...}``.
    rows : list of dict
        Written as they are, under ``"rows"``.
    """
    with open(path, "w") as f:
        json.dump({"roofline": {"bandwidth_gbs": roof.bandwidth, "peaks_gflops": roof.peaks},
                   "rows": rows}, f, indent=1)
    print(f"wrote {len(rows)} rows to {path}")


def closing_line(start: float) -> str:
    """The last line of a run: seconds since ``start`` (``time.perf_counter()``) and the load."""
    return (f"total {time.perf_counter() - start:.1f} s; "
            f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")


def run(*, quick: bool = False, threads=None, json_path: str | None = None) -> list:
    """Measure and print the roofline and the kernels table.

    Parameters
    ----------
    quick : bool
        N = K = 2048 for the kernels table (else 4096).
    threads : int or list of int, optional
        Thread counts: the roofline is measured for each, the kernels run
        on the last; default: all cores.
    json_path : str, optional
        Also write the roofline and every row, as JSON, to this file.

    Returns
    -------
    list of dict
        All rows.
    """
    start = time.perf_counter()
    roof, rows = report(thread_counts(threads), quick)
    if json_path:
        write_json(json_path, roof, rows)
    print(closing_line(start))
    return rows
