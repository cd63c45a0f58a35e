"""CPU features, the ISA cap, the kernel registry as seen from Python, and
the choice of a kernel for a problem.

Detection runs once, when this module is imported.  ``QKERN_ISA`` caps the
ISA level (``ref < avx2 < avx512 < avx512_bf16 < amx``); asking for a level
this CPU cannot run raises at import.  ``QKERN_VERBOSE=1`` logs every kernel
choice to stderr.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from types import MappingProxyType

from qkern import _cpu, _woq
from qkern._dtypes import DTYPE_CODES, dtype_name

ISA_LEVELS = ("ref", "avx2", "avx512", "avx512_bf16", "amx")


def _read_only(settings: dict) -> MappingProxyType:
    """``settings`` (and the dicts in it) as read-only mappings: the static
    rule's settings below are replaced, never changed in place, so that
    :func:`choose_kernel` can tell when to forget its choices."""
    return MappingProxyType({key: _read_only(value) if isinstance(value, dict) else value
                             for key, value in settings.items()})


# Per ISA level, the M from which the static rule takes its kernel on int4
# weights the driver dequantizes to float32 (compute f32dq_qb4w), where
# many rows share each dequantized chunk and no group sums are left; a
# level not listed keeps its kernel on packed int4.  Each was measured
# against the level's kernel on packed int4 (f32_qb4w; groups of 128,
# float32, Int4Linear layers forced to each kernel, calls alternating),
# its time over f32_qb4w's.  AVX2, on a Zen 3 (4096² and 11008 x 4096,
# min of 3 to 15): 1.12-1.37 at M <= 16, 0.98-1.05 at 24 and 32,
# 0.89-0.95 at 48 and 64, 0.85-0.92 at 128 and 256, on one and two
# threads.  AVX-512, on a Zen 4 since f32_qb4w broadcasts x with
# vpbroadcastd (medians of 10, weights in L3): 4096², one thread, 1.28 at
# M = 16, 1.07 at 48, 1.04 at 64, 0.99 at 128, 0.98 at 256 (two threads
# 1.32, 1.08, 1.08, 0.98, 0.99); 11008 x 4096, one thread, 1.07 at 48,
# 1.05 at 64, 1.04 at 128, 0.98 at 256.
DEQUANTIZED_FROM_M = _read_only({"avx2": 48, "avx512": 128})

# How many calls of the highest level's kernel on the unpacked weight
# (layout (1, 0)) the functional op makes before it packs the weight
# instead.  Packing costs a full read and write of the weight.  On an AVX2
# Zen 3 (4096 x 4096, float32, median, side by side) the AVX2 GEMV, then
# four rows a call, ran within 1.1-1.2x of WoqLinear's packed kernels up to
# M = 32 (14.5 ms at M = 32 on one thread), where packing per call costs
# 7.5 ms more and the call 21.9 ms; f32_gemv_8x1c0__avx2 takes eight rows a
# call, so four of its calls keep M = 32.  On the AMX Xeon (same problem,
# one thread, weights cold, median) f32_gemv_8x1c0__avx512 took 2.9 ms at
# M = 8 and 5.8 ms at M = 16 against 8.4 and 9.0 ms for packing and the AMX
# kernel, and lost at M = 32 (11.4 against 10.1 ms, bfloat16; float32 13.5
# against 12.9). On AMX, bf16_gemv_32x1c0__amx takes up to 32 rows a call at
# about the cost of one (it widens every weight to bfloat16 once a call): on
# the AMX Xeon (same problem) 1.9-2.3 ms at M = 8-32, 7.7 ms at M = 128
# against 13.8 ms for packing and the AMX kernel (bfloat16; float32 18.8
# against 21.0).
UNPACKED_CALLS = _read_only({"avx2": 4, "avx512": 3, "avx512_bf16": 3, "amx": 4})

# On a CPU with AMX, the M from which the functional op takes the AMX
# kernels on the unpacked weight, per dtype of x; fewer rows run the AVX-512
# GEMV, whose cost grows with the rows while the AMX kernels' hardly does
# (up to 8 rows bf16_gemv_8x1c0__amx stacks the float16 and float32 planes
# in one set of B tiles).  On the AMX Xeon (4096 x 4096, weights cold, min
# of 16 calls, one / two threads; 2026-12-06, the stacking then chosen per
# group of 32 rows in the 32-row kernel, which ran a call of 8 rows or
# fewer as the 8-row kernel does) the AMX kernel took 1.55-1.57 / 0.82-0.85
# ms in bfloat16 at M = 4-5 against the GEMV's 1.56 / 0.77 at 4 and 1.87 /
# 0.94 at 5; float16 1.49 / 0.78 and 1.52 / 0.81 against 1.44 / 0.74 and
# 1.82 / 0.93; float32 1.44 / 0.77 and 1.43 / 0.76 against 1.34 / 0.68 and
# 1.52 / 0.78.
AMX_UNPACKED_FROM_M = _read_only({"bfloat16": 5, "float16": 5, "float32": 5})

# Blocking.split, in the order of qk_woq_split (include/qkern/woq.h).
SPLITS = ("m", "n")

# Kernel.weight_format values (qk_woq_format, include/qkern/woq.h).
INT8 = "int8_per_channel"
INT4 = "int4_groupwise"

# The ISA levels whose kernels on driver-widened panels the static rule
# takes, per weight format: when M needs more than this many of their row
# blocks (the widening of a chunk is then shared by that many blocks).
# AMX: int8 one; int4 two: on the AMX Xeon (4096 x 4096, one thread, side
# by side) tile_qb4w ran M = 33 and 64 in 2.34 and 3.17 ms (bfloat16;
# float32 3.71 and 5.09) against tilew_qb4w's 2.85 and 3.50 (4.02 and
# 5.99), and lost from M = 128 (6.36 against 5.86; float32 even, 25.3
# against 20.9 at 512).  AVX-512-BF16 (taken on AMD's CPUs only), int8 six
# 8-row blocks: on a Zen 4 (weights cold, min of 12, side by side)
# bf16w_gemm_8x32c2 took 1.02-1.08 of bf16_gemm_8x32c2's time at M = 32,
# 0.95-1.11 at 33-48, and 0.81-0.99 from 64 (4096 x 4096 M = 1024, two
# threads, 90.0 against 110.3 ms; 11008 x 4096 M = 256 0.95-0.97).  Not
# AVX2: on a Zen 3, f32w on a copy widened beforehand ran at the speed of
# the 6x16 on packed int8 (docs/tuning.rst: median 1.01 of its time from
# M = 64), so the conversion it saves costs nothing there and widening
# chunk by chunk only adds work; the tuner may still pick it.  Not AVX-512
# either: on a Zen 4 (4096 x 4096, float32, weights cold, min of 8, one
# thread) f32w on the copy took 1.02-1.06 of the 6x32's time on packed
# int8 from M = 48 (39.5 against 38.5 ms at 128, 155.0 against 151.5 at
# 512; 11008 x 4096, M = 128: 111.3 against 105.7) and 1.1-2.9x below.
WIDENED_ABOVE_ROW_BLOCKS = _read_only({"amx": {INT8: 1, INT4: 2}, "avx512_bf16": {INT8: 6}})

# On a CPU with AMX, the M from which the static rule takes the AMX
# kernels, per weight format and dtype of x; fewer rows run the AVX-512 FMA
# kernels.  An AMX call costs about the same for 1 to 32 rows (it packs x,
# splits a float16 row into two bfloat16 planes and a float32 row into
# three, widens every weight to bfloat16, and for int4 sums x's groups),
# while a pass of R rows of the AVX-512 kernels costs about R + 2 rows'
# worth.  Measured on a Xeon with AMX (family 6, 2 vCPUs), 4096 x 4096,
# weights cold, forced kernels side by side, min of 7, one thread (two
# gave the same crossovers): int8 bfloat16 AVX-512 1.04-1.11 ms at M = 1-2
# against AMX 1.27-1.29, at 4 even (1.26 against 1.28) or AVX-512 (1.24
# against 1.85 in a second run; the tuner, on a slice of the weight in
# cache, took AMX there by 1.12-1.14), AMX 1.28 against 1.45 at M = 6;
# float16 1.04-1.29 against 1.42-1.53 at M = 1-4, even at 6, AMX at 8
# (1.52 against 2.28); float32 1.03-1.49 against 1.65-1.70 at M = 1-6, AMX
# at 8 (1.66 against 2.18).  int4, since f32_qb4w sums the high nibbles
# from byte sums (min of 9-12, one / two threads): bfloat16 AVX-512 0.81 /
# 0.42 ms against AMX 0.83 / 0.45 at M = 2, AMX 0.82 / 0.45 against 1.00 /
# 0.53 at 3; float16 AVX-512 1.19 / 0.82 against 1.42 / 0.94 at 3, AMX
# 1.43 / 0.94 against 1.47 / 1.03 at 4; float32 AVX-512 1.22 / 0.83
# against 1.31 / 0.88 at 4, AMX 1.34 / 0.89 against 1.43 / 0.97 at 5.
AMX_FROM_M = _read_only({INT8: {"bfloat16": 5, "float16": 7, "float32": 7},
                         INT4: {"bfloat16": 3, "float16": 4, "float32": 5}})

# On a CPU with AMX, the N (columns of the weight) from which the static
# rule takes the AMX kernels, per weight format and dtype of x; narrower
# weights run the AVX-512 FMA kernels at every M.  The AMX kernels pack x
# into bfloat16 planes (two for float16, three for float32) that the
# panels then read back, a cost per row that only enough panels repay, and
# they share the panels, not the rows, among the threads (a single panel
# runs on one).  Measured on the AMX Xeon (K = 4096, two threads, forced
# kernels side by side, min of 7): int8 float32 at N = 32 AVX-512 1.05 ms
# against AMX 5.10 at M = 1024 (0.51 against 1.15 at 256), at N = 128 0.24,
# 0.95, 3.78 against 0.34, 1.04, 4.48 at M = 64, 256, 1024, at N = 256
# even at 64 (0.47 against 0.50) and AMX from 256 (1.30 against 1.94);
# float16 at N = 64 AMX to M = 256 but 3.77 against 3.20 at 1024, at N =
# 128 AMX at every M (3.81 against 4.47 at 1024); bfloat16 AMX at every N
# down to 16 but for a tie at M = 1024 with N <= 32 (1.58-1.60 against
# 1.51).  int4 (groups of 128): float32 at N = 128 AMX to M = 256 but 5.99
# against 5.02 at 1024, AMX at N = 256 (7.25 against 8.80); float16 at
# N = 64 4.88 against 3.09 at M = 1024, AMX at N = 128; bfloat16 at N = 32
# 3.76 against 2.13 at M = 1024, AMX at N = 64 (2.40 against 3.09).  An
# N of 1 with float32 x (K = 116871, M = 18385) took 9.0 s on AMX against
# 0.47 s on AVX-512, its packed x 1.4 GiB.
AMX_FROM_N = _read_only({INT8: {"bfloat16": 1, "float16": 128, "float32": 256},
                         INT4: {"bfloat16": 64, "float16": 128, "float32": 256}})

# The M from which the static rule takes the AVX-512-BF16 (vdpbf16ps)
# kernels for bfloat16 x, per CPU vendor and weight format; fewer rows, and
# every M on a vendor not listed, run the AVX-512 FMA kernels (the tuner
# times both, qkern.tuning.TUNED_WITH).  Not Intel's: there the vdpbf16ps
# kernels ran slower than the FMA kernels at every M measured on the AMX
# Xeon (as above, one thread: int8 1.12x at M = 1, 1.3-1.8x at M = 2-16;
# int4 1.18x at M = 1, 1.3-1.75x at M = 2-16), where vdpbf16ps runs at half
# the FMA's rate.  AMD's: on a Zen 4 (family 25 model 17, 2 vCPUs, weights
# cold, forced kernels side by side, min of 6 to 12, medians of 16 for
# M = 2-3) vdpbf16ps, at the FMA's instruction rate with twice its
# multiply-adds, ran int8 4096 x 4096 M = 3 in 1.11 against 1.23 ms (one
# thread; a later run than the others here), M = 4 in 1.05 against 1.26
# and from M = 8 in 0.53-0.56 of the time (1.36 against 2.42 ms at 8,
# 83.0 against 154.0 at 512); at M = 1 and 2, where the FMA kernels stream
# the weight with an L2 prefetch, it lost (M = 2: 1.08-1.30x, 4096 x 4096
# and 11008 x 4096, one and two threads; M = 1 on 11008 x 4096 1.10-1.16x);
# int4 (groups of 128) M = 1 in 0.62 against 0.70 ms and from M = 4 in
# 0.47-0.51 of the time.  Since the int8 kernel widens with vpermt2w at up
# to six rows (src/woq/bf16-gemm-x32c2-avx512bf16.c) it wins M = 2 as well
# on one thread (4096 x 4096 0.73-0.76 against 0.78-0.81 ms, 11008 x 4096
# 1.90-1.95 against 2.01-2.06; min of 24, four runs) and ties on two.
AVX512_BF16_FROM_M = _read_only({"AuthenticAMD": {INT8: 2, INT4: 1}})

# The same rule for the functional op's kernel on the unpacked int8 weight:
# bf16_gemv_8x1c0__avx512bf16 from this many rows (at M = 1 the FMA GEMV
# reads the weight as fast).  On the Zen 4 above, M = 2, one and two
# threads, it took 0.90-0.96 of f32_gemv_8x1c0__avx512's time.
AVX512_BF16_UNPACKED_FROM_M = _read_only({"AuthenticAMD": 2})

# Features each ISA level needs (cumulative: a level needs all below it).
_ISA_REQUIRES = {
    "ref": (),
    "avx2": ("avx2", "fma", "f16c"),
    "avx512": ("avx512f", "avx512bw", "avx512vl"),
    "avx512_bf16": ("avx512_bf16", "avx512_vbmi"),
    "amx": ("amx_tile", "amx_bf16"),
}

_FEATURES = _cpu.detect()

# The CPU's vendor as cpuid spells it ("GenuineIntel", "AuthenticAMD"), and
# AVX512_BF16_FROM_M and AVX512_BF16_UNPACKED_FROM_M on it (empty / None:
# the static rule never takes that level).
CPU_VENDOR = _cpu.vendor()
AVX512_BF16_FROM_M_HERE = AVX512_BF16_FROM_M.get(CPU_VENDOR, _read_only({}))
AVX512_BF16_UNPACKED_FROM_M_HERE = AVX512_BF16_UNPACKED_FROM_M.get(CPU_VENDOR)


def cpu_features() -> dict:
    """Instruction-set features of this CPU that the OS lets qkern use.

    Detected once at import from cpuid and XCR0. AMX features are reported
    only after the Linux kernel granted this process the AMX tile state.

    Returns
    -------
    dict
        ``{name: bool}`` for ``avx2``, ``fma``, ``f16c``, ``avx512f``,
        ``avx512bw``, ``avx512vl``, ``avx512_bf16``, ``avx512_vbmi``, ``avx512_fp16``,
        ``avx512_vnni``, ``amx_tile``, ``amx_bf16``, ``amx_int8``.

    Examples
    --------
    >>> import qkern
    >>> sorted(qkern.cpu_features())[:3]
    ['amx_bf16', 'amx_int8', 'amx_tile']
    """
    return dict(_FEATURES)


def _cpu_level() -> int:
    level = 0
    for i, name in enumerate(ISA_LEVELS):
        if all(_FEATURES[f] for f in _ISA_REQUIRES[name]):
            level = i
        else:
            break
    return level


def _isa_cap() -> int:
    cpu = _cpu_level()
    asked = os.environ.get("QKERN_ISA", "").strip().lower()
    if not asked:
        return cpu
    if asked not in ISA_LEVELS:
        raise ValueError(f"QKERN_ISA={asked!r} is not one of {', '.join(ISA_LEVELS)}")
    level = ISA_LEVELS.index(asked)
    if level > cpu:
        raise RuntimeError(
            f"QKERN_ISA={asked!r} asks for an ISA this CPU (or OS) cannot run; "
            f"the highest here is {ISA_LEVELS[cpu]!r}"
        )
    return level


CPU_ISA = ISA_LEVELS[_cpu_level()]
ISA_CAP = ISA_LEVELS[_isa_cap()]
_VERBOSE = os.environ.get("QKERN_VERBOSE", "").strip() not in ("", "0")


@dataclass(frozen=True)
class Blocking:
    """How the driver cuts one call into tasks (``qk_woq_blocking``,
    include/qkern/woq.h). Every valid blocking gives the same bits: each
    output is one sum over K in a fixed order whatever the cut.

    Attributes
    ----------
    rows : int
        Rows of ``x`` per task; for a ``kblock`` kernel, rows packed at once
        (a multiple of 32).
    chunk_bytes : int
        Packed-weight bytes per chunk of columns: as many whole panels as
        fit, at least one; for a ``kblock`` kernel, the bytes of one K block
        of the chunk (``k_block * nr`` per panel, int4 ``k_block * 16``),
        and at most a thread's share of the panels.
    k_block : int
        ``kblock`` kernels: k per block of K (a multiple of 32); 0 for the
        others, which take all of K in one call.
    min_macs_per_thread : int
        A call starts at most ``1 + M*N*K // min_macs_per_thread`` threads.
    split : str
        How the threads share the tasks, each taking a run of consecutive
        ones: ``"m"`` orders them row block by row block (the threads divide
        the rows first, each reading all of the weight for its rows),
        ``"n"`` chunk by chunk (they divide the columns first, each reading
        only its share of the weight). ``kblock`` kernels split ``"n"``.
    """

    rows: int
    chunk_bytes: int
    k_block: int
    min_macs_per_thread: int
    split: str = "m"

    @classmethod
    def from_driver(cls, values: tuple) -> Blocking:
        """The blocking of a ``qk_woq_blocking`` read as a tuple."""
        *sizes, split = values
        return cls(*sizes, SPLITS[split])

    def to_driver(self) -> tuple:
        """This blocking as the tuple ``qkern._woq.gemm`` takes."""
        return (self.rows, self.chunk_bytes, self.k_block, self.min_macs_per_thread,
                SPLITS.index(self.split))

    def check(self, kind: str, packs_x: bool = False) -> Blocking:
        """This blocking, if the driver accepts it for a kernel of ``kind``
        (whose rows of x the driver packs, with ``packs_x``).

        Raises
        ------
        ValueError
            Naming the rule it breaks.
        """
        if self.split not in SPLITS:
            raise ValueError(f"blocking: split must be one of {SPLITS}, got {self.split!r}")
        if kind == "kblock" and self.split != "n":
            raise ValueError(f"blocking: a kblock kernel splits 'n', got {self}")
        for name, value in vars(self).items():
            if name == "split":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
                raise ValueError(f"blocking: {name} must be an int in [0, 2**32), got {value!r}")
        if not (self.rows and self.chunk_bytes and self.min_macs_per_thread):
            raise ValueError(f"blocking: rows, chunk_bytes and min_macs_per_thread must be "
                             f"positive, got {self}")
        if kind == "kblock":
            if self.rows % 32 or self.k_block < 32 or self.k_block % 32:
                raise ValueError(f"blocking: a kblock kernel needs rows and k_block (>= 32) "
                                 f"that are multiples of 32, got {self}")
        elif self.k_block:
            raise ValueError(f"blocking: k_block must be 0 for a {kind} kernel, got {self}")
        if packs_x and self.rows % 32:
            raise ValueError(f"blocking: a kernel on packed x needs rows that are a multiple "
                             f"of 32, got {self}")
        return self


@dataclass(frozen=True)
class Kernel:
    """One entry of the C kernel registry, with the traits it states.

    Code reads these fields; it never parses a kernel's name.

    Attributes
    ----------
    name : str
        ``<compute>_<gemm|gemv>_<MR>x<NR>c<KR>__<isa>``: the C function's
        name without ``qk_woq_`` and ``ukernel_`` (or ``kblock_``).
    kind : str
        How the driver runs it: ``"panels"`` (over packed, or widened, weight
        panels), ``"unpacked"`` (over the row-major weight itself, layout
        ``(1, 0)``) or ``"kblock"`` (one block of K per call, over packed
        ``x``; the AMX GEMM kernels).
    isa : str
        The lowest ISA level with every feature it uses (one of
        ``qkern.ISA_LEVELS``).
    features : tuple of str
        The CPU features that level needs (names of :func:`qkern.cpu_features`).
    mr, nr, kr : int
        Rows per call, columns per packed panel, k values per packed group.
    dtypes : tuple of str
        Activation dtypes the kernel accepts.
    weight_format : str
        How the weight is stored and scaled: ``"int8_per_channel"`` (int8,
        a scale per output column) or ``"int4_groupwise"`` (4-bit, a scale
        and a zero per group of k and column; :mod:`qkern.woq_int4`).
    group_size : int
        0 for one scale per output column; for ``int4_groupwise``, the
        group sizes it takes are the multiples of this.
    flushes_subnormals : bool
        Whether its products are summed by ``vdpbf16ps`` or ``tdpbf16ps``,
        which flush subnormal inputs and sums whatever MXCSR says (the error
        bound has an absolute term for it, docs/semantics.rst).
    splits_x : bool
        Whether float16/float32 activations reach it split into bfloat16
        planes whose sum is exact (2 for float16, 3 for float32; each plane
        one more bf16 product per weight), made by the driver.
    sums_bytes : bool
        int4: whether it sums each high nibble's products as the products
        of the whole packed bytes less those of the low nibbles (compute
        ``f32_qb4w``, :doc:`/int4`): one conversion per byte where the
        high nibble would take a shift and a conversion, a slightly larger
        error bound.
    widened : bool
        Whether it reads weight panels widened to bf16 or float32 instead
        of the packed int8 bytes: widened once per chunk of columns (by
        the driver, or by an AMX kernel on its first row step) and reused by
        every row step after, or once for all calls into a
        copy a :class:`~qkern.WoqLinear` keeps within its ``memory_budget``
        (:doc:`/tuning`). Worth it when many rows share each chunk.
    widened_bytes : int
        Bytes per widened weight value (2: bf16, 4: float32); 0 when
        neither ``widened`` nor ``dequantizes``.
    dequantizes : bool
        Whether it reads int4 weights the driver dequantized to float32,
        once per chunk of columns and row block (compute ``f32dq_qb4w``,
        :doc:`/int4`): a sum over all of K without group sums, worth it
        when many rows share each chunk.
    converts_x : bool
        Whether it reads the rows of x in float32 whatever their dtype: the
        driver converts float16/bfloat16 rows once per row block and
        thread (exactly), so each of the kernel's broadcasts is one load.
    packs_x : bool
        Whether the driver packs the rows of x for it, once per row block,
        into bfloat16 planes laid out as AMX tiles (its blocking's ``rows``
        are then a multiple of 32): the K-block kernels' A tiles, and the
        B tiles (x transposed) of the AMX kernels on the unpacked weight.
    bound_by : str
        The instruction whose peak bounds its compute, as named by
        :mod:`qkern.roofline` (``"vfmadd231ps ymm"``, ``"tdpbf16ps"``, ...).
    blocking : Blocking
        How the driver cuts a call by default.
    available : bool
        Whether this CPU, under ``QKERN_ISA``, may run it.
    index : int
        Position in the C registry.
    """

    name: str
    kind: str
    isa: str
    features: tuple
    mr: int
    nr: int
    kr: int
    dtypes: tuple
    weight_format: str
    group_size: int
    flushes_subnormals: bool
    splits_x: bool
    sums_bytes: bool
    widened: bool
    widened_bytes: int
    dequantizes: bool
    converts_x: bool
    packs_x: bool
    bound_by: str
    blocking: Blocking
    available: bool
    index: int

    def planes(self, dtype) -> int:
        """bf16 products per weight for activations of ``dtype`` (1 unless split)."""
        if not self.splits_x:
            return 1
        return {"float32": 3, "float16": 2}.get(dtype_name(dtype), 1)

    @property
    def layout(self) -> tuple:
        """The packed-weight layout ``(nr, kr)`` the kernel reads."""
        return (self.nr, self.kr)

    @property
    def reads_widened_copy(self) -> bool:
        """Whether it can run on a copy of the whole weight widened
        beforehand (:meth:`qkern.packing.PackedWeight.widened`), not only on
        panels the driver widens chunk by chunk."""
        return self.widened and self.kind == "panels"


def _features(level: int) -> tuple:
    return tuple(f for name in ISA_LEVELS[:level + 1] for f in _ISA_REQUIRES[name])


def _load_registry() -> tuple:
    cap = ISA_LEVELS.index(ISA_CAP)
    out = []
    for index, entry in enumerate(_woq.registry()):
        level = entry.pop("isa")
        mask = entry.pop("dtype_mask")
        dtypes = tuple(n for n, code in DTYPE_CODES.items() if mask & (1 << code))
        blocking = Blocking.from_driver(entry.pop("blocking"))
        out.append(Kernel(**entry, isa=ISA_LEVELS[level], features=_features(level),
                          dtypes=dtypes, blocking=blocking, available=level <= cap, index=index))
    return tuple(out)


REGISTRY = _load_registry()


def kernels() -> list:
    """The WoQ GEMM kernel registry.

    Returns
    -------
    list of Kernel
        Every kernel this build contains, in registry order, with
        ``available`` telling whether it may run here.

    Examples
    --------
    >>> import qkern
    >>> ref = qkern.kernels()[0]
    >>> ref.isa, ref.available
    ('ref', True)
    """
    return list(REGISTRY)


def widened_nbytes(kern: Kernel, n: int, k: int) -> int:
    """Bytes of an ``(n, k)`` int8 weight widened beforehand for ``kern``
    (every panel, the last one padded; include/qkern/woq.h); 0 if ``kern``
    runs on no such copy."""
    return _woq.widened_size(kern.index, n, k)


def widened_copy_fits(kern: Kernel, n: int, k: int, memory_budget: int) -> bool:
    """Whether ``kern`` runs on a copy of an ``(n, k)`` weight widened
    beforehand and that copy (of at least one byte) fits ``memory_budget``."""
    size = widened_nbytes(kern, n, k) if kern.reads_widened_copy else 0
    return 0 < size <= memory_budget and size < 2**64 - 1


def get_kernel(name: str) -> Kernel:
    """The registry entry called ``name``; ValueError if unknown or not runnable here."""
    for k in REGISTRY:
        if k.name == name:
            if not k.available:
                raise ValueError(
                    f"kernel {name!r} needs ISA {k.isa!r}, above this process's cap {ISA_CAP!r}"
                )
            return k
    raise ValueError(f"no kernel named {name!r}; see qkern.kernels()")


def runnable_here(name) -> str | None:
    """``name`` if it names a kernel this process may run, else None (what a
    pickled layer's forced kernel becomes on a machine without it)."""
    return name if any(k.name == name and k.available for k in REGISTRY) else None


def top_level(dtype, layout: tuple | None = None, weight_format: str = INT8) -> str:
    """The highest ISA level with an available kernel on packed panels for
    ``dtype`` (reading ``layout`` when given) and ``weight_format``: the
    level the tuner's candidates start from, whatever the static rule
    takes for a given M."""
    cands = _packed_candidates(dtype_name(dtype), layout, weight_format)
    return ISA_LEVELS[max(ISA_LEVELS.index(k.isa) for k in cands)]


def _packed_candidates(name: str, layout: tuple | None, weight_format: str,
                       registry: tuple | None = None) -> list:
    """The available kernels of ``registry`` (default ``REGISTRY``) for dtype
    ``name`` and ``weight_format`` that read ``layout`` (when given; else a
    packed layout)."""
    cands = [k for k in (REGISTRY if registry is None else registry)
             if k.available and name in k.dtypes and k.weight_format == weight_format
             and (k.layout == tuple(layout) if layout is not None else k.kind != "unpacked")]
    if not cands:
        raise ValueError(f"no available kernel for dtype {name} and layout {layout}")
    return cands


def choose_layout(dtype) -> tuple:
    """The packed int8 layout ``(nr, kr)`` of the best kernels for ``dtype`` here."""
    return choose_kernel(dtype, 1).layout


def choose_kernel(dtype, m: int, layout: tuple | None = None,
                  unpacked_ok: bool = False, weight_format: str = INT8,
                  n: int | None = None) -> Kernel:
    """Pick the kernel for an (m x K) @ (K x N) problem in ``dtype`` on
    weights of ``weight_format`` (``n``: N, when the caller knows it;
    ``None`` chooses as for a wide weight).

    With ``unpacked_ok`` (the caller holds only the row-major weight), the
    highest level's SIMD kernel on the unpacked weight (layout ``(1, 0)``;
    on a CPU with AMX, the AVX-512 level's below ``AMX_UNPACKED_FROM_M``
    rows; of a level's, the one that takes ``m`` in the fewest calls, the
    narrower on a tie: on AMX the 8-row kernel up to 8 rows, the 32-row
    one above) wins when ``m`` fits in ``UNPACKED_CALLS`` of its calls
    (four on AMX, three on AVX-512, four on AVX2): packing costs a full
    read and write of the weight, more than those passes of that kernel
    over it.
    Otherwise the
    highest available ISA that accepts ``dtype`` (and, when given, reads
    ``layout``; else a packed layout) wins, but for
    AVX-512-BF16 below ``AVX512_BF16_FROM_M_HERE`` rows (at every M but
    on an AMD CPU: ``AVX512_BF16_FROM_M``; on the unpacked weight
    ``AVX512_BF16_UNPACKED_FROM_M``), and on a CPU with AMX
    the AVX-512 level below ``AMX_FROM_M`` rows or ``AMX_FROM_N`` columns.
    Within it, on the levels of
    ``WIDENED_ABOVE_ROW_BLOCKS``, a kernel on driver-widened panels when
    ``m`` needs more than that many of its row blocks (the widening is then
    shared, and a partial last block costs only its rows), and on the
    levels of ``DEQUANTIZED_FROM_M`` a kernel on dequantized int4 weights
    from the level's number of rows there; otherwise the kernel on
    packed panels that makes the fewest passes over the weight,
    ``ceil(m / MR)``, the narrower on a tie.  Every such kernel is
    specialised for each row count, so a pass of R rows costs about R + 2
    rows' worth of FMAs (widening the weights in-register costs about two),
    and the fewest passes is the least work: measured on an AVX2 Zen 3, 1
    thread, 4096 x 4096, side by side, 1 to 6 rows in 1.00, 1.30, 1.71,
    1.82, 1.99, 2.48 ms, R + 2 to within 15 %.

    The choice is remembered for each set of arguments while the settings
    it reads (``REGISTRY``, ``AVX512_BF16_FROM_M_HERE``,
    ``AVX512_BF16_UNPACKED_FROM_M_HERE``, ``UNPACKED_CALLS``,
    ``AMX_UNPACKED_FROM_M``, ``AMX_FROM_M``, ``AMX_FROM_N``,
    ``WIDENED_ABOVE_ROW_BLOCKS``, ``DEQUANTIZED_FROM_M``) stay equal to
    what they were; replacing one takes effect at the next call.  They are immutable (the mappings
    read-only); while one is not (a test's plain dict or list), nothing is
    remembered.  (A read-only mapping over a dict that its maker still
    edits is not noticed: replace a setting, never edit one.)
    """
    name = dtype_name(dtype)
    layout = None if layout is None else tuple(layout)
    global _choices
    settings, chosen = _choices
    now = _rule_settings()
    if settings != now:
        _choices = settings, chosen = now, ({} if _immutable(now) else None)
    kern = None
    if chosen is not None:
        try:
            kern = chosen.get((name, m, layout, unpacked_ok, weight_format, n))
        except TypeError:  # an unhashable m: computed, not remembered
            chosen = None
    if kern is None:
        kern = _static_rule(settings, name, m, layout, unpacked_ok, weight_format, n)
        if chosen is not None:
            if len(chosen) >= _CHOICES_KEPT:
                chosen.clear()
            chosen[name, m, layout, unpacked_ok, weight_format, n] = kern
    return _log(kern, name, m)


# The static rule's choices, {arguments: kernel} (None: not remembered),
# and the settings they were made under (_rule_settings()); at most
# _CHOICES_KEPT of them.
_CHOICES_KEPT = 4096
_choices: tuple = ((), None)


def _rule_settings() -> tuple:
    """The module settings the static rule reads, as they are now."""
    return (REGISTRY, AVX512_BF16_FROM_M_HERE, AVX512_BF16_UNPACKED_FROM_M_HERE,
            UNPACKED_CALLS, AMX_UNPACKED_FROM_M, AMX_FROM_M, AMX_FROM_N, WIDENED_ABOVE_ROW_BLOCKS,
            DEQUANTIZED_FROM_M)


def _immutable(value) -> bool:
    """Whether ``value`` cannot change in place: an int, str, None or
    registry entry, or a tuple or read-only mapping of such values."""
    if isinstance(value, tuple):
        return all(_immutable(v) for v in value)
    if isinstance(value, MappingProxyType):
        return all(_immutable(v) for v in value.values())
    return value is None or isinstance(value, (int, str, Kernel))


def _static_rule(settings: tuple, name: str, m: int, layout: tuple | None, unpacked_ok: bool,
                 weight_format: str, n: int | None) -> Kernel:
    """:func:`choose_kernel`'s choice for dtype ``name`` under ``settings``
    (:func:`_rule_settings`), computed."""
    (registry, bf16_from_m, bf16_unpacked_from_m, unpacked_calls, amx_unpacked_from_m,
     amx_from_m, amx_from_n, widened_above_row_blocks, dequantized_from_m) = settings
    bf16_from = bf16_from_m.get(weight_format)
    bf16_ok = bf16_from is not None and m >= bf16_from
    unpacked = [k for k in registry
                if k.available and name in k.dtypes and k.weight_format == weight_format
                and k.kind == "unpacked" and k.isa != "ref"
                and (k.isa != "avx512_bf16"
                     or (bf16_unpacked_from_m is not None and m >= bf16_unpacked_from_m))]
    if unpacked_ok and layout is None and unpacked:
        levels = sorted({k.isa for k in unpacked}, key=ISA_LEVELS.index, reverse=True)
        level = levels[1] if (levels[0] == "amx" and len(levels) > 1
                              and m < amx_unpacked_from_m[name]) else levels[0]
        kern = _fewest_calls([k for k in unpacked if k.isa == level], m)
        if m <= unpacked_calls[level] * kern.mr:
            return kern
    cands = _packed_candidates(name, layout, weight_format, registry)
    levels = sorted({ISA_LEVELS.index(k.isa) for k in cands}, reverse=True)
    levels = [v for v in levels if ISA_LEVELS[v] != "avx512_bf16" or bf16_ok] or levels
    top = levels[0]
    if ISA_LEVELS[top] == "amx" and len(levels) > 1 and (
            m < amx_from_m[weight_format][name]
            or (n is not None and n < amx_from_n[weight_format][name])):
        top = levels[1]
    cands = sorted((k for k in cands if ISA_LEVELS.index(k.isa) == top), key=lambda k: k.mr)
    widened_above = widened_above_row_blocks.get(ISA_LEVELS[top], {}).get(weight_format)
    widened = [k for k in cands
               if (k.widened and widened_above is not None and m > widened_above * k.mr)
               or (k.dequantizes and m >= dequantized_from_m.get(k.isa, math.inf))]
    packed = [k for k in cands if not (k.widened or k.dequantizes)] or cands
    if widened:
        return widened[-1]
    return _fewest_calls(packed, m)


def _fewest_calls(kernels: list, m: int) -> Kernel:
    """Of ``kernels``, the one that runs ``m`` rows in the fewest calls of
    MR rows, the narrower on a tie (the first of those in registry order)."""
    return min(kernels, key=lambda k: (-(-m // k.mr), k.mr))


def _log(kern: Kernel, dtype_name_: str, m: int) -> Kernel:
    if _VERBOSE:
        print(f"qkern: using {kern.name} for dtype={dtype_name_} m={m}", file=sys.stderr)
    return kern
