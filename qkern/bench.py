"""Wall-clock benchmark of the int8 weight-only GEMM, ``python -m qkern bench``.

Two tables, every figure measured in this one run:

``kernels``
    Each registry kernel this process may run, forced through
    ``qkern.WoqLinear(w, scales, kernel=name)``, on M = 1 and M = 64 rows of
    bfloat16 activations (and of float32 for the kernels that accept it),
    with its speedup over the portable reference ``f32_gemm_4x16c1__ref`` in
    the same dtype and M. This shows that each SIMD kernel is doing the work.

``peers``
    For LLM-like shapes in bfloat16: ``qkern.WoqLinear`` (weight packed once,
    kernel chosen automatically), ``qkern.weight_int8pack_mm`` (packs on every
    call), NumPy dequantize-then-matmul in float32 (the dequantization is
    timed too) and, when PyTorch is installed, ``torch._weight_int8pack_mm``;
    each with its time relative to ``WoqLinear``.

``torch_mlp`` (``--torch``)
    An MLP 4096-11008-4096-11008-4096 in bfloat16, end to end through
    PyTorch at batch 1 and 32: after ``qkern.torch.swap_linears``, through
    ``torch._weight_int8pack_mm`` per layer (the same int8 weights), and
    dense ``nn.Linear``; each with its time relative to the qkern path.

Each row gives the median time of one call with its min and max, GFLOP/s
(``2*M*N*K / t``) and weight GB/s (``N*K`` int8 bytes / t, whatever the peer
actually reads). Weights of these sizes may stay in the last-level cache
between calls, so the GB/s figures are not DRAM bandwidths; a benchmark
calibrated against this machine's roofline is still to come.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np

import qkern
from qkern._dtypes import bfloat16
from qkern.dispatch import CPU_ISA, ISA_CAP, choose_kernel

__all__ = ["Timing", "time_call", "all_cores", "kernels_table", "peers_table", "mlp_table", "run"]

REFERENCE = "f32_gemm_4x16c1__ref"

_DTYPES = {"bfloat16": bfloat16, "float32": np.dtype(np.float32)}

# Problem sizes, keyed by ``quick``.
_KERNELS_MS = (1, 64)
_KERNELS_NK = {True: 2048, False: 4096}
_PEER_MS = {True: (1, 16, 128), False: (1, 4, 16, 32, 64, 128, 256)}
_PEER_SHAPES = {True: [(4096, 4096)], False: [(4096, 4096), (11008, 4096), (4096, 11008)]}


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


def _row(table: str, name: str, dtype: str, m: int, n: int, k: int, t: Timing,
         **extra) -> dict:
    """One result as a flat dict (the JSON form): problem, timing and rates."""
    return {
        "table": table, "name": name, "dtype": dtype, "M": m, "N": n, "K": k, **extra,
        "median_ms": t.median * 1e3, "min_ms": t.min * 1e3, "max_ms": t.max * 1e3,
        "reps": t.reps,
        "gflops": 2.0 * m * n * k / t.median / 1e9,
        "weight_gbs": n * k / t.median / 1e9,
    }


def _random_problem(rng, m: int, n: int, k: int, dtype) -> tuple:
    """``(x, w, scales)``: x standard normal, w uniform int8, scales in [0.001, 0.01]."""
    x = rng.standard_normal((m, k)).astype(dtype)
    w = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    scales = rng.uniform(0.001, 0.01, n).astype(dtype)
    return x, w, scales


def _format_table(title: str, columns: list, rows: list) -> str:
    """Render ``rows`` (dicts) as a text table.

    ``columns`` holds ``(header, key, format)`` triples; a value of None
    prints as an empty cell.
    """
    cells = [["" if r[key] is None else fmt.format(r[key]) for _, key, fmt in columns]
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

PEERS_COLUMNS = [("peer", "name", "{}"), ("M", "M", "{}"), ("N", "N", "{}"), ("K", "K", "{}"),
                 ("kernel", "kernel", "{}")] + _TIME_COLUMNS + [
                    ("t / qkern", "ratio_vs_qkern", "{:.2f}")]


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
                rows.append(_row("kernels", kern.name, dtype_name, m, n, k, t, isa=kern.isa,
                                 threads=threads, speedup_vs_ref=ref_median[m] / t.median))
    return rows


def _to_torch(torch, a: np.ndarray):
    """A torch tensor holding a copy of ``a`` (bfloat16 via its bits).

    Copied because torch's kernel assumes aligned storage, which a tensor
    over NumPy memory need not have.
    """
    if a.dtype == bfloat16:
        return torch.from_numpy(a.view(np.int16)).clone().view(torch.bfloat16)
    return torch.from_numpy(a).clone()


def _peer_calls(layer, x, w, scales, threads: int, torch) -> dict:
    """``{peer name: (kernel name or None, zero-argument callable)}`` for one problem."""
    m = x.shape[0]
    s_col = scales.astype(np.float32)[:, None]
    calls = {
        "qkern.WoqLinear": (
            layer.kernel_for(m).name, lambda: layer(x, num_threads=threads)),
        "qkern.weight_int8pack_mm": (
            choose_kernel(x.dtype, m).name,
            lambda: qkern.weight_int8pack_mm(x, w, scales, num_threads=threads)),
        "numpy f32 dequant+matmul": (
            None, lambda: x.astype(np.float32) @ (w.astype(np.float32) * s_col).T),
    }
    if torch is not None:
        tx, tw, ts = (_to_torch(torch, a) for a in (x, w, scales))
        calls["torch._weight_int8pack_mm"] = (None,
                                              lambda: torch._weight_int8pack_mm(tx, tw, ts))
    return calls


def peers_table(threads: int, quick: bool, torch=None) -> list:
    """Time qkern against NumPy and PyTorch on LLM-like bfloat16 shapes.

    Parameters
    ----------
    threads : int
        ``num_threads`` for qkern; torch and NumPy's BLAS are set to the same
        count by the caller.
    quick : bool
        M in {1, 16, 128} on (N, K) = (4096, 4096) when true, else M in
        {1, 4, 16, 32, 64, 128, 256} on (4096, 4096), (11008, 4096) and
        (4096, 11008).
    torch : module, optional
        PyTorch, to add ``torch._weight_int8pack_mm`` as a peer.

    Returns
    -------
    list of dict
        One row per (shape, M, peer), with ``ratio_vs_qkern`` (peer median /
        ``qkern.WoqLinear`` median).
    """
    ms, shapes = _PEER_MS[quick], _PEER_SHAPES[quick]
    rng = np.random.default_rng(0)
    rows = []
    for n, k in shapes:
        # K % 16 == 0 in every shape: torch's kernel has no K tail.
        x_max, w, scales = _random_problem(rng, max(ms), n, k, bfloat16)
        layer = qkern.WoqLinear(w, scales)
        for m in ms:
            for name, (kernel, fn) in _peer_calls(layer, x_max[:m], w, scales, threads,
                                                  torch).items():
                t = time_call(fn)
                if name == "qkern.WoqLinear":  # the first peer
                    ours = t.median
                rows.append(_row("peers", name, "bfloat16", m, n, k, t, kernel=kernel,
                                 threads=threads, ratio_vs_qkern=t.median / ours))
    return rows


def _load_torch(threads: int):
    """``(torch or None, note)``: PyTorch set to ``threads`` threads, if usable."""
    if importlib.util.find_spec("torch") is None:
        return None, "not installed: its rows are skipped"
    import torch

    if not hasattr(torch, "_weight_int8pack_mm"):
        return None, f"{torch.__version__} has no _weight_int8pack_mm: its rows are skipped"
    torch.set_num_threads(threads)
    return torch, f"{torch.__version__}, {threads} thread(s)"


def _has_threadpoolctl() -> bool:
    """Whether threadpoolctl (optional) is installed."""
    return importlib.util.find_spec("threadpoolctl") is not None


@contextlib.contextmanager
def _blas_threads(threads: int):
    """Limit NumPy's BLAS to ``threads`` threads in the block (needs threadpoolctl)."""
    if not _has_threadpoolctl():
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads, user_api="blas"):
        yield


def _llc_bytes():
    """Size of this CPU's last-level cache from Linux sysfs, or None."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    by_level = {}
    try:
        for entry in os.listdir(base):
            if entry.startswith("index"):
                with open(f"{base}/{entry}/level") as f:
                    level = int(f.read())
                with open(f"{base}/{entry}/size") as f:
                    size = f.read().strip()
                scale = units.get(size[-1], 1)
                by_level[level] = int(size[:-1] if scale > 1 else size) * scale
    except (OSError, ValueError):
        return None
    return by_level[max(by_level)] if by_level else None


def _header(threads: int, quick: bool, torch_note: str) -> str:
    """The lines printed above the tables: machine, threads, peers, caveats."""
    features = [name for name, on in qkern.cpu_features().items() if on]
    largest = max(n * k for n, k in _PEER_SHAPES[quick]) / 2**20
    llc = _llc_bytes()
    cache = (f"last-level cache {llc / 2**20:.0f} MiB, largest int8 weight here "
             f"{largest:.0f} MiB" if llc else f"largest int8 weight here {largest:.0f} MiB")
    return "\n".join([
        f"qkern {qkern.__version__} bench, {'quick' if quick else 'full'}; numpy {np.__version__}",
        f"CPU features: {' '.join(features) or 'none of the listed'}",
        f"ISA: this CPU {CPU_ISA}, cap {ISA_CAP}; threads: {threads} of {all_cores()} core(s)",
        f"torch: {torch_note}; numpy BLAS: " + (f"{threads} thread(s)" if _has_threadpoolctl()
                                                else "threads not limited (no threadpoolctl)"),
        f"load average (1 min) at start: {os.getloadavg()[0]:.2f}; other work on the machine "
        "slows calls that use every core",
        f"Cache: {cache}.",
        "Note: weights may stay cache-resident between calls, so these are not DRAM-bound",
        "figures; a roofline-calibrated benchmark is to come.",
        "Times are per call: median of the timed reps (after 2 warm-up calls), min, max.",
    ])


def run(*, quick: bool = False, threads: int | None = None, json_path: str | None = None,
        torch_mlp: bool = False) -> list:
    """Run both tables, printing each as it completes.

    Parameters
    ----------
    quick : bool
        Smaller shapes and fewer of them (under a minute on two cores).
    threads : int, optional
        Threads for qkern, torch and NumPy's BLAS; default: all cores.
    json_path : str, optional
        Also write every row, as a JSON list of dicts, to this file.
    torch_mlp : bool
        Also run :func:`mlp_table`, the end-to-end MLP through PyTorch
        (which must be installed).

    Returns
    -------
    list of dict
        All rows, kernels table first.
    """
    threads = threads or all_cores()
    start = time.perf_counter()
    torch, torch_note = _load_torch(threads)
    if torch_mlp and torch is None:
        raise SystemExit(f"bench --torch needs PyTorch: torch {torch_note}")
    print(_header(threads, quick, torch_note), end="\n\n", flush=True)
    rows = kernels_table(threads, quick)
    print(_format_table(f"Table 1 - kernels (speedup vs {REFERENCE}, same dtype and M)",
                        KERNELS_COLUMNS, rows), end="\n\n", flush=True)
    with _blas_threads(threads):
        peers = peers_table(threads, quick, torch)
    print(_format_table("Table 2 - peers, bfloat16 (t / qkern: median over qkern.WoqLinear's)",
                        PEERS_COLUMNS, peers), flush=True)
    rows += peers
    if torch_mlp:
        mlp = mlp_table(threads, torch)
        print("\n" + _format_table(_mlp_title(), MLP_COLUMNS, mlp), flush=True)
        rows += mlp
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
        print(f"\nwrote {len(rows)} rows to {json_path}")
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
    llc = _llc_bytes()
    cache = f"; last-level cache {llc / 2**20:.0f} MiB" if llc else ""
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
                           threads=threads, widths=list(MLP_WIDTHS),
                           ratio_vs_qkern=t.median / ours,
                           rel_diff_vs_qkern=float((y - y_ours).abs().max() / y_ours.abs().max()))
                row.update(gflops=2.0 * m * _MLP_WEIGHTS / t.median / 1e9,
                           weight_gbs=_MLP_WEIGHTS / t.median / 1e9)
                rows.append(row)
    return rows
