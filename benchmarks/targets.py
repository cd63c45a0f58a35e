"""Each target set for the WoQ GEMM (docs/performance.rst, "Where the
targets stand"), judged on the JSON that ``benchmarks/woq_bench.py --json``
writes: per target and thread count, the range of its figure over the grid's
rows, whether it is met, and the rows that miss it, worst first.

    python benchmarks/targets.py docs/figures/bench-avx512-zen4-2026-12-07.json

Several files (a full run and an ``--int4-only`` one, say) are judged
together, each row against the roofline of its own file and paired only
with rows of its own file; where more than one file gives a target rows,
each file's figures get lines of their own. Rows come from Table 2
(``peers.py``: int8, the peers) and Table 4 (``int4_peers.py``); a target
whose rows the files lack says so. The functional op's target is not on the grid: ``woq_minof.py``
measures it. Every figure comes from the rows as written and the file's
roofline; nothing is timed here.

At M >= 64 an int8 row is judged against the FMA peak of its kernel's
vector width measured in the same run (``vfmadd231ps`` ymm for the AVX2
kernels, zmm for the others, so a ``vdpbf16ps`` kernel, two multiply-adds
per lane, can pass 100 %), an AMX row against ``tdpbf16ps``, each bf16
plane of a float16 or float32 row counted (its ``% roof``).
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
    """One row's figure for a target: ``value`` against ``goal``; ``file``
    the index of the row's file."""

    file: int
    threads: int
    where: str
    value: float
    goal: float


class Target(NamedTuple):
    """A target: its wording, the unit of its figures, how they come from
    the rows, whether each is a ceiling (``at_most``) rather than a floor,
    and whether their median rather than each must meet it."""

    label: str
    unit: str
    figures: Callable[[list], list]
    at_most: bool = False
    by_median: bool = False

    def holds(self, value: float, goal: float) -> bool:
        """Whether ``value`` meets ``goal`` (a value equal to it does)."""
        return value <= goal if self.at_most else value >= goal


def _fma_peak_key(kernel: str) -> str:
    """The roofline's FMA peak of ``kernel``'s vector width."""
    return "vfmadd231ps ymm" if kernel.endswith("__avx2") else "vfmadd231ps zmm"


def load(paths) -> list:
    """The rows of every file in ``paths``, each tagged with its file's
    index (``file``); each int8 qkern row gets ``pct_dram`` (weight bytes
    over the file's median DRAM bandwidth) and ``pct_fma`` (GFLOP/s over
    the file's median FMA peak of its kernel's vector width, None where the
    file has no such peak: the row is then left out of that target)."""
    rows = []
    for index, path in enumerate(paths):
        with open(path) as f:
            run = json.load(f)
        roof = run["roofline"]
        bandwidth = {int(t): statistics.median(gbs) for t, gbs in roof["bandwidth_gbs"].items()}
        peaks = {(name, int(t)): statistics.median(gflops)
                 for name, by_threads in roof["peaks_gflops"].items()
                 for t, gflops in by_threads.items()}
        for row in run["rows"]:
            row = {**row, "file": index}
            if _is_qkern_int8(row):
                peak = peaks.get((_fma_peak_key(row["kernel"]), row["threads"]))
                row.update(pct_dram=100 * row["weight_gbs"] / bandwidth[row["threads"]],
                           pct_fma=None if peak is None else 100 * row["gflops"] / peak)
            rows.append(row)
    return rows


def _where(row) -> str:
    """The problem of ``row``, as a miss names it."""
    return f"{row['N']}x{row['K']} M={row['M']} {row['dtype']}"


def _named(rows, table: str, name: str) -> dict:
    """``{(file, threads, M, N, K): row}`` of the rows of ``table`` named ``name``."""
    return {(r["file"], r["threads"], r["M"], r["N"], r["K"]): r for r in rows
            if r["table"] == table and r["name"] == name}


def _is_qkern_int8(row) -> bool:
    """Whether ``row`` is a qkern row of Table 2."""
    return row["table"] == "peers" and row["name"].startswith("qkern ")


def _qkern_int8(rows) -> list:
    """The qkern rows of Table 2."""
    return [r for r in rows if _is_qkern_int8(r)]


def _qkern_int4(rows) -> list:
    """The qkern int4 rows of Table 4."""
    return [r for r in rows if r["table"] == "int4" and r["name"].startswith("qkern int4 ")]


def _int8_dram(rows) -> list:
    """int8, M <= 4: % of DRAM read, goal 90."""
    return [Figure(r["file"], r["threads"], _where(r), r["pct_dram"], 90)
            for r in _qkern_int8(rows) if r["M"] <= 4]


def _int8_peak(rows) -> list:
    """int8, M >= 64: % of the FMA peak, goal 85; AMX % of tdpbf16ps, goal 50."""
    out = []
    for r in _qkern_int8(rows):
        amx = r["kernel"].endswith("__amx")
        if r["M"] >= 64 and (amx or r["pct_fma"] is not None):
            out.append(Figure(r["file"], r["threads"], f"{_where(r)} {r['kernel']}",
                              r["pct_roofline"] if amx else r["pct_fma"], 50 if amx else 85))
    return out


def _avx2_dtypes(rows) -> list:
    """int8, M >= 64 on AVX2: bfloat16 and float16 time over float32's, at most 1.05."""
    f32 = _named(rows, "peers", "qkern float32")
    out = []
    for dtype in ("bfloat16", "float16"):
        for key, r in _named(rows, "peers", f"qkern {dtype}").items():
            base = f32.get(key)
            if base and r["M"] >= 64 and base["kernel"].endswith("__avx2"):
                out.append(Figure(r["file"], r["threads"], _where(r),
                                  r["median_ms"] / base["median_ms"], 1.05))
    return out


def _slower_peer(rows, table: str, peer: str, ours: Callable[[dict], str],
                 goal: Callable[[int], float | None]) -> list:
    """Figures of ``peer``'s median over the median of the qkern row named
    ``ours(peer_row)`` on the same problem, where ``goal(M)`` gives one."""
    out, by_name = [], {}
    for (file, threads, m, n, k), r in _named(rows, table, peer).items():
        name = ours(r)
        if name not in by_name:
            by_name[name] = _named(rows, table, name)
        base = by_name[name].get((file, threads, m, n, k))
        g = goal(m)
        if base is not None and g is not None:
            out.append(Figure(file, threads, _where(base), r["median_ms"] / base["median_ms"],
                              g))
    return out


def _peer(table: str, peer: str, ours: str, goal: Callable[[int], float | None]):
    """The figures function of a target on one peer against one qkern row."""
    return lambda rows: _slower_peer(rows, table, peer, lambda r: ours, goal)


def _dense(rows) -> list:
    """Dense torch.mm's time over qkern's in its dtype from M = 64, goal 1.0."""
    names = sorted({r["name"] for r in rows if r["table"] == "peers"
                    and r["name"].startswith("torch.mm ") and r["name"].endswith(" dense")})
    return [f for name in names
            for f in _slower_peer(rows, "peers", name, lambda r: f"qkern {r['dtype']}",
                                  lambda m: 1.0 if m >= 64 else None)]


def _int4_dram(rows) -> list:
    """int4, M <= 4: % of DRAM read (weight, scales and zeros), goal 85."""
    return [Figure(r["file"], r["threads"], _where(r), r["pct_dram"], 85)
            for r in _qkern_int4(rows) if r["M"] <= 4]


def _int4_vs_int8(rows) -> list:
    """int4, M >= 128: time over int8's, at most 1.2."""
    return [Figure(r["file"], r["threads"], _where(r), r["ratio_vs_int8"], 1.2)
            for r in _qkern_int4(rows) if r["M"] >= 128]


TARGETS = (
    Target("int8, M <= 4: 90 % of DRAM read, every dtype", "% of DRAM", _int8_dram),
    Target("int8, M >= 64: 85 % of the FMA peak (AVX2, AVX-512), 50 % of tdpbf16ps (AMX)",
           "% of the peak", _int8_peak),
    Target("int8, M >= 64 on AVX2: bfloat16 and float16 within 1.05x of float32",
           "x float32's time", _avx2_dtypes, at_most=True),
    Target("OpenVINO int8 (float32): 1.0x everywhere, 1.3x at M <= 16",
           "x qkern float32's time",
           _peer("peers", "openvino int8 MatMul f32", "qkern float32",
                 lambda m: 1.3 if m <= 16 else 1.0)),
    Target("2x torch._weight_int8pack_mm from M = 16", "x qkern bfloat16's time",
           _peer("peers", "torch._weight_int8pack_mm", "qkern bfloat16",
                 lambda m: 2.0 if m >= 16 else None)),
    Target("1.0x dense torch.mm from M = 64, same dtype", "x qkern's time", _dense),
    Target("int4, M <= 4: 85 % of DRAM read", "% of DRAM", _int4_dram),
    Target("int4, M >= 128: within 1.2x of int8", "x int8's time", _int4_vs_int8, at_most=True),
    Target("int4: 3x torch._weight_int4pack_mm_for_cpu on the grid's median",
           "x qkern int4 bfloat16's time",
           _peer("int4", "torch._weight_int4pack_mm_for_cpu", "qkern int4 bfloat16",
                 lambda m: 3.0),
           by_median=True),
    Target("int4: 1.0x ONNX Runtime MatMulNBits accuracy_level 0 everywhere",
           "x qkern int4 float32's time",
           _peer("int4", "onnxruntime MatMulNBits4 acc0", "qkern int4 float32", lambda m: 1.0)),
)


def _number(value: float, goal: float | None = None) -> str:
    """``value`` to whole units from 10 up, else to 0.01; one more digit
    where that would print a miss as its ``goal``."""
    digits = 0 if abs(value) >= 10 else 2
    if goal is not None and f"{value:.{digits}f}" == f"{goal:.{digits}f}":
        digits += 1
    return f"{value:.{digits}f}"


def verdict(target: Target, figures: list) -> str:
    """One file and thread count's line: the range, the verdict, the worst
    misses."""
    values = [f.value for f in figures]
    count = f"{len(figures)} row{'s' if len(figures) > 1 else ''}"
    span = f"{_number(min(values))}-{_number(max(values))} {target.unit} over {count}"
    if target.by_median:
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


def report(rows, names=None) -> str:
    """Every target's lines for ``rows`` (from :func:`load`), one per file
    and thread count; a file's lines start with its name in ``names`` where
    the target has rows of more than one file."""
    lines = []
    for target in TARGETS:
        lines.append(target.label)
        figures = target.figures(rows)
        if not figures:
            lines.append("  no rows for it in these files")
        files = sorted({f.file for f in figures})
        for file, threads in sorted({(f.file, f.threads) for f in figures}):
            mine = [f for f in figures if (f.file, f.threads) == (file, threads)]
            origin = f"{names[file]}, " if len(files) > 1 and names else ""
            lines.append(f"  {origin}{threads} thread{'s' if threads > 1 else ''}: "
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
    paths = parser.parse_args(argv).json
    print(report(load(paths), names=paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
