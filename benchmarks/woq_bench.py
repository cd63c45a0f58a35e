"""The int8 WoQ GEMM benchmark: same as ``python -m qkern bench``.

    python benchmarks/woq_bench.py --threads 1,2 --json docs/figures/bench-full.json \\
        --plot docs/figures/bench-full.png
"""
import sys

from qkern.__main__ import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
