"""Each target set for the WoQ GEMM (docs/performance.rst, "Where the
targets stand"), judged on the JSON that ``benchmarks/woq_bench.py --json``
writes: per target and thread count, the range of its figure over the grid's
rows, whether it is met, and the rows that miss it, worst first.

    python benchmarks/targets.py docs/figures/bench-avx512-zen4-2026-12-07.json

Several files (a full run and an ``--int4-only`` one, say) are judged
together, each row against the DRAM bandwidth of its own file's roofline.
Rows come from Table 2 (``peers.py``: int8, the peers) and Table 4
(``int4_peers.py``); a target whose rows the files lack says so. The
functional op's target is not on the grid: ``woq_minof.py`` measures it.
Every figure comes from the rows as written; nothing is timed here.

A row at M >= 64 is judged against the peak of its kernel's own
instruction, the one its ``% roof`` counts: ``vfmadd231ps``, ``vdpbf16ps``
(on a Zen 4 twice the flops of the FMA, so stricter than "the FMA peak")
or ``tdpbf16ps``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import NamedTuple

# How many of the rows that miss a target are named.
WORST_NAMED = 3


class Figure(NamedTuple):
    """One row's figure for a target: ``value`` against ``goal``."""

    threads: int
    where: str
    value: float
    goal: float


class Target(NamedTuple):
    """A target: its wording, how its figures come from the rows, and whether
    each must reach its goal (``every``) or their median must."""

    label: str
    unit: str
    figures: Callable[[list], list]
    at_most: bool = False
    over: str = "every"

    def holds(self, value: float, goal: float) -> bool:
        """Whether ``value`` meets ``goal`` (a value equal to it does)."""
        return value <= goal if self.at_most else value >= goal


def load(paths) -> list:
    """The rows of every file in ``paths``, each int8 qkern row given its
    ``pct_dram`` from its own file's median DRAM bandwidth."""
    rows = []
    for path in paths:
        with open(path) as f:
            run = json.load(f)
        bandwidth = {int(t): statistics.median(gbs)
                     for t, gbs in run["roofline"]["bandwidth_gbs"].items()}
        for row in run["rows"]:
            if row["table"] == "peers" and row["name"].startswith("qkern "):
                row = {**row, "pct_dram": 100 * row["weight_gbs"] / bandwidth[row["threads"]]}
            rows.append(row)
    return rows


def _where(row) -> str:
    return f"{row['N']}x{row['K']} M={row['M']} {row['dtype']}"


def _named(rows, table: str, name: str) -> dict:
    """``{(threads, M, N, K): row}`` of the rows of ``table`` named ``name``."""
    return {(r["threads"], r["M"], r["N"], r["K"]): r for r in rows
            if r["table"] == table and r["name"] == name}


def _int8_dram(rows) -> list:
    return [Figure(r["threads"], _where(r), r["pct_dram"], 90) for r in rows
            if r["table"] == "peers" and r["name"].startswith("qkern ") and r["M"] <= 4]


def _int8_peak(rows) -> list:
    # the AMX kernels' roofline is tdpbf16ps, whose goal is 50 %
    return [Figure(r["threads"], f"{_where(r)} {r['kernel']}", r["pct_roofline"],
                   50 if r["kernel"].endswith("__amx") else 85) for r in rows
            if r["table"] == "peers" and r["name"].startswith("qkern ") and r["M"] >= 64]


def _avx2_dtypes(rows) -> list:
    f32 = _named(rows, "peers", "qkern float32")
    out = []
    for dtype in ("bfloat16", "float16"):
        for key, r in _named(rows, "peers", f"qkern {dtype}").items():
            base = f32.get(key)
            if base and r["M"] >= 64 and base["kernel"].endswith("__avx2"):
                out.append(Figure(r["threads"], _where(r), r["median_ms"] / base["median_ms"],
                                  1.05))
    return out


def _slower_peer(rows, table: str, peer: str, ours: str, goal: Callable[[int], float | None]):
    """Figures of ``peer``'s median over ``ours``'s on the same problem, where
    ``goal(M)`` gives one."""
    mine = _named(rows, table, ours)
    out = []
    for key, r in _named(rows, table, peer).items():
        base, g = mine.get(key), goal(r["M"])
        if base is not None and g is not None:
            out.append(Figure(r["threads"], _where(base), r["median_ms"] / base["median_ms"], g))
    return out


def _dense(rows) -> list:
    dense = {r["name"] for r in rows if r["table"] == "peers"
             and r["name"].startswith("torch.mm ") and r["name"].endswith(" dense")}
    return [f for name in sorted(dense)
            for f in _slower_peer(rows, "peers", name, f"qkern {name.split()[1]}",
                                  lambda m: 1.0 if m >= 64 else None)]


def _int4_dram(rows) -> list:
    return [Figure(r["threads"], _where(r), r["pct_dram"], 85) for r in rows
            if r["table"] == "int4" and r["name"].startswith("qkern int4 ") and r["M"] <= 4]


def _int4_vs_int8(rows) -> list:
    return [Figure(r["threads"], _where(r), r["ratio_vs_int8"], 1.2) for r in rows
            if r["table"] == "int4" and r["name"].startswith("qkern int4 ") and r["M"] >= 128]


TARGETS = (
    Target("int8, M <= 4: 90 % of DRAM read, every dtype", "% of DRAM", _int8_dram),
    Target("int8, M >= 64: 85 % of the FMA peak (AVX2, AVX-512), 50 % of tdpbf16ps (AMX)",
           "% of its instruction's peak", _int8_peak),
    Target("int8, M >= 64 on AVX2: bfloat16 and float16 within 1.05x of float32",
           "x float32's time", _avx2_dtypes, at_most=True),
    Target("OpenVINO int8 (float32): 1.0x everywhere, 1.3x at M <= 16",
           "x qkern float32's time",
           lambda rows: _slower_peer(rows, "peers", "openvino int8 MatMul f32", "qkern float32",
                                     lambda m: 1.3 if m <= 16 else 1.0)),
    Target("2x torch._weight_int8pack_mm from M = 16", "x qkern bfloat16's time",
           lambda rows: _slower_peer(rows, "peers", "torch._weight_int8pack_mm",
                                     "qkern bfloat16", lambda m: 2.0 if m >= 16 else None)),
    Target("1.0x dense torch.mm from M = 64, same dtype", "x qkern's time", _dense),
    Target("int4, M <= 4: 85 % of DRAM read", "% of DRAM", _int4_dram),
    Target("int4, M >= 128: within 1.2x of int8", "x int8's time", _int4_vs_int8, at_most=True),
    Target("int4: 3x torch._weight_int4pack_mm_for_cpu on the grid's median",
           "x qkern int4 bfloat16's time",
           lambda rows: _slower_peer(rows, "int4", "torch._weight_int4pack_mm_for_cpu",
                                     "qkern int4 bfloat16", lambda m: 3.0),
           over="median"),
    Target("int4: 1.0x ONNX Runtime MatMulNBits accuracy_level 0 everywhere",
           "x qkern int4 float32's time",
           lambda rows: _slower_peer(rows, "int4", "onnxruntime MatMulNBits4 acc0",
                                     "qkern int4 float32", lambda m: 1.0)),
)


def _number(value: float, goal: float | None = None) -> str:
    """``value`` to whole units from 10 up, else to 0.01; one more digit
    where that would print a miss as its ``goal``."""
    digits = 0 if abs(value) >= 10 else 2
    if goal is not None and f"{value:.{digits}f}" == f"{goal:.{digits}f}":
        digits += 1
    return f"{value:.{digits}f}"


def verdict(target: Target, figures: list) -> str:
    """One thread count's line: the range, the verdict, the worst misses."""
    values = [f.value for f in figures]
    count = f"{len(figures)} row{'s' if len(figures) > 1 else ''}"
    span = f"{_number(min(values))}-{_number(max(values))} {target.unit} over {count}"
    if target.over == "median":
        middle = statistics.median(values)
        met = target.holds(middle, figures[0].goal)
        return f"{span}, median {_number(middle)}: {'met' if met else 'not met'}"
    misses = sorted((f for f in figures if not target.holds(f.value, f.goal)),
                    key=lambda f: f.value / f.goal, reverse=target.at_most)
    if not misses:
        return f"{span}: met"
    worst = "; ".join(f"{f.where} {_number(f.value, f.goal)} (goal {_number(f.goal)})"
                      for f in misses[:WORST_NAMED])
    return f"{span}: not met on {len(misses)} (worst: {worst})"


def report(rows) -> str:
    """Every target's lines for ``rows``."""
    lines = []
    for target in TARGETS:
        lines.append(target.label)
        figures = target.figures(rows)
        if not figures:
            lines.append("  no rows for it in these files")
        for threads in sorted({f.threads for f in figures}):
            mine = [f for f in figures if f.threads == threads]
            lines.append(f"  {threads} thread{'s' if threads > 1 else ''}: "
                         f"{verdict(target, mine)}")
    lines.append("the functional op within 1.2x of WoqLinear at M <= 8: not on the grid "
                 "(benchmarks/woq_minof.py --weights int8,int8-functional)")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Print :func:`report` for the files named in ``argv``; return 0."""
    parser = argparse.ArgumentParser(
        prog="python benchmarks/targets.py",
        description="Judge the WoQ targets on the JSON of woq_bench.py runs.")
    parser.add_argument("json", nargs="+", help="files written by woq_bench.py --json")
    print(report(load(parser.parse_args(argv).json)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
