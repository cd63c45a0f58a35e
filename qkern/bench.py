"""Wall-clock benchmark of the int8 weight-only GEMM, ``python -m qkern bench``.

Everything is measured in this one run, side by side:

``roofline``
    DRAM read bandwidth and the peak rate of each instruction the kernels
    use (``vfmadd231ps``, ``vdpbf16ps``, ``tdpbf16ps``), from the C loops of
    :mod:`qkern.roofline`, for each thread count benchmarked.

``kernels``
    Each registry kernel this process may run, forced through
    ``qkern.WoqLinear(w, scales, kernel=name)``, on M = 1 and M = 64, with its
    speedup over the portable reference ``f32_gemm_4x16c1__ref``: shows that
    each SIMD kernel does the work.

``peers``
    The grid of LLM-like shapes: ``qkern.WoqLinear`` in bfloat16, float16 and
    float32 (weight packed once, kernel chosen automatically),
    ``qkern.weight_int8pack_mm`` (packs on every call; quick grid only),
    NumPy dequantize-then-matmul in float32 (dequantization timed too), and
    when PyTorch is installed ``torch._weight_int8pack_mm`` (where K is a
    multiple of 16: PyTorch 2.13's kernel crashes on other K) and dense
    bfloat16 ``torch.mm``.  Weights are cold: every timed call uses the next
    of several copies whose total exceeds the last-level cache.

``torch_mlp`` (``--torch``)
    An MLP 4096-11008-4096-11008-4096 in bfloat16, end to end through
    PyTorch at batch 1 and 32: after ``qkern.torch.swap_linears``, through
    ``torch._weight_int8pack_mm`` per layer (the same int8 weights), and
    dense ``nn.Linear``; each with its time relative to the qkern path.

Each row: median time of one call with min and max, GFLOP/s, weight GB/s
(bytes of the weight / t), % of the roofline (the larger of weight bytes /
bandwidth and flops / the peak of the kernel's instruction, over t), and each peer's
time over qkern's (bfloat16) on the same shape.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import itertools
import json
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

import qkern
from qkern import roofline
from qkern._dtypes import bfloat16
from qkern.dispatch import CPU_ISA, ISA_CAP

__all__ = ["Timing", "time_call", "all_cores", "kernels_table", "peers_table", "mlp_table", "run"]

REFERENCE = "f32_gemm_4x16c1__ref"

_DTYPES = {"bfloat16": bfloat16, "float16": np.dtype(np.float16),
           "float32": np.dtype(np.float32)}

_KERNELS_MS = (1, 64)
_KERNELS_NK = {True: 2048, False: 4096}
_PEER_MS = {True: (1, 16, 128), False: (1, 4, 16, 32, 64, 128, 256, 1024)}
_PEER_SHAPES = {True: [(4096, 4096)],
                False: [(4096, 4096), (11008, 4096), (4096, 11008)]}
# Odd shapes: (M, N, K), each timed beside its aligned twin (aligned_twin).
_ODD_SHAPES = {True: [], False: [(7, 1000, 4095), (33, 4097, 1023)]}


def aligned_twin(m: int, n: int, k: int) -> tuple:
    """The nearest aligned shape of an odd one: M to the nearest power of two,
    N and K to the nearest multiples of 32 (one panel, one AMX chunk)."""
    def nearest(v, step):
        return max(step, (v + step // 2) // step * step)
    return 2 ** round(np.log2(m)), nearest(n, 32), nearest(k, 32)

# torch._weight_int8pack_mm is timed only where K is a multiple of this:
# PyTorch 2.13's CPU kernel loads each weight row with aligned 16-byte loads
# (no K tail) and dies of a segmentation fault on other K.
TORCH_INT8_K_MULTIPLE = 16

@dataclass(frozen=True)
class Timing:
    """Seconds per call over the timed repetitions (warm-up excluded)."""

    median: float
    min: float
    max: float
    reps: int


def time_call(fn, *, warmup: int = 2, budget: float = 0.3, min_reps: int = 5,
              slow_reps: int = 3) -> Timing:
    """Time ``fn()`` with ``time.perf_counter``.

    Parameters
    ----------
    fn : callable
        Called with no arguments.
    warmup : int
        Untimed calls first; the last of them estimates the cost of a call.
    budget : float
        Seconds of timed calls to aim for: calls repeat until ``budget``
        seconds have passed and at least ``min_reps`` calls were made.
    min_reps : int
        Fewest timed calls for a fast ``fn``.
    slow_reps : int
        Timed calls for a slow ``fn``, one whose last warm-up call alone
        took longer than ``budget``.

    Returns
    -------
    Timing
        Median, min and max seconds per call and the number of calls timed.
    """
    estimate = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        fn()
        estimate = time.perf_counter() - t0
    slow = estimate > budget
    times = []
    while True:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if slow and len(times) >= slow_reps:
            break
        if not slow and len(times) >= min_reps and sum(times) >= budget:
            break
    return Timing(statistics.median(times), min(times), max(times), len(times))


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


def _rotating(items: list):
    """A zero-argument callable returning the next of ``items`` on each call."""
    cycle = itertools.cycle(items)
    return lambda: next(cycle)


def copies_for_cold(nbytes: int) -> int:
    """How many copies of an ``nbytes`` operand exceed the last-level cache 1.5 times."""
    return max(2, -(-3 * roofline.last_level_cache_bytes() // (2 * max(nbytes, 1))))


def _row(table: str, name: str, dtype: str, m: int, n: int, k: int, t: Timing,
         weight_bytes: int, **extra) -> dict:
    """One result as a flat dict (the JSON form): problem, timing and rates."""
    return {
        "table": table, "name": name, "dtype": dtype, "M": m, "N": n, "K": k, **extra,
        "median_ms": t.median * 1e3, "min_ms": t.min * 1e3, "max_ms": t.max * 1e3,
        "reps": t.reps,
        "gflops": 2.0 * m * n * k / t.median / 1e9,
        "weight_gbs": weight_bytes / t.median / 1e9,
    }


def _random_problem(rng, m: int, n: int, k: int, dtype) -> tuple:
    """``(x, w, scales)``: x standard normal, w uniform int8, scales in [0.001, 0.01]."""
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    scales = rng.uniform(0.001, 0.01, n).astype(dtype)
    return x, w, scales


def _format_table(title: str, columns: list, rows: list) -> str:
    """Render ``rows`` (dicts) as a text table.

    ``columns`` holds ``(header, key, format)`` triples; a missing value or
    None prints as an empty cell.
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


_TIME_COLUMNS = [
    ("median ms", "median_ms", "{:.3f}"),
    ("min ms", "min_ms", "{:.3f}"),
    ("max ms", "max_ms", "{:.3f}"),
    ("reps", "reps", "{}"),
    ("GFLOP/s", "gflops", "{:.1f}"),
    ("weight GB/s", "weight_gbs", "{:.2f}"),
]

KERNELS_COLUMNS = [("kernel", "name", "{}"), ("isa", "isa", "{}"), ("dtype", "dtype", "{}"),
                   ("M", "M", "{}")] + _TIME_COLUMNS + [("x ref", "speedup_vs_ref", "{:.1f}")]

PEERS_COLUMNS = [("peer", "name", "{}"), ("thr", "threads", "{}"), ("M", "M", "{}"),
                 ("N", "N", "{}"), ("K", "K", "{}"), ("kernel", "kernel", "{}")] + \
    _TIME_COLUMNS + [("% roof", "pct_roofline", "{:.0f}"),
                     ("t / qkern", "ratio_vs_qkern", "{:.2f}"),
                     ("GFLOP/s / twin's", "vs_aligned_twin", "{:.2f}")]


def kernels_table(threads: int, quick: bool) -> list:
    """Time every available registry kernel against the reference kernel.

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
        median / kernel median, same dtype and M).
    """
    n = k = _KERNELS_NK[quick]
    rng = np.random.default_rng(0)
    rows = []
    for dtype_name in ("bfloat16", "float32"):
        x_max, w, scales = _random_problem(rng, max(_KERNELS_MS), n, k, _DTYPES[dtype_name])
        kernels = [kern for kern in qkern.kernels()
                   if kern.available and dtype_name in kern.dtypes]
        kernels.sort(key=lambda kern: kern.name != REFERENCE)
        ref_median = {}
        for kern in kernels:
            layer = qkern.WoqLinear(w, scales, kernel=kern.name)
            for m in _KERNELS_MS:
                x = x_max[:m]
                t = time_call(lambda: layer(x, num_threads=threads))
                if kern.name == REFERENCE:
                    ref_median[m] = t.median
                rows.append(_row("kernels", kern.name, dtype_name, m, n, k, t, n * k,
                                 isa=kern.isa, threads=threads,
                                 speedup_vs_ref=ref_median[m] / t.median))
    return rows


def _to_torch(torch, a: np.ndarray):
    """A torch tensor holding a copy of ``a`` (bfloat16 via its bits).

    Copied because torch's kernel assumes aligned storage, which a tensor
    over NumPy memory need not have.
    """
    if a.dtype == bfloat16:
        return torch.from_numpy(a.view(np.int16)).clone().view(torch.bfloat16)
    return torch.from_numpy(a).clone()


def _roofline_seconds(roof, kern, dtype: str, m: int, n: int, k: int, threads: int) -> float:
    """The roofline's time for one call of ``kern``: max(weight bytes / bandwidth,
    flops / the peak of its instruction), flops counting each bf16 plane of a
    split float16/float32 activation."""
    flops = 2.0 * m * n * k * kern.planes(dtype)
    return max(n * k / (roof.median_bandwidth(threads) * 1e9),
               flops / (roof.median_peak(kern.bound_by, threads) * 1e9))


class _Problem:
    """Cold operands of one (N, K) shape for every peer: copies over the LLC."""

    def __init__(self, rng, n: int, k: int, m_max: int, torch):
        self.n, self.k = n, k
        copies = copies_for_cold(n * k)
        x, w, scales = _random_problem(rng, m_max, n, k, bfloat16)
        self.w, self.scales = w, scales
        self.x = {name: x.astype(dt) for name, dt in _DTYPES.items()}
        self.layers = {name: _rotating([qkern.WoqLinear(w, scales.astype(dt))
                                        for _ in range(copies)])
                       for name, dt in _DTYPES.items()}
        self.copies = copies
        self.torch = None
        if torch is not None:
            tw = _to_torch(torch, w)
            self.torch = {
                "x": _to_torch(torch, x),
                "s": _to_torch(torch, scales),
                "w": _rotating([tw.clone() for _ in range(copies)]),
                # (K, N) views of row-major (N, K) bf16 weights, as nn.Linear uses them
                "dense": _rotating([(tw.to(torch.bfloat16) * 0.01).t()
                                    for _ in range(max(2, copies // 2))]),
            }

    def calls(self, m: int, threads: int, quick: bool) -> dict:
        """``{peer: (dtype, kernel name or None, weight bytes, callable)}`` for M rows."""
        out = {}
        for name, dt in _DTYPES.items():
            x, layers = self.x[name][:m], self.layers[name]
            out[f"qkern {name}"] = (name, layers().kernel_for(m).name, self.n * self.k,
                                    lambda x=x, layers=layers: layers()(x, num_threads=threads))
        xb = self.x["bfloat16"][:m]
        if quick:
            out["qkern.weight_int8pack_mm"] = (
                "bfloat16", None, self.n * self.k,
                lambda: qkern.weight_int8pack_mm(xb, self.w, self.scales, num_threads=threads))
        s_col = self.scales.astype(np.float32)[:, None]
        out["numpy f32 dequant+matmul"] = (
            "bfloat16", None, self.n * self.k,
            lambda: xb.astype(np.float32) @ (self.w.astype(np.float32) * s_col).T)
        if self.torch is not None:
            import torch

            tx, ts, tw, dense = (self.torch[key] for key in ("x", "s", "w", "dense"))
            tx = tx[:m].clone()
            if self.k % TORCH_INT8_K_MULTIPLE == 0:
                out["torch._weight_int8pack_mm"] = (
                    "bfloat16", None, self.n * self.k,
                    lambda: torch._weight_int8pack_mm(tx, tw(), ts))
            out["torch.mm bf16 dense"] = ("bfloat16", None, 2 * self.n * self.k,
                                          lambda: torch.mm(tx, dense()))
        return out


def peers_table(threads: int, quick: bool, roof, torch=None) -> list:
    """Time qkern against NumPy and PyTorch on the grid, weights cold.

    Parameters
    ----------
    threads : int
        ``num_threads`` for qkern; torch and NumPy's BLAS are set to the same
        count by the caller.
    quick : bool
        M in {1, 16, 128} on (4096, 4096) when true; else the full grid of
        M in {1, 4, 16, 32, 64, 128, 256, 1024} on (4096, 4096),
        (11008, 4096), (4096, 11008), and the odd shapes each beside its
        :func:`aligned_twin`.
    roof : qkern.roofline.Roofline
        Measured in the same run, for the % of roofline.
    torch : module, optional
        PyTorch, to add its int8 op and dense bfloat16 mm as peers.

    Returns
    -------
    list of dict
        One row per (shape, M, peer), with ``ratio_vs_qkern`` (peer median /
        ``qkern bfloat16`` median), for qkern ``pct_roofline``, and for an odd
        shape ``vs_aligned_twin`` (its GFLOP/s over the same peer's on the
        aligned twin).
    """
    rng = np.random.default_rng(0)
    problems = [((n, k), _PEER_MS[quick]) for n, k in _PEER_SHAPES[quick]]
    odd = {}  # (m, n, k) of an odd shape -> its aligned twin
    for shape in _ODD_SHAPES[quick]:
        odd[shape] = twin = aligned_twin(*shape)
        problems += [((twin[1], twin[2]), (twin[0],)), ((shape[1], shape[2]), (shape[0],))]
    rows = []
    for (n, k), ms in problems:
        prob = _Problem(rng, n, k, max(ms), torch)
        for m in ms:
            ours = None
            for name, (dtype, kernel, wbytes, fn) in prob.calls(m, threads, quick).items():
                t = time_call(fn)
                ours = ours or t.median  # the first peer is qkern bfloat16
                row = _row("peers", name, dtype, m, n, k, t, wbytes, kernel=kernel,
                           threads=threads, copies=prob.copies,
                           ratio_vs_qkern=t.median / ours)
                if name.startswith("qkern "):
                    kern = qkern.dispatch.get_kernel(kernel)
                    row["pct_roofline"] = 100 * _roofline_seconds(roof, kern, dtype, m, n, k,
                                                                  threads) / t.median
                rows.append(row)
        del prob
    gflops = {(r["name"], r["M"], r["N"], r["K"]): r["gflops"] for r in rows}
    for r in rows:
        twin = odd.get((r["M"], r["N"], r["K"]))
        if twin is not None:
            r["vs_aligned_twin"] = r["gflops"] / gflops[(r["name"], *twin)]
    return rows


def _load_torch():
    """``(torch or None, note)``: PyTorch, if installed and it has the int8 op."""
    if importlib.util.find_spec("torch") is None:
        return None, "not installed: its rows are skipped"
    import torch

    if not hasattr(torch, "_weight_int8pack_mm"):
        return None, f"{torch.__version__} has no _weight_int8pack_mm: its rows are skipped"
    return torch, (f"{torch.__version__} (its _weight_int8pack_mm timed only where "
                   f"K % {TORCH_INT8_K_MULTIPLE} == 0: its CPU kernel crashes on other K)")


@contextlib.contextmanager
def _blas_threads(threads: int):
    """Limit NumPy's BLAS to ``threads`` threads in the block (needs threadpoolctl)."""
    if importlib.util.find_spec("threadpoolctl") is None:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads, user_api="blas"):
        yield


def roofline_lines(roof) -> list:
    """The measured roofline as text lines (median and min-max per thread count)."""
    def fmt(values):
        return f"{statistics.median(values):7.1f} ({min(values):.1f}-{max(values):.1f})"

    lines = ["Roofline measured in this run (median (min-max)):"]
    for t, values in roof.bandwidth.items():
        lines.append(f"  DRAM read, {t} thread(s): {fmt(values)} GB/s")
    for name, per_threads in roof.peaks.items():
        for t, values in per_threads.items():
            lines.append(f"  {name:16s} {t} thread(s): {fmt(values)} GFLOP/s")
    return lines


def _header(thread_counts: list, quick: bool, torch_note: str, roof) -> str:
    """The lines printed above the tables: machine, threads, peers, roofline."""
    features = [name for name, on in qkern.cpu_features().items() if on]
    llc = roofline.last_level_cache_bytes()
    return "\n".join([
        f"qkern {qkern.__version__} bench, {'quick' if quick else 'full'}; numpy {np.__version__}",
        f"CPU features: {' '.join(features) or 'none of the listed'}",
        f"ISA: this CPU {CPU_ISA}, cap {ISA_CAP}; threads: {thread_counts} of "
        f"{all_cores()} core(s); torch: {torch_note}",
        f"load average (1 min) at start: {os.getloadavg()[0]:.2f}",
        f"Weights cold: each timed call uses the next of several copies totalling over "
        f"1.5x the {llc / 2**20:.0f} MiB last-level cache.",
        "Times per call: median of the timed reps (after 2 warm-up calls), min, max.",
        *roofline_lines(roof),
    ])


def plot(rows: list, path: str) -> None:
    """Draw % of roofline and speedup over each peer against M, one panel per shape.

    Needs matplotlib (``pip install matplotlib``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = [r for r in rows if r["table"] == "peers"]
    shapes = sorted({(r["N"], r["K"]) for r in peers if len({q["M"] for q in peers
                     if (q["N"], q["K"]) == (r["N"], r["K"])}) > 1})
    fig, axes = plt.subplots(2, len(shapes), figsize=(5 * len(shapes), 8), squeeze=False)
    for col, (n, k) in enumerate(shapes):
        sel = [r for r in peers if (r["N"], r["K"]) == (n, k)]
        for thr in sorted({r["threads"] for r in sel}):
            for name in sorted({r["name"] for r in sel}):
                pts = sorted((r["M"], r) for r in sel if r["name"] == name and r["threads"] == thr)
                ms = [m for m, _ in pts]
                if name.startswith("qkern "):
                    axes[0][col].plot(ms, [r["pct_roofline"] for _, r in pts], marker="o",
                                      label=f"{name}, {thr} thr")
                elif pts:
                    axes[1][col].plot(ms, [r["ratio_vs_qkern"] for _, r in pts], marker="o",
                                      label=f"{name}, {thr} thr")
        for ax, ylabel in ((axes[0][col], "% of roofline"),
                           (axes[1][col], "peer time / qkern bf16 time")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("M")
            ax.set_ylabel(ylabel)
            ax.set_title(f"N={n}, K={k}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6)
        axes[1][col].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(*, quick: bool = False, threads=None, json_path: str | None = None,
        plot_path: str | None = None, torch_mlp: bool = False) -> list:
    """Measure the roofline, then run the kernels and peers tables.

    Parameters
    ----------
    quick : bool
        The small grid (about a minute on two cores).
    threads : int or list of int, optional
        Thread counts for qkern, torch and NumPy's BLAS, each benchmarked in
        turn; default: all cores.
    json_path : str, optional
        Also write the roofline and every row, as JSON, to this file.
    plot_path : str, optional
        Also draw :func:`plot` into this PNG file.
    torch_mlp : bool
        Also run :func:`mlp_table`, the end-to-end MLP through PyTorch
        (which must be installed), with the last thread count.

    Returns
    -------
    list of dict
        All rows.
    """
    thread_counts = [threads] if isinstance(threads, int) else list(threads or [all_cores()])
    start = time.perf_counter()
    torch, torch_note = _load_torch()
    if torch_mlp and torch is None:
        raise SystemExit(f"bench --torch needs PyTorch: torch {torch_note}")
    roof = roofline.measure(tuple(thread_counts))
    print(_header(thread_counts, quick, torch_note, roof), end="\n\n", flush=True)
    rows = kernels_table(thread_counts[-1], quick)
    print(_format_table(f"Table 1 - kernels, {thread_counts[-1]} thread(s) "
                        f"(speedup vs {REFERENCE}, same dtype and M)",
                        KERNELS_COLUMNS, rows), end="\n\n", flush=True)
    for t in thread_counts:
        if torch is not None:
            torch.set_num_threads(t)
        with _blas_threads(t):
            peers = peers_table(t, quick, roof, torch)
        print(_format_table(f"Table 2 - peers, {t} thread(s) (t / qkern: over qkern bfloat16's "
                            "median on the same shape)", PEERS_COLUMNS, peers),
              end="\n\n", flush=True)
        rows += peers
    if torch_mlp:
        mlp = mlp_table(thread_counts[-1], torch)
        print(_format_table(_mlp_title(), MLP_COLUMNS, mlp), end="\n\n", flush=True)
        rows += mlp
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"roofline": {"bandwidth_gbs": roof.bandwidth, "peaks_gflops": roof.peaks},
                       "rows": rows}, f, indent=1)
        print(f"wrote {len(rows)} rows to {json_path}")
    if plot_path:
        plot(rows, plot_path)
        print(f"wrote {plot_path}")
    print(f"total {time.perf_counter() - start:.1f} s; "
          f"load average (1 min) at end: {os.getloadavg()[0]:.2f}")
    return rows


# ---- End-to-end MLP through PyTorch: python -m qkern bench --torch ------------------

MLP_WIDTHS = (4096, 11008, 4096, 11008, 4096)
MLP_BATCHES = (1, 32)
_MLP_WEIGHTS = sum(k * n for k, n in zip(MLP_WIDTHS, MLP_WIDTHS[1:]))  # int8 bytes

MLP_COLUMNS = [("path", "name", "{}"), ("batch", "M", "{}")] + _TIME_COLUMNS + [
    ("t / qkern", "ratio_vs_qkern", "{:.2f}"), ("max |y - y_qkern| / max |y_qkern|",
                                                 "rel_diff_vs_qkern", "{:.2g}")]


def _mlp_paths(torch) -> dict:
    """``{path name: model}`` for the bfloat16 MLP of widths ``MLP_WIDTHS``, ReLU between.

    The quantized paths share one set of int8 weights and scales
    (:func:`qkern.torch.quantize_per_channel` of the float weights).
    """
    import qkern.torch as qt

    torch.manual_seed(0)
    layers = []
    for k, n in zip(MLP_WIDTHS, MLP_WIDTHS[1:]):
        layers += [torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16), torch.nn.ReLU()]
    dense = torch.nn.Sequential(*layers[:-1])
    quantized = [qt.quantize_per_channel(m.weight, torch.bfloat16)
                 for m in dense if isinstance(m, torch.nn.Linear)]

    def torch_woq(x):
        for i, (q, s) in enumerate(quantized):
            x = torch._weight_int8pack_mm(x, q, s)
            x = torch.relu(x) if i < len(quantized) - 1 else x
        return x

    return {"qkern.torch.swap_linears": qt.swap_linears(copy.deepcopy(dense)),
            "torch._weight_int8pack_mm": torch_woq,
            "torch nn.Linear bf16 (dense)": dense}


def _mlp_title() -> str:
    """Title of the MLP table: the model, its weight bytes and this machine's last-level cache."""
    weights = _MLP_WEIGHTS / 2**20
    cache = f"; last-level cache {roofline.last_level_cache_bytes() / 2**20:.0f} MiB"
    return (f"Table 3 - MLP {'-'.join(map(str, MLP_WIDTHS))}, ReLU between, bfloat16, end to end "
            f"through PyTorch (t / qkern: median over swap_linears')\nweights {weights:.0f} MiB "
            f"in int8, {2 * weights:.0f} MiB in bfloat16{cache}")


def mlp_table(threads: int, torch) -> list:
    """Time the MLP of ``MLP_WIDTHS`` (bfloat16, no bias) through three paths.

    The paths: the model after :func:`qkern.torch.swap_linears`, PyTorch's
    own WoQ path (``torch._weight_int8pack_mm`` per layer, same int8 weights)
    and the dense bfloat16 model. The weights total 172 MiB in int8 (344 MiB
    in bfloat16); where the last-level cache holds them, the figures are
    partly cache-resident.

    Parameters
    ----------
    threads : int
        Set in torch by the caller (``torch.set_num_threads``); the qkern
        custom ops use ``torch.get_num_threads()``.
    torch : module
        PyTorch.

    Returns
    -------
    list of dict
        One row per (batch, path); GFLOP/s and weight GB/s count every layer
        (``2 * M * sum(N*K)`` and ``sum(N*K)`` int8 bytes), ``ratio_vs_qkern``
        is the path's median over the qkern path's, and ``rel_diff_vs_qkern``
        the largest difference of its output from qkern's, relative to the
        largest output.
    """
    paths = _mlp_paths(torch)
    rows = []
    with torch.inference_mode():
        for m in MLP_BATCHES:
            x = torch.randn(m, MLP_WIDTHS[0]).to(torch.bfloat16)
            for name, model in paths.items():
                t = time_call(lambda: model(x))
                y = model(x).float()
                if name == "qkern.torch.swap_linears":  # the first path
                    ours, y_ours = t.median, y
                row = _row("torch_mlp", name, "bfloat16", m, MLP_WIDTHS[-1], MLP_WIDTHS[0], t,
                           _MLP_WEIGHTS, threads=threads, widths=list(MLP_WIDTHS),
                           ratio_vs_qkern=t.median / ours,
                           rel_diff_vs_qkern=float((y - y_ours).abs().max() / y_ours.abs().max()))
                row.update(gflops=2.0 * m * _MLP_WEIGHTS / t.median / 1e9)
                rows.append(row)
    return rows
