"""Fuzz targets: one per public entry point of qkern.

A target takes a byte string, decodes one call from it (`Draw` makes every
byte string a call, so a coverage-guided fuzzer can mutate freely), makes
the call and checks the outcome.  The contract checked, for every input:

* a call that the documentation allows returns the right result: the
  documented shape and dtype, every element within the error bound of
  tests/reference.py (NaN and inf only where that bound allows them), the
  same bits for rows of x that are the same, and ``out`` itself when given;
* a call that the documentation forbids raises TypeError or ValueError;
* either way no byte of an input changes and no byte outside ``out`` is
  written: every array lives in a buffer of its own, with a margin around
  it, compared with a snapshot after the call;
* nothing else happens.  Any other exception, a crash or a hang is a
  finding.

The inputs cover the dtypes (and wrong ones), shapes from empty to huge,
strides (axes permuted, reversed, stepped, broadcast with stride 0, one byte
off alignment), ``out`` views (strided, overlapping an input, overlapping
itself, read-only), ``num_threads`` values, NaN, inf, subnormals and values
large enough to overflow fp32.  "Huge" shapes have M * K > 2**31 elements,
where 32-bit index arithmetic would wrap, in a few MiB: their rows are
broadcast (stride 0), and the check computes the reference on the distinct
rows only.

tests/fuzz.py runs the targets under atheris (coverage-guided);
tests/tooling/test_fuzz_targets.py runs them in pytest on hypothesis-drawn bytes.
A new entry point is one more function here, ``fuzz_<name>(data: bytes)``,
and one more line in `TARGETS`.

Arrays are compared here with ufuncs (``np.not_equal(a, b)``), never with
operators (``a != b``): atheris 3.0 replaces each comparison operator in the
code it instruments with a traced call that keeps its result alive, so an
operator comparison of arrays leaks the whole result array on every call
and the run ends at the RSS limit.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import pickle

import numpy as np

import qkern
from conftest import int4_bound_traits, woq_bound_traits
from qkern.__main__ import build_parser
from qkern.woq_int4 import GROUP_SIZES
from reference import BF16, DTYPES, assert_int4_close, assert_woq_close

F16 = np.dtype(np.float16)
BAD_DTYPES = tuple(np.dtype(d) for d in
                   (np.float64, np.int8, np.int32, np.bool_, np.complex64, ">f4", ">f2"))
HUGE = 2**31  # M * K above this, or rows this many bytes apart: 32-bit indices wrap
MARGIN = 64  # bytes of buffer before and after every array
THREADS = (1, 2, 3, 8, np.int64(2), 2**31 - 1, 0, -1, 2**31, 2**40, 1.5, True, "2")


class Finding(AssertionError):
    """The outcome of a call broke the contract in the module docstring."""


class Draw:
    """Choices decoded from fuzzer bytes.

    Deterministic, and total: once the bytes run out every choice is its
    smallest value, so any byte string decodes to a call.
    """

    def __init__(self, data: bytes):
        self._data = data
        self._pos = 0

    def int(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""
        span = hi - lo + 1
        n = (span.bit_length() + 7) // 8 + 1
        chunk = self._data[self._pos:self._pos + n]
        self._pos += n
        return lo + int.from_bytes(chunk, "little") % span

    def pick(self, seq):
        """One element of a sequence."""
        return seq[self.int(0, len(seq) - 1)]

    def chance(self, one_in: int) -> bool:
        """True about once in `one_in` draws (never once the bytes ran out)."""
        return self.int(0, one_in - 1) == one_in - 1

    def rng(self) -> np.random.Generator:
        """A NumPy generator seeded from the bytes, for bulk values."""
        return np.random.default_rng(self.int(0, 2**32 - 1))


def _byte_offsets(a: np.ndarray) -> np.ndarray:
    """Byte offsets, from element 0, of every byte of every element of ``a``."""
    offsets = np.zeros([1] * a.ndim + [a.itemsize], dtype=np.int64)
    offsets += np.arange(a.itemsize)
    for axis, (n, s) in enumerate(zip(a.shape, a.strides)):
        shape = [1] * (a.ndim + 1)
        shape[axis] = n
        offsets = offsets + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return offsets.ravel()


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class Buffers:
    """The buffers a call's arrays live in, to check what the call wrote.

    A buffer is checked whole, except a sparse one (for rows more than 2**31
    bytes apart): only the bytes around its array's elements are checked
    there.  A sparse buffer is an anonymous mapping of its own, never touched
    elsewhere, so it costs address space, not memory (nor, under
    AddressSanitizer, gigabytes of shadow memory to poison).
    """

    def __init__(self):
        self._bufs = []
        self._regions = []  # (buffer, first byte, end byte) to compare with the snapshot
        self._saved = []

    def array(self, shape: tuple, dtype, strides: tuple, offset: int,
              sparse: bool = False) -> np.ndarray:
        """A writeable view of a fresh zeroed buffer, MARGIN bytes clear of its ends.

        ``offset`` is added to the byte offset of element 0; strides may be
        negative or zero.
        """
        dtype = np.dtype(dtype)
        lo = hi = 0
        for n, s in zip(shape, strides):
            if n > 1:
                lo, hi = (lo + (n - 1) * s, hi) if s < 0 else (lo, hi + (n - 1) * s)
        start = MARGIN + offset - lo
        size = start + hi + dtype.itemsize + MARGIN
        buf = np.frombuffer(mmap.mmap(-1, size), np.uint8) if sparse else np.zeros(size, np.uint8)
        a = np.ndarray(shape, dtype, buffer=buf, offset=start, strides=strides)
        self._bufs.append(buf)
        if not sparse:
            self._regions.append((buf, 0, buf.nbytes))
        elif a.size:  # runs of bytes within 2 * MARGIN of each other, plus MARGIN around
            at = np.unique(_byte_offsets(a)) + start
            breaks = np.flatnonzero(np.greater(np.diff(at), 2 * MARGIN))
            for first, last in zip(np.r_[at[0], at[breaks + 1]], np.r_[at[breaks], at[-1]]):
                self._regions.append((buf, max(first - MARGIN, 0),
                                      min(last + 1 + MARGIN, buf.nbytes)))
        return a

    def buffer_of(self, a: np.ndarray) -> np.ndarray:
        """The buffer that ``a`` (made by `array`) is a view of."""
        while not any(a is b for b in self._bufs):
            a = a.base
        return a

    def snapshot(self):
        """Record the bytes to check (once all arrays are filled)."""
        self._saved = [buf[lo:hi].copy() for buf, lo, hi in self._regions]

    def assert_untouched(self, out=None):
        """No byte changed since `snapshot`, except the bytes of ``out``."""
        out_bytes = _address(out) + _byte_offsets(out) if out is not None else None
        for (buf, lo, hi), saved in zip(self._regions, self._saved):
            changed = np.not_equal(buf[lo:hi], saved)
            if out_bytes is not None:
                inside = out_bytes - (_address(buf) + lo)
                in_region = np.logical_and(np.greater_equal(inside, 0), np.less(inside, hi - lo))
                changed[inside[in_region]] = False
            if changed.any():
                raise Finding(f"{int(changed.sum())} bytes changed outside out")


def _layout(draw: Draw, shape: tuple, itemsize: int, broadcast: tuple, far: bool = False):
    """Drawn strides and byte offset for `shape`: an axis order, steps, signs,
    stride 0 on the axes in `broadcast`, and maybe one byte off alignment.
    With `far`, the axes stay in C order and the first steps over more than
    2**31 bytes."""
    nd = len(shape)
    order = list(range(nd))
    if nd > 1 and not far and draw.chance(4):
        order = [int(a) for a in draw.rng().permutation(nd)]
    strides = [0] * nd
    step = itemsize
    for axis in reversed(order):  # the last axis of `order` varies fastest
        if axis in broadcast:
            continue
        pad = draw.pick((1, 1, 1, 2, 3))
        strides[axis] = draw.pick((1, 1, 1, -1)) * step * pad
        step *= pad * max(shape[axis], 1)
    if far and nd:
        far_step = (2**31 // itemsize + draw.int(1, 64)) * itemsize
        strides[0] = draw.pick((1, -1)) * max(far_step, abs(strides[0]))
    offset = 1 if itemsize > 1 and draw.chance(6) else 0
    return tuple(strides), offset


def _place(draw: Draw, bufs: Buffers, values: np.ndarray, shape: tuple, far=False) -> np.ndarray:
    """An array of `shape` holding np.broadcast_to(values, shape), laid out as
    drawn; the axes where `values` has length 1 and `shape` more are stride 0."""
    broadcast = tuple(a for a, (u, n) in enumerate(zip(values.shape, shape)) if u == 1 and n > 1)
    strides, offset = _layout(draw, shape, values.itemsize, broadcast, far)
    a = bufs.array(shape, values.dtype, strides, offset, sparse=far)
    a[tuple(slice(0, 1) if ax in broadcast else slice(None) for ax in range(len(shape)))] = values
    return a


def _values(draw: Draw, shape: tuple, dtype, magnitude: int) -> np.ndarray:
    """Floats of about 2**magnitude, of both signs, special values sprinkled in."""
    rng = draw.rng()
    v = rng.standard_normal(shape) * 2.0**magnitude
    if v.size and draw.chance(3):
        info = np.finfo(np.float32 if dtype == BF16 else dtype)
        specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, float(info.max), 2.0**-133, 1e-45, 2.0**-24]
        idx = rng.integers(0, v.size, size=draw.int(1, 4))
        v.flat[idx] = rng.choice(specials, size=idx.size) * rng.choice([-1.0, 1.0], size=idx.size)
    with np.errstate(over="ignore", invalid="ignore"):
        return v.astype(dtype)


def _rows_apart(shape: tuple, strides: tuple):
    """The byte distance between consecutive rows (C order over `shape`),
    or None when the rows are not evenly spaced."""
    if int(np.prod(shape)) < 2:
        return 0
    offsets = sum(np.arange(n).reshape((-1,) + (1,) * (len(shape) - a - 1)) * s
                  for a, (n, s) in enumerate(zip(shape, strides))).ravel()
    steps = np.unique(np.diff(offsets))
    return int(steps[0]) if steps.size == 1 else None


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Same bits, except that any two NaNs are the same: IEEE 754 leaves the
    sign and payload of a NaN result open, and they depend on the order of
    operands, which can differ between the rows of one kernel
    (docs/semantics.rst, Determinism)."""
    nan_a, nan_b = np.isnan(a.astype(np.float32)), np.isnan(b.astype(np.float32))
    int_type = np.dtype(f"u{a.itemsize}")
    return bool(np.array_equal(nan_a, nan_b)
                and np.array_equal(a.view(int_type)[~nan_a], b.view(int_type)[~nan_b]))


def _is_vector(v, n: int, dtype) -> bool:
    return isinstance(v, np.ndarray) and v.ndim == 1 and v.shape[0] == n and v.dtype == dtype


def param_refusals(w, scales, bias, kernel) -> list:
    """The documented rules for the weight, scales, bias and kernel that fail."""
    bad = []
    if not (isinstance(w, np.ndarray) and w.ndim == 2 and w.dtype == np.int8):
        return ["w not a 2-d int8 array"]
    if not w.flags.c_contiguous:
        bad.append("w not C-contiguous")
    dtype = scales.dtype if isinstance(scales, np.ndarray) else None
    if dtype not in DTYPES or not _is_vector(scales, w.shape[0], dtype):
        bad.append("scales not an (N,) float32, float16 or bfloat16 array")
    if bias is not None and not _is_vector(bias, w.shape[0], dtype):
        bad.append("bias not an (N,) array of the dtype of scales")
    if kernel is not None:
        kern = {k.name: k for k in qkern.kernels()}.get(kernel)
        accepts = dtype not in DTYPES or dtype.name in getattr(kern, "dtypes", ())
        if kern is None or not kern.available or not accepts:
            bad.append(f"kernel {kernel} cannot run here with dtype {dtype}")
        elif kern.weight_format != "int8_per_channel":
            bad.append(f"kernel {kernel} reads {kern.weight_format} weights")
    return bad


def call_refusals(x, dtype, k: int, n: int, out, inputs: tuple, threads) -> list:
    """The documented rules for x (of dtype `dtype`, last axis `k`), ``out``
    (shape (..., `n`), not overlapping `inputs`) and ``num_threads`` that fail."""
    bad = []
    if not (isinstance(x, np.ndarray) and x.ndim >= 1 and x.dtype == dtype and x.shape[-1] == k):
        return [f"x not a (..., {k}) array of dtype {dtype}"]
    if out is not None:
        rows = _rows_apart(out.shape[:-1], out.strides[:-1]) if out.ndim else None
        if out.shape != x.shape[:-1] + (n,) or out.dtype != dtype:
            bad.append("out shape or dtype")
        elif not out.flags.writeable:
            bad.append("out read-only")
        elif out.size and ((n > 1 and out.strides[-1] != out.itemsize) or rows is None):
            bad.append("out rows not unit-stride and evenly spaced")
        elif out.size > n and abs(rows) < n * out.itemsize:
            bad.append("out rows overlap each other")
        bad += [f"out overlaps {name}" for name, a in inputs
                if isinstance(a, np.ndarray) and np.shares_memory(out, a)]
    if threads is not None:
        if isinstance(threads, (bool, float, str)):
            bad.append("num_threads not an int")
        elif not 1 <= threads <= 2**31 - 1:
            bad.append("num_threads out of range")
    return bad


class WoqCall:
    """One drawn WoQ GEMM problem, every array in `bufs`."""

    def __init__(self, draw: Draw):
        self.draw = d = draw
        self.bufs = Buffers()
        dtype = d.pick(DTYPES)
        size = "huge" if d.chance(64) else "far" if d.chance(16) else "small"
        if size == "huge":  # M * K > 2**31 elements, rows broadcast (a few seconds of work)
            k = d.int(2**14, 2**17)
            m_min = HUGE // k + 1
            n = d.int(1, 2)
            if d.chance(2):  # rows broadcast along one axis
                lead, distinct = (m_min + d.int(0, 64),), (1,)
            else:  # along the first of two axes that do not collapse into one stride
                b = d.int(2, 16)
                lead, distinct = (-(-m_min // b), b), (1, b)
        else:
            k = d.pick((d.int(0, 40), d.int(0, 300), d.pick((1, 2, 15, 16, 17, 31, 32, 33, 64))))
            n = d.pick((d.int(0, 40), d.int(0, 100), d.pick((1, 15, 16, 17, 31, 32, 33))))
            if size == "far":  # rows more than 2**31 bytes apart
                lead = (d.int(2, 3),)
            else:
                lead = tuple(d.int(0, 7) for _ in range(d.pick((0, 1, 1, 1, 2, 3))))
            distinct = tuple(1 if d.chance(5) else m for m in lead)
        self.n, self.k = n, k

        magnitude = d.int(-16, 4) if dtype == F16 else d.int(-20, 20)
        x = _values(d, distinct + (k,), dtype, magnitude)
        if d.chance(16):
            with np.errstate(invalid="ignore", over="ignore"):
                x = x.astype(np.float64).astype(d.pick(BAD_DTYPES))
        self.x = _place(d, self.bufs, x, lead + (k,), far=size == "far")
        if d.chance(40):
            self.x = self.x.tolist() if self.x.size < 1000 else None
        elif d.chance(40):
            self.x = _place(d, self.bufs, np.zeros((), x.dtype), ())

        rng = d.rng()
        w = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
        if w.size and d.chance(2):
            w.flat[rng.integers(0, w.size, size=3)] = rng.choice([-128, 127, 0], size=3)
        if d.chance(20):
            w = np.resize(w, (n, max(k + d.pick((-1, 1)), 0)))
        if d.chance(20):
            w = w.astype(d.pick((np.int16, np.uint8, np.float32)))
        self.w = _place(d, self.bufs, w, w.shape)
        if d.chance(40):
            self.w = self.w.reshape(-1)

        self.scales = self._vector(dtype, d.int(-12, 0))
        self.bias = self._vector(dtype, d.int(-4, 8)) if d.chance(2) else None

    def _vector(self, dtype, magnitude: int) -> np.ndarray:
        d = self.draw
        v = _values(d, (max(self.n + (d.pick((-1, 1)) if d.chance(20) else 0), 0),), dtype,
                    magnitude)
        if d.chance(20):
            with np.errstate(over="ignore"):
                v = v.astype(d.pick(DTYPES + (np.dtype(np.float64),)))
        v = _place(d, self.bufs, v, v.shape)
        return v.reshape(-1, 1) if d.chance(40) else v

    def draw_out(self):
        """None, or an ``out`` array poisoned with NaN: mostly right, sometimes not."""
        d = self.draw
        if not d.chance(3):
            return None
        x = self.x
        lead = x.shape[:-1] if isinstance(x, np.ndarray) and x.ndim else (2,)
        dtype = x.dtype if isinstance(x, np.ndarray) and x.dtype in DTYPES else d.pick(DTYPES)
        kind = d.pick(("view", "view", "view", "far", "in_x", "self_overlap", "read_only", "bad"))
        shape = lead + (self.n,)
        if kind == "bad":
            shape = d.pick((shape[:-1] + (self.n + 1,), shape[1:], shape))
            dtype = d.pick(DTYPES + (np.dtype(np.float64),))
        poison = np.full(shape, np.nan, dtype=dtype)
        if kind == "in_x" and isinstance(x, np.ndarray) and poison.size:
            buf = self.bufs.buffer_of(x)
            start = d.int(0, max(buf.nbytes - poison.nbytes, 0))
            if poison.nbytes <= buf.nbytes - start:
                out = np.ndarray(shape, dtype, buffer=buf, offset=start)
                out[...] = poison  # before the snapshot; the margins may be written
                return out
        if kind == "far" and len(lead) == 1 and 2 <= lead[0] <= 3:
            far = (2**31 // poison.itemsize + d.int(1, 64)) * poison.itemsize
            out = self.bufs.array(shape, dtype, (d.pick((1, -1)) * far, poison.itemsize), 0,
                                  sparse=True)
            out[...] = poison
            return out
        if kind == "self_overlap" and int(np.prod(lead)) > 1:
            out = self.bufs.array(shape, dtype, (0,) * len(lead) + (poison.itemsize,), 0)
            out[...] = np.nan
            return out
        out = _place(d, self.bufs, poison, shape)
        if kind == "read_only":
            out.flags.writeable = False
        return out

    def draw_threads(self):
        return None if self.draw.chance(2) else self.draw.pick(THREADS)

    def expect(self, call, refusals: list, out=None):
        """``call()``, which must raise TypeError or ValueError if and only if
        `refusals` lists a reason, and write nothing but ``out``.  Returns its
        result, or None when it was refused."""
        self.bufs.snapshot()
        try:
            result = call()
        except (TypeError, ValueError) as e:
            if not refusals:
                raise Finding(f"a valid call raised {e!r}") from e
            self.bufs.assert_untouched()
            return None
        if refusals:
            raise Finding(f"a call that must be refused returned ({'; '.join(refusals)})")
        self.bufs.assert_untouched(out)
        return result

    def check_result(self, y: np.ndarray, out):
        """y is ``out`` (when given), of the right shape and dtype, and within
        the reference bound on the distinct rows of x."""
        x = self.x
        if out is not None and y is not out:
            raise Finding("out given, another array returned")
        if y.shape != x.shape[:-1] + (self.n,) or y.dtype != x.dtype:
            raise Finding(f"result {y.shape} {y.dtype}, "
                          f"expected {x.shape[:-1] + (self.n,)} {x.dtype}")
        if y.size == 0:
            return
        distinct = tuple(slice(0, 1) if s == 0 and m > 1 else slice(None)
                         for m, s in zip(x.shape[:-1], x.strides[:-1]))
        y_d = y[distinct]
        if not _same_bits(np.broadcast_to(y_d, y.shape), y):
            raise Finding("equal rows of x gave different rows of y")
        rows = y_d.size // self.n
        try:
            self.assert_close(y_d.reshape(rows, self.n), x[distinct].reshape(rows, self.k))
        except AssertionError as e:
            raise Finding(f"result outside the reference bound: {e}") from e

    def assert_close(self, y: np.ndarray, x: np.ndarray):
        """y (rows, N) against the reference of x (rows, K), within its bound."""
        assert_woq_close(y, x, self.w, self.scales, self.bias, **woq_bound_traits(x.dtype))


def fuzz_weight_int8pack_mm(data: bytes):
    """`qkern.weight_int8pack_mm`, every argument drawn."""
    c = WoqCall(Draw(data))
    out, threads = c.draw_out(), c.draw_threads()
    refusals = param_refusals(c.w, c.scales, c.bias, None)
    if not refusals:
        refusals = call_refusals(c.x, c.scales.dtype, c.w.shape[1], c.n, out,
                                 (("x", c.x), ("w", c.w), ("scales", c.scales),
                                  ("bias", c.bias)), threads)
    y = c.expect(lambda: qkern.weight_int8pack_mm(c.x, c.w, c.scales, bias=c.bias, out=out,
                                                  num_threads=threads), refusals, out)
    if y is not None:
        c.check_result(y, out)


def fuzz_woq_linear(data: bytes):
    """`qkern.WoqLinear`: construction (maybe forcing a kernel, maybe with a
    memory budget for a widened copy), maybe a pickle round trip, a call,
    and maybe a second call that must give the same bits."""
    d = Draw(data)
    c = WoqCall(d)
    kernel = None
    if d.chance(3):
        kernel = "no_such_kernel" if d.chance(10) else d.pick(qkern.kernels()).name
    budget = d.pick((0, 1 << 30, -1)) if d.chance(3) else 0
    refusals = param_refusals(c.w, c.scales, c.bias, kernel)
    if budget < 0:
        refusals.append("memory_budget < 0")
    layer = c.expect(lambda: qkern.WoqLinear(c.w, c.scales, c.bias, kernel=kernel,
                                             memory_budget=budget), refusals)
    if layer is None:
        return
    if d.chance(4):
        layer = pickle.loads(pickle.dumps(layer))
    out, threads = c.draw_out(), c.draw_threads()
    refusals = call_refusals(c.x, layer.dtype, layer.shape[1], c.n, out, (("x", c.x),), threads)
    y = c.expect(lambda: layer(c.x, out=out, num_threads=threads), refusals, out)
    if y is None:
        return
    c.check_result(y, out)
    if d.chance(4):
        again = layer(c.x)
        if not _same_bits(y, again):
            raise Finding("a second call gave different bits")


CLI_WORDS = ("info", "bench", "tune", "tunes", "--quick", "--threads", "--json", "--plot",
             "--torch", "-h", "--help", "1,2", "2,0", "--shapes", "4096x4096", "64x0", "8x8x8",
             "x", "--m", "--dtypes", "bfloat16", "float32,float16", "float64", ",",
             "--exhaustive", "--int4-group", "128", "48", "--memory-budget", "512M", "1G",
             "2T",
             "--", "-", "=", "0", "1", "-1", "64", "1e3", "0x10", " 7", "\x00", "\u00e9",
             "/", ".", "..", "/nonexistent/dir/f.json", "out.json", "--threads=2",
             "--json=/", "--qui", "--thr", "\udcff")


def fuzz_cli_args(data: bytes):
    """``python -m qkern`` argument parsing: a valid command, or a usage error."""
    d = Draw(data)
    check_cli_args([bytes(d.int(0, 255) for _ in range(d.int(0, 8))).decode(
        "utf-8", "surrogateescape") if d.chance(5) else d.pick(CLI_WORDS)
        for _ in range(d.int(0, 6))])


def check_cli_args(argv: list):
    """Parse ``argv``: a usage message and exit status 0 (help) or 2 (error),
    or a command whose options hold the values they promise."""
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            args = build_parser().parse_args(argv)
    except SystemExit as e:
        if (e.code == 0 and "usage:" in stdout.getvalue()) or \
                (e.code == 2 and "error:" in stderr.getvalue()):
            return
        raise Finding(f"argv {argv!r}: exit {e.code!r} without a usage message") from e
    if args.command == "info":
        return
    if args.command not in ("bench", "tune"):
        raise Finding(f"argv {argv!r}: unknown command {args.command!r} accepted")
    counts = args.threads if isinstance(args.threads, list) else [args.threads]
    if args.threads is not None and not all(isinstance(t, int) and t >= 1 for t in counts):
        raise Finding(f"argv {argv!r}: --threads {args.threads!r} accepted")
    if args.command == "tune":
        _check_tune_args(argv, args)
        return
    path = args.json
    if path is not None and (os.path.isdir(path)
                             or not os.path.isdir(os.path.dirname(os.path.abspath(path)))):
        raise Finding(f"argv {argv!r}: --json {path!r} accepted")


def _check_tune_args(argv: list, args) -> None:
    """``tune``'s options hold what they promise: (N, K) pairs, M counts,
    dtypes and an int4 group size qkern accepts."""
    def positive(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 1

    if not (args.shapes and all(len(s) == 2 and all(map(positive, s)) for s in args.shapes)):
        raise Finding(f"argv {argv!r}: --shapes {args.shapes!r} accepted")
    if not (args.m and all(map(positive, args.m))):
        raise Finding(f"argv {argv!r}: --m {args.m!r} accepted")
    if not (args.dtypes and set(args.dtypes) <= {"bfloat16", "float16", "float32"}):
        raise Finding(f"argv {argv!r}: --dtypes {args.dtypes!r} accepted")
    if not isinstance(args.exhaustive, bool):
        raise Finding(f"argv {argv!r}: --exhaustive {args.exhaustive!r}")
    if type(args.memory_budget) is not int or args.memory_budget < 0:
        raise Finding(f"argv {argv!r}: --memory-budget {args.memory_budget!r} accepted")
    if args.int4_group not in (0, 32, 64, 128, 256):
        raise Finding(f"argv {argv!r}: --int4-group {args.int4_group!r} accepted")


def fuzz_qconv2d(data: bytes):
    """`qkern.qconv2d` on NumPy arrays (the CPU path): a valid drawn call must
    equal the exact reference element for element; a call with a drawn fault
    (wrong dtype, layout, channels, scale, geometry, ``out``) must raise
    TypeError or ValueError and leave ``out`` untouched."""
    from qconv_reference import qconv2d_reference

    d = Draw(data)
    rng = d.rng()
    groups = d.pick((1, 1, 2, 3))
    n, h, w_ = d.int(0, 2), d.int(1, 9), d.int(1, 9)
    c, o = groups * d.int(1, 5), groups * d.int(1, 5)
    kh, kw = d.int(1, min(h, 4)), d.int(1, min(w_, 4))
    stride, dilation = d.int(1, 3), 1
    padding = d.int(0, 2)
    x = rng.integers(-128, 128, (n, h, w_, c), dtype=np.int8)
    w = rng.integers(-128, 128, (o, kh, kw, c // groups), dtype=np.int8)
    bias = rng.standard_normal(o).astype(np.float32) * 4 if d.chance(2) else None
    wscale = (rng.uniform(1e-3, 1e-1, o).astype(np.float32) if d.chance(2)
              else float(rng.uniform(1e-3, 1e-1)))
    kwargs = dict(act_scale=float(rng.uniform(1e-3, 1e-1)), weight_scale=wscale,
                  out_scale=float(rng.uniform(1e-2, 1.0)), stride=stride, padding=padding,
                  dilation=dilation, groups=groups, relu=d.chance(2))
    fault = d.pick((None, None, None, "x dtype", "w dtype", "x ndim", "channels", "act_scale",
                    "out_scale", "weight_scale len", "bias dtype", "stride", "groups", "out"))
    if fault == "x dtype":
        x = x.astype(d.pick((np.int16, np.uint8, np.float32)))
    elif fault == "w dtype":
        w = w.astype(d.pick((np.int16, np.uint8, np.float32)))
    elif fault == "x ndim":
        x = x.reshape(-1, c)
    elif fault == "channels":
        w = rng.integers(-128, 128, (o, kh, kw, c // groups + 1), dtype=np.int8)
    elif fault in ("act_scale", "out_scale"):
        kwargs[fault] = d.pick((0.0, -1.0, float("nan"), float("inf")))
    elif fault == "weight_scale len":
        kwargs["weight_scale"] = np.ones(o + 1, np.float32)
    elif fault == "bias dtype":
        bias = np.ones(o, np.float64)
    elif fault == "stride":
        kwargs["stride"] = d.pick((0, -1))
    elif fault == "groups":
        kwargs["groups"] = d.pick((0, c + 1))
    out = None
    if fault == "out" or (fault is None and d.chance(3)):
        shape = qconv2d_reference(x, w, bias, **kwargs).shape  # the call is valid but for out
        if fault == "out":
            shape = shape[:-1] + (shape[-1] + 1,)
        out = np.full(shape, 77, np.int8)
    before = None if out is None else out.copy()
    try:
        y = qkern.qconv2d(x, w, bias, out=out, **kwargs)
    except (TypeError, ValueError) as e:
        if fault is None:
            raise Finding(f"a valid call refused: {e!r}") from e
        if out is not None and not np.array_equal(out, before):
            raise Finding(f"refused ({fault}) but wrote into out") from e
        return
    if fault is not None:
        raise Finding(f"a call with a bad {fault} was accepted")
    ref = qconv2d_reference(x, w, bias, **kwargs)
    if y.dtype != np.int8 or y.shape != ref.shape or not np.array_equal(y, ref):
        raise Finding("result differs from the exact reference")
    if out is not None and y is not out:
        raise Finding("out= given but another array returned")


class Int4Call(WoqCall):
    """One drawn int4 WoQ GEMM problem (x, packed weight, group size,
    scales_and_zeros, bias), each part sometimes wrong; x finite."""

    def __init__(self, draw: Draw):
        self.draw = d = draw
        self.bufs = Buffers()
        dtype = d.pick(DTYPES)
        self.group_size = d.pick((16, 48, 0, 33)) if d.chance(10) else d.pick(GROUP_SIZES)
        unit = self.group_size if self.group_size in GROUP_SIZES else 32
        k = max(unit * d.int(0, 3) + (d.pick((-1, 1, 16)) if d.chance(10) else 0), 0)
        n = d.pick((d.int(0, 40), d.int(0, 100), d.pick((1, 15, 16, 17, 31, 32, 33, 64))))
        self.n, self.k = n, k
        lead = tuple(d.int(0, 6) for _ in range(d.pick((0, 1, 1, 1, 2))))
        distinct = tuple(1 if d.chance(5) else m for m in lead)
        rng = d.rng()
        # now and then near fp32's overflow, where the group sums may overflow
        # (docs/int4.rst, "Error bound"); float16 cannot hold such x
        huge = dtype != np.float16 and d.chance(8)
        magnitude = d.int(100, 124) if huge else d.int(-10, 6)
        x = (rng.standard_normal(distinct + (k,)) * 2.0 ** magnitude).astype(dtype)
        if d.chance(16):
            with np.errstate(invalid="ignore", over="ignore"):
                x = x.astype(d.pick(BAD_DTYPES))
        self.x = _place(d, self.bufs, x, lead + (k,))
        self.q = rng.integers(0, 16, (n, k), dtype=np.uint8)
        packed = qkern.pack_int4(self.q)
        if d.chance(20):
            packed = qkern.pack_int4(rng.integers(0, 16, (n + 64, k), dtype=np.uint8))
        if d.chance(20):
            packed = packed.view(np.int8)
        if d.chance(4):  # laid out as drawn: mostly not C-contiguous, refused
            self.w_packed = _place(d, self.bufs, packed, packed.shape)
        else:
            self.w_packed = self.bufs.array(packed.shape, packed.dtype, packed.strides, 0)
            self.w_packed[...] = packed
        groups = k // unit
        scales = rng.uniform(0.5, 1.0, (groups, n)) * 2.0 ** (d.int(-100, -60) if huge
                                                              else d.int(-8, 0))
        sz = np.stack([scales, rng.standard_normal((groups, n)) * scales], axis=-1)
        if d.chance(20):
            sz = sz[:, :max(n - 1, 0)] if d.chance(2) else sz[1:]
        # one column fewer is still a valid call when the panels hold it
        self.n = sz.shape[1]
        self.q = self.q[:self.n]
        sz = sz.astype(d.pick(DTYPES) if d.chance(20) else dtype)
        self.sz = _place(d, self.bufs, sz, sz.shape)
        self.bias = self._vector(dtype, d.int(-4, 8)) if d.chance(2) else None
        if self.bias is not None and (self.bias.dtype.kind == "f" or self.bias.dtype == BF16):
            finite = self.bias.astype(np.float32)  # finite, as x, for the bound
            finite[~np.isfinite(finite)] = 0
            self.bias[...] = np.clip(finite, -256, 256).astype(self.bias.dtype)

    def refusals(self, out, threads) -> list:
        """The documented rules of weight_int4pack_mm that the call breaks."""
        w, sz, x = self.w_packed, self.sz, self.x
        if self.group_size not in GROUP_SIZES:
            return ["group_size not 32, 64, 128 or 256"]
        if not (w.dtype == np.uint8 and w.ndim == 3 and w.shape[2] == 16
                and w.flags.c_contiguous):
            return ["w_packed not qkern.pack_int4's layout"]
        k = w.shape[1]
        if k % self.group_size:
            return ["K not a multiple of group_size"]
        dtype = x.dtype if isinstance(x, np.ndarray) else None
        if dtype not in DTYPES:
            return ["x not float32, float16 or bfloat16"]
        if (sz.dtype != dtype or sz.ndim != 3 or sz.shape[0] != k // self.group_size
                or sz.shape[2] != 2):
            return ["scales_and_zeros not (K / group_size, N, 2) of x's dtype"]
        n = sz.shape[1]
        if -(-n // 32) != w.shape[0]:
            return ["w_packed's panels do not hold N"]
        if self.bias is not None and not _is_vector(self.bias, n, dtype):
            return ["bias not an (N,) array of x's dtype"]
        return call_refusals(x, dtype, k, n, out, (("x", x), ("w_packed", w),
                                                   ("scales_and_zeros", sz),
                                                   ("bias", self.bias)), threads)

    def assert_close(self, y: np.ndarray, x: np.ndarray):
        assert_int4_close(y, x, self.q, self.sz, self.group_size, self.bias,
                          **int4_bound_traits(x, len(self.q)))


def fuzz_weight_int4pack_mm(data: bytes):
    """`qkern.weight_int4pack_mm`, every argument drawn; a valid call is
    within the int4 bound, and an Int4Linear of the same arguments gives its
    bits."""
    c = Int4Call(Draw(data))
    out, threads = c.draw_out(), c.draw_threads()
    y = c.expect(lambda: qkern.weight_int4pack_mm(c.x, c.w_packed, c.group_size, c.sz,
                                                  bias=c.bias, out=out, num_threads=threads),
                 c.refusals(out, threads), out)
    if y is None:
        return
    c.check_result(y, out)
    if c.draw.chance(3):
        layer = qkern.Int4Linear(c.w_packed, c.group_size, c.sz, c.bias)
        if not _same_bits(layer(c.x), y):
            raise Finding("Int4Linear and weight_int4pack_mm gave different bits")


TARGETS = {
    "weight_int8pack_mm": fuzz_weight_int8pack_mm,
    "weight_int4pack_mm": fuzz_weight_int4pack_mm,
    "WoqLinear": fuzz_woq_linear,
    "cli_args": fuzz_cli_args,
    "qconv2d": fuzz_qconv2d,
}
