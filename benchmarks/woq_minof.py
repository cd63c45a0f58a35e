"""Min-of-N timings of ``qkern.WoqLinear`` on chosen shapes: the side-by-side
figures of CHANGELOG.md and docs/performance.rst.

    python benchmarks/woq_minof.py 4096:4096:64,1024 4096:11008:256 \\
        --threads 1,2 --dtypes bfloat16,float32

Each argument is ``N:K:M[,M...]``. Every row times ``--reps`` calls, each on
the next of ``--copies`` packed copies of the weight, thread counts
alternating call by call within the row, and prints the min and median in
milliseconds: CPU time of the calling thread for one thread (what the host
takes away from the core is not counted), wall time for more. On a shared
machine, compare two builds by running this under each (``PYTHONPATH`` set
to the build), alternately, a few times, and keeping each one's minimum.
"""
import argparse
import itertools
import statistics
import time

import numpy as np

import qkern
from qkern._dtypes import bfloat16

DTYPES = {"bfloat16": bfloat16, "float16": np.dtype(np.float16), "float32": np.dtype(np.float32)}


def _shape(text: str) -> tuple:
    n, k, ms = text.split(":")
    return int(n), int(k), [int(m) for m in ms.split(",")]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="+", type=_shape, metavar="N:K:M[,M...]")
    ap.add_argument("--threads", default="1", help="thread counts, alternated (default 1)")
    ap.add_argument("--dtypes", default="bfloat16", help=f"of {', '.join(DTYPES)}")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--copies", type=int, default=6)
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    rng = np.random.default_rng(0)
    print(f"{'N':>6} {'K':>6} {'M':>5} {'dtype':9} {'kernel':24} {'thr':>3} "
          f"{'min ms':>9} {'median ms':>9}  clock")
    for n, k, ms in args.shapes:
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        scales = rng.uniform(1e-3, 1e-2, n)
        for name in args.dtypes.split(","):
            dtype = DTYPES[name]
            layers = itertools.cycle([qkern.WoqLinear(w, scales.astype(dtype))
                                      for _ in range(args.copies)])
            for m in ms:
                x = rng.standard_normal((m, k)).astype(dtype)
                times = {t: [] for t in threads}
                for _, t in itertools.product(range(args.reps), threads):
                    clock = time.thread_time if t == 1 else time.perf_counter
                    layer = next(layers)
                    t0 = clock()
                    layer(x, num_threads=t)
                    times[t].append(clock() - t0)
                for t, ts in times.items():
                    print(f"{n:6d} {k:6d} {m:5d} {name:9} {layer.kernel_for(m).name:24} {t:3d} "
                          f"{min(ts) * 1e3:9.2f} {statistics.median(ts) * 1e3:9.2f}  "
                          f"{'thread CPU' if t == 1 else 'wall'}", flush=True)


if __name__ == "__main__":
    main()
