"""The WoQ GEMM benchmark, in full: what ``python -m qkern bench`` prints
(this machine's roofline, Table 1: each kernel against its reference), then
qkern's int8 GEMM against NumPy, PyTorch and the inference runtimes with
cold weights (Table 2, ``peers.py``, for each thread count), its int4 GEMM
against int8 and the int4 peers (Table 4, ``int4_peers.py``, for each
thread count), and with ``--torch`` an MLP end to end through PyTorch
(Table 3, ``mlp.py``, printed before Table 4); ``--int4-only`` measures
the roofline and times Table 4 alone. ``make bench`` runs it with ``--quick``;
``docs/figures/`` comes from

    python benchmarks/woq_bench.py --threads 1,2 --torch \\
        --json docs/figures/bench-full.json --plot docs/figures/bench-full.png \\
        > docs/figures/bench-full.txt
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from qkern import bench, roofline
from qkern.__main__ import add_bench_arguments, output_path

# The sibling modules, found also where Python leaves the script's folder
# off sys.path (PYTHONSAFEPATH=1, as under make sanitize).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import int4_peers  # noqa: E402
import mlp  # noqa: E402
import peers  # noqa: E402
import plot  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m qkern bench``, and ``--torch`` and ``--plot``."""
    parser = add_bench_arguments(argparse.ArgumentParser(
        prog="python benchmarks/woq_bench.py",
        description="Time every kernel, then qkern's int8 and int4 GEMMs against their "
                    "peers (those installed) on LLM-like shapes with cold weights."))
    parser.add_argument("--torch", action="store_true",
                        help="also time an end-to-end bfloat16 MLP through PyTorch: "
                             "qkern.torch.swap_linears vs torch._weight_int8pack_mm vs dense")
    parser.add_argument("--int4-only", action="store_true",
                        help="measure the roofline, then time the int4 table (Table 4) only")
    parser.add_argument("--plot", type=output_path, metavar="FILE.png",
                        help="also plot %% of roofline and speedups against M (needs matplotlib)")
    return parser


def main(argv=None) -> int:
    """Run the full benchmark on ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    torch, torch_note = peers.load_torch()
    if args.torch and torch is None:
        parser.error(f"--torch needs PyTorch: torch {torch_note}")
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib (pip install matplotlib)")
    start = time.perf_counter()
    threads = bench.thread_counts(args.threads)
    notes = [f"torch: {torch_note}", peers.cold_note()]
    if args.int4_only:
        roof, rows = roofline.measure(tuple(threads)), []
        print(bench.header(threads, args.quick, roof, notes), end="\n\n", flush=True)
    else:
        roof, rows = bench.report(threads, args.quick, notes=notes)
        rows += peers.report(threads, args.quick, roof, torch)
    if args.torch:
        rows += mlp.report(threads[-1], torch)
    int4_torch = torch if hasattr(torch, "_weight_int4pack_mm_for_cpu") else None
    rows += int4_peers.report(threads, args.quick, roof, int4_torch)
    if args.json:
        bench.write_json(args.json, roof, rows)
    if args.plot:
        plot.draw(rows, args.plot)
        print(f"wrote {args.plot}")
    print(bench.closing_line(start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
