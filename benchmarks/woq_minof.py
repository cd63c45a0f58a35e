"""Min-of-N timings of ``qkern.WoqLinear`` (and ``qkern.Int4Linear``) on
chosen shapes: the side-by-side figures of CHANGELOG.md and
docs/performance.rst.

    python benchmarks/woq_minof.py 4096:4096:64,1024 4096:11008:256 \\
        --threads 1,2 --dtypes bfloat16,float32 --weights int8,int8-widened,int4

Each argument is ``N:K:M[,M...]``. Every row times ``--reps`` calls, each on
the next of ``--copies`` packed copies of the weight, the weights (int8;
int8 on a copy widened beforehand for the kernel of this ISA level that
reads one, made before the timing; int4 in groups of 128; int4 forced
onto this level's kernel on dequantized weights, whatever M;
``int8-functional``, ``qkern.weight_int8pack_mm`` on the row-major
weight, which packs per call unless a kernel on the unpacked weight
takes M; ``dense-torch``, ``torch.mm`` in the row's dtype on the int8
values as a dense weight (no scales: the same work, not the layer's
product), when PyTorch is installed, x handed over without a copy and
PyTorch's thread count set before the clock starts (its threads spin
after each call and slow the next: compare with it where a call takes
milliseconds, docs/performance.rst, "How to measure"); ``int8:NAME``
or ``int4:NAME``, a layer forced onto registry kernel NAME, to time
kernels of different levels side by side, e.g.
``--weights int8:bf16_gemm_32x32c2__amx,int8:f32_gemm_4x32c2__avx512``) and thread
counts alternating call by call within the row, and prints each layer's
memory and the min and median in
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
from qkern import bench
from qkern._dtypes import DTYPES, bfloat16

WEIGHTS = ("int8", "int8-widened", "int8-functional", "int4", "int4-dequantized",
           "dense-torch")


class _Functional:
    """``qkern.weight_int8pack_mm`` on a row-major weight, called as a
    layer is."""

    def __init__(self, w, scales):
        self.w, self.scales = w, scales
        self.nbytes = w.nbytes

    def __call__(self, x, num_threads):
        return qkern.weight_int8pack_mm(x, self.w, self.scales, num_threads=num_threads)

    def kernel_for(self, m):
        return qkern.dispatch.choose_kernel(self.scales.dtype, m, unpacked_ok=True,
                                            n=self.w.shape[0])


class _TorchDense:
    """Dense ``torch.mm`` in the activation dtype on the int8 values of
    ``w`` (unscaled), called as a layer is; :meth:`set_threads` sets
    PyTorch's thread count, which the call then uses."""

    def __init__(self, w, dtype):
        try:
            import torch
        except ImportError:
            raise SystemExit("dense-torch: PyTorch is not installed") from None
        self.torch = torch
        dense = torch.from_numpy(w.astype(np.float32)).to(getattr(torch, np.dtype(dtype).name))
        self.w = dense.t()  # (K, N), as nn.Linear
        self.nbytes = self.w.element_size() * self.w.numel()

    def set_threads(self, num_threads):
        if self.torch.get_num_threads() != num_threads:
            self.torch.set_num_threads(num_threads)

    def to_torch(self, x):
        """x as a tensor on the same memory (bfloat16 through an int16 view)."""
        if x.dtype == bfloat16:
            return self.torch.from_numpy(x.view(np.int16)).view(self.torch.bfloat16)
        return self.torch.from_numpy(x)

    def __call__(self, x, num_threads):
        return self.torch.mm(self.to_torch(x), self.w)

    def kernel_for(self, m):
        return argparse.Namespace(name="torch.mm")


def _widened_layer(w, scales, x):
    """A WoqLinear forced onto the kernel that reads a widened copy at the
    static choice's ISA level, with the budget for the copy, made now."""
    dtype, (n, k) = scales.dtype, w.shape
    isa = qkern.dispatch.choose_kernel(dtype, 1).isa
    kern = next((kern for kern in qkern.kernels() if kern.available and kern.isa == isa
                 and kern.reads_widened_copy and qkern.dispatch.dtype_name(dtype) in kern.dtypes),
                None)
    if kern is None:
        raise SystemExit(f"int8-widened: no kernel of level {isa} reads a widened copy")
    layer = qkern.WoqLinear(w, scales, kernel=kern.name,
                            memory_budget=qkern.dispatch.widened_nbytes(kern, n, k))
    layer(x[:1])
    return layer


def _dequantized_layer(rng, n, k, dtype):
    """An Int4Linear forced onto the kernel on dequantized weights at the
    static choice's ISA level."""
    isa = qkern.dispatch.choose_kernel(dtype, 1, weight_format=qkern.dispatch.INT4).isa
    kern = next((kern for kern in qkern.kernels() if kern.available and kern.isa == isa
                 and kern.dequantizes and qkern.dispatch.dtype_name(dtype) in kern.dtypes), None)
    if kern is None:
        raise SystemExit(f"int4-dequantized: no kernel of level {isa} dequantizes int4")
    return bench.random_int4_layer(rng, n, k, dtype, kernel=kern.name)


def _forced(form: str, w, scales, rng):
    """A maker of layers forced onto the kernel ``form`` names (``int8:NAME``
    or ``int4:NAME``)."""
    weight, kernel = form.split(":", 1)
    if weight == "int8":
        return lambda: qkern.WoqLinear(w, scales, kernel=kernel)
    n, k = w.shape
    return lambda: bench.random_int4_layer(rng, n, k, scales.dtype, kernel=kernel)


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
    ap.add_argument("--weights", default="int8",
                    help=f"of {', '.join(WEIGHTS)} (default int8)")
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    weights = args.weights.split(",")
    if not weights or not all(w in WEIGHTS or w.partition(":")[0] in ("int8", "int4")
                              for w in weights):
        ap.error(f"--weights: expected some of {', '.join(WEIGHTS)}, int8:KERNEL or "
                 f"int4:KERNEL, got {args.weights!r}")
    rng = np.random.default_rng(0)
    print(f"{'N':>6} {'K':>6} {'M':>5} {'dtype':9} {'weight':16} {'kernel':30} {'MiB':>5} "
          f"{'thr':>3} {'min ms':>9} {'median ms':>9}  clock")
    for n, k, ms in args.shapes:
        w = rng.integers(-128, 128, (n, k), dtype=np.int8)
        scales = rng.uniform(1e-3, 1e-2, n)
        for name in args.dtypes.split(","):
            dtype = DTYPES[name]
            made = {form: _forced(form, w, scales.astype(dtype), rng)
                    for form in weights if ":" in form}
            made |= {"int8": lambda: qkern.WoqLinear(w, scales.astype(dtype)),
                    "int8-widened": lambda: _widened_layer(w, scales.astype(dtype),
                                                           np.zeros((1, k), dtype)),
                    "int8-functional": lambda: _Functional(w.copy(), scales.astype(dtype)),
                    "int4": lambda: bench.random_int4_layer(rng, n, k, dtype),
                    "int4-dequantized": lambda: _dequantized_layer(rng, n, k, dtype),
                    "dense-torch": lambda: _TorchDense(w, dtype)}
            layers = {form: itertools.cycle([made[form]() for _ in range(args.copies)])
                      for form in weights}
            for m in ms:
                x = rng.standard_normal((m, k)).astype(dtype)
                times = {(form, t): [] for form in weights for t in threads}
                for _, form, t in itertools.product(range(args.reps), weights, threads):
                    clock = time.thread_time if t == 1 else time.perf_counter
                    layer = next(layers[form])
                    if hasattr(layer, "set_threads"):
                        layer.set_threads(t)
                    t0 = clock()
                    layer(x, num_threads=t)
                    times[form, t].append(clock() - t0)
                for (form, t), ts in times.items():
                    layer = next(layers[form])
                    label = form.split(":")[0] + (" forced" if ":" in form else "")
                    print(f"{n:6d} {k:6d} {m:5d} {name:9} {label:16} "
                          f"{layer.kernel_for(m).name:30} {layer.nbytes / 2**20:5.0f} {t:3d} "
                          f"{min(ts) * 1e3:9.2f} {statistics.median(ts) * 1e3:9.2f}  "
                          f"{'thread CPU' if t == 1 else 'wall'}", flush=True)


if __name__ == "__main__":
    main()
