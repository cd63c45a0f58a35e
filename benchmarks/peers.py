"""qkern against its peers on LLM-like shapes, weights cold: Table 2 of
``benchmarks/woq_bench.py``.

The peers: ``qkern.WoqLinear`` in bfloat16, float16 and float32 (weight
packed once, kernel chosen automatically), ``qkern.weight_int8pack_mm``
(packs on every call; quick grid only), NumPy dequantize-then-matmul in
float32 (dequantization timed too), and when PyTorch is installed
``torch._weight_int8pack_mm`` (where K is a multiple of 16: PyTorch 2.13's
kernel crashes on other K) and dense ``torch.mm`` (bfloat16 where the CPU
has bfloat16 arithmetic, float32 elsewhere), and when installed
(``pip install qkern[bench]``) OpenVINO and ONNX Runtime in float32
(``runtimes.py``). Each peer's result is checked against qkern's before it
is timed. Weights are
cold: every timed call uses the next of several copies whose total exceeds
the last-level cache. Each qkern row gives its % of the roofline (the
larger of weight bytes / bandwidth and flops / the peak of the kernel's
instruction, over t), each row its time over qkern bfloat16's on the same
shape, and each odd shape its GFLOP/s over its aligned twin's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os

import numpy as np

import qkern
import runtimes
from qkern import bench, roofline
from qkern._dtypes import bfloat16
from qkern.timing import time_call

_PEER_MS = {True: (1, 16, 128), False: (1, 4, 16, 32, 64, 128, 256, 1024)}
_PEER_SHAPES = {True: [(4096, 4096)],
                False: [(4096, 4096), (11008, 4096), (4096, 11008)]}
# Odd shapes: (M, N, K), each timed beside its aligned twin (aligned_twin).
_ODD_SHAPES = {True: [], False: [(7, 1000, 4095), (33, 4097, 1023)]}

# Dense torch.mm runs in bfloat16 where the CPU has bfloat16 arithmetic, in
# float32 elsewhere (bfloat16 there is emulated, and no user would run it).
_FEATURES = qkern.cpu_features()
DENSE_DTYPE = "bfloat16" if _FEATURES["avx512_bf16"] or _FEATURES["amx_bf16"] else "float32"

# torch._weight_int8pack_mm is timed only where K is a multiple of this:
# PyTorch 2.13's CPU kernel loads each weight row with aligned 16-byte loads
# (no K tail) and dies of a segmentation fault on other K.
TORCH_INT8_K_MULTIPLE = 16

PEERS_COLUMNS = [("peer", "name", "{}"), ("thr", "threads", "{}"), ("M", "M", "{}"),
                 ("N", "N", "{}"), ("K", "K", "{}"), ("kernel", "kernel", "{}")] + \
    bench.TIME_COLUMNS + [("% roof", "pct_roofline", "{:.0f}"),
                          ("t / qkern", "ratio_vs_qkern", "{:.2f}"),
                          ("GFLOP/s / twin's", "vs_aligned_twin", "{:.2f}")]


def aligned_twin(m: int, n: int, k: int) -> tuple:
    """The nearest aligned shape of an odd one: M to the nearest power of two,
    N and K to the nearest multiples of 32 (one panel, one AMX chunk)."""
    def nearest(v, step):
        return max(step, (v + step // 2) // step * step)
    return 2 ** round(np.log2(m)), nearest(n, 32), nearest(k, 32)


# Copies of each weight total this many times the last-level cache: with
# 1.5x, AMD's victim L3 still served part of a Zen 3's "cold" reads (M = 1
# read 119 % of the DRAM bandwidth measured in the same run).
COLD_FACTOR = 3

# But the copies of one operand never total more than this share of the
# physical memory: a table holds about eight operands' copies at once
# (int8: qkern's three dtypes, torch's int8 and dense weights, OpenVINO and
# two ONNX Runtime sessions; int4 likewise), a runtime's copy can take
# several times the operand's bytes, and an AMX Xeon VM that reports a
# 480 MiB last-level cache ran out of its 24 GiB with 3x that for each
# operand, and in the int4 table with 1/32 of the memory.
COLD_MEMORY_SHARE = 1 / 64


def _physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cold_bytes() -> int:
    """The bytes the copies of one operand total at least (but for the
    two-copy minimum): COLD_FACTOR times the last-level cache, capped at
    COLD_MEMORY_SHARE of the physical memory."""
    return min(COLD_FACTOR * roofline.last_level_cache_bytes(),
               int(COLD_MEMORY_SHARE * _physical_memory()))


def copies_for_cold(nbytes: int) -> int:
    """How many copies of an ``nbytes`` operand total :func:`cold_bytes` (at least two)."""
    return max(2, -(-cold_bytes() // max(nbytes, 1)))


def cold_note() -> str:
    """The header line that says how the weights are kept cold."""
    llc = roofline.last_level_cache_bytes()
    note = (f"Weights cold: each timed call uses the next of several copies totalling over "
            f"{cold_bytes() / llc:.1f}x the {llc / 2**20:.0f} MiB last-level cache")
    if cold_bytes() < COLD_FACTOR * llc:
        note += (f" (not {COLD_FACTOR}x: capped at {COLD_MEMORY_SHARE:.3g} of the "
                 f"{_physical_memory() / 2**30:.0f} GiB memory)")
    return note + "."


def check_same_problem(name: str, got, want, limit: float, against: str) -> None:
    """Refuse a peer whose result is not ``want`` within ``limit``, relative to
    its largest magnitude: it would time another problem."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
    if not err <= limit:
        raise RuntimeError(f"{name}: relative error {err:.2e} against {against} "
                           f"(limit {limit:g}): not the same problem")


def _rotating(items: list):
    """A zero-argument callable returning the next of ``items`` on each call."""
    cycle = itertools.cycle(items)
    return lambda: next(cycle)


def _to_torch(torch, a: np.ndarray):
    """A torch tensor holding a copy of ``a`` (bfloat16 via its bits).

    Copied because torch's kernel assumes aligned storage, which a tensor
    over NumPy memory need not have.
    """
    if a.dtype == bfloat16:
        return torch.from_numpy(a.view(np.int16)).clone().view(torch.bfloat16)
    return torch.from_numpy(a).clone()


def _roofline_seconds(roof, kern, dtype: str, m: int, n: int, k: int, weight_bytes: int,
                      threads: int) -> float:
    """The roofline's time for one call of ``kern``: max(weight bytes / bandwidth,
    flops / the peak of its instruction), flops counting each bf16 plane of a
    split float16/float32 activation."""
    flops = 2.0 * m * n * k * kern.planes(dtype)
    return max(weight_bytes / (roof.median_bandwidth(threads) * 1e9),
               flops / (roof.median_peak(kern.bound_by, threads) * 1e9))


class _Problem:
    """Cold operands of one (N, K) shape for every peer: copies over the LLC."""

    def __init__(self, rng, n: int, k: int, m_max: int, torch):
        self.n, self.k = n, k
        copies = copies_for_cold(n * k)
        x, w, scales = bench.random_problem(rng, m_max, n, k, bfloat16)
        self.w, self.scales = w, scales
        self.x = {name: x.astype(dt) for name, dt in bench.DTYPES.items()}
        layers = {name: [qkern.WoqLinear(w, scales.astype(dt)) for _ in range(copies)]
                  for name, dt in bench.DTYPES.items()}
        self.layers = {name: _rotating(made) for name, made in layers.items()}
        self.packed_bytes = {name: made[0].packed_weight.nbytes for name, made in layers.items()}
        self.w_cold = _rotating([w.copy() for _ in range(copies)])  # the functional op's
        self.copies = copies
        self.runtime_peers = {}
        self.torch = None
        if torch is not None:
            tw = _to_torch(torch, w)
            self.torch = {
                "x": _to_torch(torch, x),
                "s": _to_torch(torch, scales),
                "w": _rotating([tw.clone() for _ in range(copies)]),
                # (K, N) views of row-major (N, K) weights, as nn.Linear uses them
                "dense": _rotating([(tw.to(getattr(torch, DENSE_DTYPE)) * 0.01).t()
                                    for _ in range(max(2, copies // 2))]),
                "x dense": _to_torch(torch, self.x[DENSE_DTYPE]),
            }

    def _runtimes(self, threads: int) -> dict:
        """``{peer: f(x)}`` of the inference runtimes installed, built once per
        thread count."""
        if threads not in self.runtime_peers:
            made = {
                "openvino int8 MatMul f32": runtimes.openvino_peer(
                    self.w, self.scales, threads, self.copies),
                "onnxruntime MatMulNBits8 acc0": runtimes.onnxruntime_peer(
                    self.w, self.scales, threads, self.copies, accuracy_level=0),
                "onnxruntime MatMulNBits8 acc4 (int8 x)": runtimes.onnxruntime_peer(
                    self.w, self.scales, threads, self.copies, accuracy_level=4),
            }
            made = {name: f for name, f in made.items() if f}
            x = self.x["float32"][:3]
            want = self.layers["float32"]()(x).astype(np.float64)
            for name, run in made.items():
                # float32 sums in another order, or int8 activations (acc4)
                check_same_problem(name, run(x), want, 2e-2 if "int8 x" in name else 1e-4,
                                   "qkern")
            self.runtime_peers[threads] = made
        return self.runtime_peers[threads]

    def calls(self, m: int, threads: int, quick: bool) -> dict:
        """``{peer: (dtype, kernel name or None, weight bytes, callable[, warm])}``
        for M rows; ``warm()``, where given, runs the rows once on every copy
        of a runtime peer before it is timed (:class:`runtimes.Peer`)."""
        out = {}
        for name in bench.DTYPES:
            x, layers = self.x[name][:m], self.layers[name]
            out[f"qkern {name}"] = (name, layers().kernel_for(m).name, self.packed_bytes[name],
                                    lambda x=x, layers=layers: layers()(x, num_threads=threads))
        xb = self.x["bfloat16"][:m]
        if quick:
            out["qkern.weight_int8pack_mm"] = (
                "bfloat16", None, self.n * self.k,
                lambda: qkern.weight_int8pack_mm(xb, self.w_cold(), self.scales,
                                                 num_threads=threads))
        xf = self.x["float32"][:m]
        for name, run in self._runtimes(threads).items():
            out[name] = ("float32", None, self.n * self.k, lambda run=run: run(xf),
                         lambda run=run: run.warm(xf))
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
            xd = self.torch["x dense"][:m].clone()
            size = 2 if DENSE_DTYPE == "bfloat16" else 4
            out[f"torch.mm {DENSE_DTYPE} dense"] = (DENSE_DTYPE, None, size * self.n * self.k,
                                                    lambda: torch.mm(xd, dense()))
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
        PyTorch, to add its int8 op and dense mm (:data:`DENSE_DTYPE`) as peers.

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
            for name, (dtype, kernel, wbytes, fn, *warm) in prob.calls(m, threads,
                                                                       quick).items():
                for run in warm:
                    run()
                t = time_call(fn)
                ours = ours or t.median  # the first peer is qkern bfloat16
                row = bench.result_row("peers", name, dtype, m, n, k, t, wbytes, kernel=kernel,
                                       threads=threads, copies=prob.copies,
                                       ratio_vs_qkern=t.median / ours)
                if name.startswith("qkern "):
                    kern = qkern.dispatch.get_kernel(kernel)
                    row["pct_roofline"] = 100 * _roofline_seconds(roof, kern, dtype, m, n, k,
                                                                  wbytes, threads) / t.median
                rows.append(row)
        del prob
    gflops = {(r["name"], r["M"], r["N"], r["K"]): r["gflops"] for r in rows}
    for r in rows:
        twin = odd.get((r["M"], r["N"], r["K"]))
        if twin is not None:
            r["vs_aligned_twin"] = r["gflops"] / gflops[(r["name"], *twin)]
    return rows


def load_torch():
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


def report(threads: list, quick: bool, roof, torch=None) -> list:
    """Time and print :func:`peers_table` for each thread count in turn.

    Parameters
    ----------
    threads : list of int
        Each sets qkern's ``num_threads``, torch's threads and NumPy's BLAS
        threads for its table; torch keeps the last.
    quick, roof, torch
        As for :func:`peers_table`.

    Returns
    -------
    list of dict
        Every table's rows.
    """
    rows = []
    for t in threads:
        if torch is not None:
            torch.set_num_threads(t)
        with _blas_threads(t):
            peers = peers_table(t, quick, roof, torch)
        bench.print_table(f"Table 2 - peers, {t} thread(s) (t / qkern: over qkern bfloat16's "
                          "median on the same shape)", PEERS_COLUMNS, peers)
        rows += peers
    return rows
