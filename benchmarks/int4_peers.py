"""qkern's int4 groupwise GEMM against its peers, weights cold: Table 4 of
``benchmarks/woq_bench.py``.

On the grid of Table 2 (``peers.py``), one problem per shape: 4-bit
weights in groups of 128 along K (``qkern.bench.int4_group_size``), each
group with a scale
and an integer zero point (so that every peer runs the same weight
exactly: ``z = s * (8 - zero point)``, with scales of 4 significant bits).
The peers: ``qkern.Int4Linear`` in bfloat16 and float32; ``qkern.WoqLinear``
(int8) in the same dtypes, the time the int4 one is measured against; and,
where installed, ONNX Runtime ``MatMulNBits`` with ``bits = 4`` at
``accuracy_level = 0`` (float32, like-for-like) and ``4`` (int8
activations, a less exact computation, labelled), OpenVINO's ``u4``
weight compression in float32 (``runtimes.py``), and
``torch._weight_int4pack_mm_for_cpu`` in bfloat16. Each peer's result is
checked against qkern's before it is timed. Each row gives the weight
bytes read over the DRAM bandwidth measured in the same run, as a
percentage of its time (``% DRAM``: the 4-bit weight plus its scales and
zeros), its time over qkern int4's in the same dtype, and for qkern int4
its time over qkern int8's.
"""

from __future__ import annotations

import numpy as np

import peers
import qkern
import runtimes
from qkern import bench
from qkern._dtypes import bfloat16
from qkern.timing import time_call

INT4_COLUMNS = [("peer", "name", "{}"), ("thr", "threads", "{}"), ("M", "M", "{}"),
                ("N", "N", "{}"), ("K", "K", "{}"), ("dtype", "dtype", "{}")] + \
    bench.TIME_COLUMNS + [("% DRAM", "pct_dram", "{:.0f}"), ("% roof", "pct_roofline", "{:.0f}"),
                          ("t / qkern int4", "ratio_vs_qkern", "{:.2f}"),
                          ("int4 / int8", "ratio_vs_int8", "{:.2f}")]

_DTYPES = ("bfloat16", "float32")


class _Int4Problem:
    """Cold operands of one (N, K) shape for every peer: copies over the LLC."""

    def __init__(self, rng, n: int, k: int, m_max: int, torch):
        self.n, self.k, self.torch = n, k, torch
        self.group_size = group_size = bench.int4_group_size(k)
        groups = k // group_size
        self.q = rng.integers(0, 16, (n, groups, group_size), dtype=np.uint8)
        self.zero_points = rng.integers(0, 16, (n, groups), dtype=np.uint8)
        self.scales = rng.integers(8, 16, (n, groups)).astype(np.float32) * np.float32(2.0**-10)
        zeros = self.scales * (8 - self.zero_points.astype(np.float32))  # exact
        # C-contiguous: PyTorch 2.13's CPU op reads it so whatever its strides
        sz = np.ascontiguousarray(np.stack([self.scales.T, zeros.T], axis=-1))
        self.copies = peers.copies_for_cold(n * k // 2)
        x = rng.standard_normal((m_max, k)).astype(np.float32)
        self.x = {name: x.astype(bench.DTYPES[name]) for name in _DTYPES}
        packed = qkern.pack_int4(self.q.reshape(n, k))
        self.int4 = {name: peers._rotating([
            qkern.Int4Linear(packed, group_size, sz.astype(bench.DTYPES[name]))
            for _ in range(self.copies)]) for name in _DTYPES}
        self.int4_bytes = {name: packed.nbytes + sz.astype(bench.DTYPES[name]).nbytes
                           for name in _DTYPES}
        w8 = rng.integers(-128, 128, (n, k), dtype=np.int8)
        s8 = rng.uniform(0.001, 0.01, n)
        copies8 = peers.copies_for_cold(n * k)
        self.int8 = {name: peers._rotating([qkern.WoqLinear(w8, s8.astype(bench.DTYPES[name]))
                                            for _ in range(copies8)]) for name in _DTYPES}
        self.runtime_peers, self.torch_checked = {}, set()
        if torch is not None:
            q32 = torch.from_numpy(self.q.reshape(n, k).astype(np.int32))
            self.torch_w = peers._rotating([torch._convert_weight_to_int4pack_for_cpu(q32, 1)
                                            for _ in range(self.copies)])
            self.torch_sz = peers._to_torch(torch, sz.astype(bfloat16))
            self.torch_x = peers._to_torch(torch, self.x["bfloat16"])

    def _check(self, name: str, dtype: str, run) -> None:
        """Refuse a peer whose result on three rows is not qkern int4's."""
        x = self.x[dtype][:3]
        # float32 sums in another order; int8 activations (acc4); bfloat16 results
        limit = 1e-4 if dtype == "float32" and "int8 x" not in name else 2e-2
        peers.check_same_problem(name, run(x), self.int4[dtype]()(x), limit, "qkern int4")

    def _runtimes(self, threads: int) -> dict:
        """``{peer: runtimes.Peer}`` of the runtimes installed (float32), built
        and checked once per thread count."""
        if threads not in self.runtime_peers:
            args = (self.q, self.zero_points, self.scales, threads, self.copies)
            made = {
                "openvino u4 MatMul f32": runtimes.openvino_int4_peer(*args),
                "onnxruntime MatMulNBits4 acc0": runtimes.onnxruntime_int4_peer(*args, 0),
                "onnxruntime MatMulNBits4 acc4 (int8 x)": runtimes.onnxruntime_int4_peer(*args,
                                                                                         4),
            }
            made = {name: run for name, run in made.items() if run}
            for name, run in made.items():
                self._check(name, "float32", run)
            self.runtime_peers[threads] = made
        return self.runtime_peers[threads]

    def calls(self, m: int, threads: int) -> dict:
        """``{peer: (dtype, kernel name or None, weight bytes, callable[, warm])}``
        for M rows, as ``peers._Problem.calls``."""
        out = {}
        for name in _DTYPES:
            x, layers = self.x[name][:m], self.int4[name]
            out[f"qkern int4 {name}"] = (name, layers().kernel_for(m).name, self.int4_bytes[name],
                                         lambda x=x, layers=layers: layers()(
                                             x, num_threads=threads))
        for name in _DTYPES:
            x, layers = self.x[name][:m], self.int8[name]
            out[f"qkern int8 {name}"] = (name, layers().kernel_for(m).name, self.n * self.k,
                                         lambda x=x, layers=layers: layers()(
                                             x, num_threads=threads))
        xf = self.x["float32"][:m]
        for name, run in self._runtimes(threads).items():
            out[name] = ("float32", None, self.int4_bytes["float32"], lambda run=run: run(xf),
                         lambda run=run: run.warm(xf))
        if self.torch is not None:  # x converted outside the timed call
            if threads not in self.torch_checked:
                self._check("torch._weight_int4pack_mm_for_cpu", "bfloat16", lambda x: (
                    self.torch._weight_int4pack_mm_for_cpu(
                        peers._to_torch(self.torch, x), self.torch_w(), self.group_size,
                        self.torch_sz).float().numpy()))
                self.torch_checked.add(threads)
            tx = self.torch_x[:m].clone()
            out["torch._weight_int4pack_mm_for_cpu"] = (
                "bfloat16", None, self.int4_bytes["bfloat16"],
                lambda: self.torch._weight_int4pack_mm_for_cpu(tx, self.torch_w(),
                                                               self.group_size, self.torch_sz))
        return out


def int4_table(threads: int, quick: bool, roof, torch=None) -> list:
    """Time qkern int4 against its peers on Table 2's grid, weights cold.

    Parameters
    ----------
    threads : int
        ``num_threads`` for qkern and the runtimes; torch's threads are set
        by the caller.
    quick : bool
        The quick grid of Table 2 when true.
    roof : qkern.roofline.Roofline
        Measured in the same run.
    torch : module, optional
        PyTorch, to add its int4 op.

    Returns
    -------
    list of dict
        One row per (shape, M, peer): ``pct_dram``, ``ratio_vs_qkern`` (over
        qkern int4 in the same dtype), for qkern ``pct_roofline`` and, for
        qkern int4, ``ratio_vs_int8``.
    """
    rng = np.random.default_rng(0)
    bandwidth = roof.median_bandwidth(threads) * 1e9
    rows = []
    for n, k in peers._PEER_SHAPES[quick]:
        ms = peers._PEER_MS[quick]
        prob = _Int4Problem(rng, n, k, max(ms), torch)
        for m in ms:
            medians = {}
            for name, (dtype, kernel, wbytes, fn, *warm) in prob.calls(m, threads).items():
                for run in warm:
                    run()
                t = time_call(fn)
                medians[name] = t.median
                row = bench.result_row("int4", name, dtype, m, n, k, t, wbytes, kernel=kernel,
                                       threads=threads, copies=prob.copies,
                                       pct_dram=100 * wbytes / bandwidth / t.median,
                                       ratio_vs_qkern=t.median / medians[f"qkern int4 {dtype}"])
                if kernel is not None:
                    kern = qkern.dispatch.get_kernel(kernel)
                    row["pct_roofline"] = 100 * peers._roofline_seconds(
                        roof, kern, dtype, m, n, k, wbytes, threads) / t.median
                if name.startswith("qkern int8"):
                    int4_row = next(r for r in rows if r["name"] == f"qkern int4 {dtype}"
                                    and (r["M"], r["N"], r["K"]) == (m, n, k))
                    int4_row["ratio_vs_int8"] = int4_row["median_ms"] / row["median_ms"]
                rows.append(row)
        del prob
    return rows


def report(threads: list, quick: bool, roof, torch=None) -> list:
    """Time and print :func:`int4_table` for each thread count in turn
    (torch's threads set to each)."""
    rows = []
    for t in threads:
        if torch is not None:
            torch.set_num_threads(t)
        table = int4_table(t, quick, roof, torch)
        bench.print_table(f"Table 4 - int4 (groups of {bench.INT4_GROUP_SIZE}), {t} thread(s) "
                          "(% DRAM: weight, scales and zeros over the measured bandwidth; "
                          "t / qkern int4: same dtype)", INT4_COLUMNS, table)
        rows += table
    return rows
