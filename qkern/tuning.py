"""The autotuner: for one problem on this CPU, the fastest (kernel, blocking,
threads) among the candidates that compute it correctly.

A **candidate** is a registry kernel that this process may run and that
reads the layer's packed layout (int8, or the int4 layout of a
:class:`~qkern.Int4Linear`), a :class:`~qkern.dispatch.Blocking`, a
thread count no larger than the call's, and a **weight form**: the packed
weight (widened chunk by chunk during the call by a kernel on widened
panels), or, for such a kernel, a copy of the whole weight widened
beforehand and kept by the layer, when its bytes fit the layer's
``memory_budget`` (:class:`~qkern.WoqLinear`). The search starts from the static
rule's choice (:func:`qkern.dispatch.choose_kernel`, the kernel's default
blocking, all the call's threads) and improves one dimension at a time:
the kernel (of the highest ISA level, :func:`qkern.dispatch.top_level`, on
an AVX-512-BF16 CPU also of the AVX-512 level, and on an AMX CPU of both:
:data:`TUNED_WITH`), then
the thread count, the
split, the chunk size, the rows per task and, for K-block kernels, the K
block, and tries the widened copy for the kernels that read one (which
must then beat the best candidate on the packed weight by 5 %, side by
side: it costs memory). Each candidate:

1. is **verified** once, on the tuning input, before it may win: the input
   holds small integers (x in {-1, 0, 1}, scales 2**-6; int4 zeros are
   whole multiples of the scale), so every product and sum is exact in
   float32 and every correct kernel returns the same bits as the exact
   product rounded once; a candidate that differs is
   dropped with a :class:`RuntimeWarning` (a kernel or blocking bug, never
   a rounding difference);
2. is **timed** on two inputs in turn, a median of up to 3 calls after one
   warm-up, and cut off after its first timed call if that took more than
   1.25 times the best median so far.

Before the search the static choice runs for 20 ms (an idle virtual CPU
takes milliseconds to wake); after it, the winner and the static choice
are timed again side by side, 5 calls each in alternation, and the static
choice stays unless the winner beats it there too. Both times in a
:class:`Choice` come from that side-by-side run.

Large problems are tuned on a slice of the weight's columns (never fewer
than four chunks of 512 KiB per thread, so that the usual chunk sizes still
spread over the threads; at most 16 MiB of weight beyond that)
and at most 64 rows of the M bucket:
the cost per shape stays around half a second on two cores. A candidate's
speed on the slice stands for its speed on the whole.

Results are kept per key: the CPU signature (vendor, family, model, ISA
features, L2 and L3 sizes), the qkern version, dtype, M bucket (M itself up
to 16, then the next power of two), N, K, threads, packed layout, weight
(``int8``; ``int8+widened`` when the budget holds a widened copy;
``int4g<G>`` for int4 in groups of G) and ISA cap; in memory
for the process, and in ``tune.json`` under the user cache
directory (``QKERN_CACHE_DIR``, else ``platformdirs.user_cache_dir("qkern")``
where installed, else ``$XDG_CACHE_HOME/qkern`` or ``~/.cache/qkern``),
each entry with its CPU signature and version, written under a file lock
and atomically (a new file, then a rename), other processes' and other
CPUs' entries kept. A file that is not valid, or holds nothing for this
CPU and version, is ignored with one warning.

``QKERN_AUTOTUNE`` (read at import): ``0`` (the default) leaves every call
to the static rule; ``1`` tunes each new key on its first use by a
:class:`~qkern.WoqLinear` or :class:`~qkern.Int4Linear` (up to about half a second per key on two
cores, once per CPU thanks to the file). :func:`tune` and ``python -m qkern
tune`` tune ahead of time.

No bits change with the choice when the tuner keeps the static rule's
kernel: a blocking or thread count never changes a result
(:ref:`determinism`), and neither does another kernel on packed panels of
the same ISA level, nor a widened copy (its kernel sums in the order of its
packed twin); but for int4 on AVX2 and AVX-512, whose kernel on
dequantized weights (``f32dq_qb4w``) sums in an order of its own.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import math
import operator
import os
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from qkern import _cpu, dispatch
from qkern._dtypes import DTYPES, dtype_name
from qkern._lru import LruCache
from qkern._version import __version__
from qkern.dispatch import Blocking, Kernel

__all__ = ["Choice", "TUNED_WITH", "WEIGHT_FORMS", "autotune_enabled", "cache_path",
           "check_memory_budget", "choice_for", "clear", "compare", "cpu_signature", "m_bucket",
           "tune", "widened_ok"]

FILE_FORMAT = 2
# Tuning problem size: at most this many rows, and columns for about this
# many multiply-adds per call, but never fewer than four chunks of
# SLICE_CHUNK_BYTES per thread (twice the usual default chunk; the 1x16's
# larger chunks see fewer, which keeps its M = 1 keys cheap to tune).
MAX_ROWS = 64
SLICE_CHUNK_BYTES = 512 << 10
TARGET_MACS = 1e8
MAX_WEIGHT_BYTES = 16 << 20
RUNS = 3
CUT_OFF = 1.25
# A copy widened beforehand (four times the packed bytes) must run this
# much faster than the best candidate on the packed weight to be chosen.
COPY_MIN_GAIN = 1.05
WARM_UP_SECONDS = 0.02
FINAL_ROUNDS = 5

# The values each dimension takes in the search (the kernel's default too);
# chunks: half, once and twice the kernel's default chunk bytes.
CHUNK_SCALES = (0.5, 1, 2)
PANEL_ROWS = (64, 128, 256, 512)
KBLOCK_ROWS = (256, 1024, 2048)
K_BLOCKS = (512, 1024, 2048)

_ENV = os.environ.get("QKERN_AUTOTUNE", "").strip() or "0"
if _ENV not in ("0", "1"):
    raise ValueError(f"QKERN_AUTOTUNE={_ENV!r}: expected 0 or 1")

# Test-only: called as hook(candidate, y) after each verification run; a
# test corrupts y to check that a wrong candidate is dropped.
_verify_hook = None


def check_memory_budget(memory_budget) -> int:
    """``memory_budget`` as an int of bytes >= 0; TypeError / ValueError otherwise."""
    if isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, np.integer)):
        raise TypeError(f"memory_budget: expected an int of bytes, "
                        f"got {type(memory_budget).__name__}")
    if memory_budget < 0:
        raise ValueError(f"memory_budget: expected bytes >= 0, got {memory_budget}")
    return int(memory_budget)


def autotune_enabled() -> bool:
    """Whether ``QKERN_AUTOTUNE=1``: layers tune each new key on first use."""
    return _ENV == "1"


@dataclass(frozen=True)
class Choice:
    """What the tuner chose for one key, and how it measured.

    (:attr:`weight_form` is last so that a choice reads as before without it.)

    Attributes
    ----------
    kernel : str
        The registry kernel's name.
    blocking : Blocking
        The blocking to pass with it.
    threads : int
        ``num_threads`` to run it with (at most the call's).
    seconds : float
        Its median time on the tuning problem.
    static_seconds : float
        The static rule's median time on the same problem, the same run.
    static_kernel : str
        The static rule's kernel.
    candidates : int
        Candidates timed (verified ones; those cut off early count).
    tuning_seconds : float
        Wall time the tuning took.
    weight_form : str
        ``"packed"``: the kernel runs on the layer's packed weight;
        ``"widened"``: on a copy of the weight widened beforehand for it
        (:func:`qkern.dispatch.widened_nbytes` bytes, within the layer's
        ``memory_budget``).
    """

    kernel: str
    blocking: Blocking
    threads: int
    seconds: float
    static_seconds: float
    static_kernel: str
    candidates: int
    tuning_seconds: float
    weight_form: str = "packed"

    @property
    def gain(self) -> float:
        """The static rule's time over the tuned choice's."""
        return self.static_seconds / self.seconds

    def to_json(self) -> dict:
        """The choice as a JSON-able dict (``weight_form`` only when not
        ``"packed"``, so that a file stays readable where it is unknown)."""
        out = asdict(self)
        out["blocking"] = asdict(self.blocking)
        if out["weight_form"] == "packed":
            del out["weight_form"]
        return out

    @classmethod
    def from_json(cls, d: dict) -> Choice:
        """The choice :meth:`to_json` wrote; TypeError or ValueError for a
        field of the wrong type or out of range (a hand-edited file)."""
        choice = cls(**{**d, "blocking": Blocking(**d["blocking"])})
        for name in ("kernel", "static_kernel", "weight_form"):
            if not isinstance(getattr(choice, name), str):
                raise TypeError(f"{name}: expected a str")
        for name in ("seconds", "static_seconds", "tuning_seconds"):
            value = getattr(choice, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 <= value < math.inf:
                raise ValueError(f"{name}: expected a finite number of seconds, got {value!r}")
        if type(choice.candidates) is not int or choice.candidates < 0:
            raise ValueError(f"candidates: expected a count, got {choice.candidates!r}")
        return choice


def m_bucket(m: int) -> int:
    """The M a key stands for: M itself up to 16, then the next power of two."""
    return m if m <= 16 else 1 << (m - 1).bit_length()


def _sysfs_cache_sizes() -> dict:
    sizes = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for entry in sorted(base.glob("index*")) if base.is_dir() else []:
        try:
            level = (entry / "level").read_text().strip()
            kind = (entry / "type").read_text().strip()
            size = (entry / "size").read_text().strip()
        except OSError:
            continue
        if kind != "Instruction":
            sizes[f"L{level}"] = size
    return sizes


def cpu_signature() -> dict:
    """What a tuning result is valid for: vendor, family, model, the ISA
    features qkern detects, and the L2/L3 sizes.

    Returns
    -------
    dict
        JSON-able; equal on machines whose results may be shared.
    """
    info = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("vendor_id", "cpu family", "model", "model name") and name not in info:
                    info[name] = value.strip()
                if not line.strip() and info:
                    break
    except OSError:
        pass
    features = sorted(f for f, on in dispatch.cpu_features().items() if on)
    caches = _sysfs_cache_sizes()
    return {"vendor": info.get("vendor_id", ""), "family": info.get("cpu family", ""),
            "model": info.get("model", ""), "model_name": info.get("model name", ""),
            "features": features,
            "l2": caches.get("L2", ""), "l3": caches.get("L3", "")}


def cache_path() -> Path:
    """The JSON file of tuning results (see the module docstring)."""
    base = os.path.expanduser(os.environ.get("QKERN_CACHE_DIR", "").strip())
    if not base:
        try:
            import platformdirs

            base = platformdirs.user_cache_dir("qkern")
        except ImportError:
            base = os.path.join(os.environ.get("XDG_CACHE_HOME")
                                or os.path.expanduser("~/.cache"), "qkern")
    return Path(base) / "tune.json"


class _NewerFile(ValueError):
    """A tuning file a newer qkern wrote: read as none, never replaced."""


class _Store:
    """Tuning results of this process, and the file they persist in.

    The file holds entries of any CPU and qkern version, each with its own
    signature: a process uses those of its own and keeps the others when it
    writes (a home directory shared by several machines shares one file).
    """

    def __init__(self):
        self.memory = LruCache(maxsize=1 << 16)
        self.tuning = threading.Lock()  # one key tuned at a time: see sibling_compute
        self._file_lock = threading.Lock()
        self._loaded_from = None
        self._from_file: dict = {}

    @staticmethod
    def _entries(path: Path) -> tuple:
        """``(entries, malformed)``: the file's entries that have the fields
        of one, as written, and the count of those that do not; ``([],
        0)`` for no file. ValueError (or OSError) if it cannot be read as a
        tuning file, :class:`_NewerFile` if a newer qkern wrote it."""
        try:
            text = path.read_text()
        except FileNotFoundError:
            return [], 0
        try:
            data = json.loads(text)  # UnicodeDecodeError and JSONDecodeError: ValueError
        except RecursionError:
            raise ValueError("nested too deeply") from None
        if isinstance(data, dict) and type(data.get("format")) is int \
                and data["format"] > FILE_FORMAT:
            raise _NewerFile(f"of format {data['format']}, newer than this qkern's "
                             f"{FILE_FORMAT}")
        if not isinstance(data, dict) or data.get("format") != FILE_FORMAT:
            raise ValueError(f"not a qkern tuning file of format {FILE_FORMAT}")
        entries = data.get("entries")
        if not isinstance(entries, list):
            raise ValueError("its entries are not a list")
        fields = {"cpu", "qkern", "key", "choice"}
        whole = [e for e in entries if isinstance(e, dict) and fields <= e.keys()]
        return whole, len(entries) - len(whole)

    def _read(self, path: Path, warn: bool, refuse_newer: bool = False) -> tuple:
        """``(this process's choices {key: Choice}, the entries a save
        keeps: all as written but the malformed ones)``; with ``warn``, one
        warning if the file is unreadable or corrupt, one if it has
        malformed entries, one if it holds nothing for this CPU and qkern
        version. With ``refuse_newer`` (a save, which must not replace such
        a file), :class:`_NewerFile` for a file a newer qkern wrote."""
        try:
            entries, malformed = self._entries(path)
        except (OSError, ValueError) as e:
            if refuse_newer and isinstance(e, _NewerFile):
                raise
            if warn:
                what = "cannot be read" if isinstance(e, OSError) else "is not a valid tuning file"
                warnings.warn(f"qkern.tune: {path} {what} ({e}): ignored",
                              RuntimeWarning, stacklevel=5)
            return {}, []
        mine, kept, signature = {}, [], cpu_signature()
        for entry in entries:
            if entry["cpu"] == signature and entry["qkern"] == __version__:
                try:
                    key = _checked_key(entry["key"])
                    choice = Choice.from_json(entry["choice"])
                except (ValueError, TypeError, KeyError, AttributeError):
                    malformed += 1
                    continue
                if _usable(choice, key):
                    mine[key] = choice
            kept.append(entry)
        if warn and malformed:
            warnings.warn(f"qkern.tune: {path} has {malformed} malformed "
                          f"entr{'y' if malformed == 1 else 'ies'}: ignored",
                          RuntimeWarning, stacklevel=5)
        if warn and entries and not any(e["cpu"] == signature and e["qkern"] == __version__
                                        for e in entries):
            other = entries[0]
            name = other["cpu"].get("model_name", "?") if isinstance(other["cpu"], dict) else "?"
            warnings.warn(f"qkern.tune: {path} holds results of another CPU or qkern version "
                          f"only ({name}, qkern {other['qkern']}): not used here",
                          RuntimeWarning, stacklevel=5)
        return mine, kept

    def lookup_file(self, key: tuple):
        """The file's choice for ``key``, or None (the file read once per path)."""
        path = cache_path()
        with self._file_lock:
            if self._loaded_from != path:
                self._from_file = self._read(path, warn=True)[0]
                self._loaded_from = path
            return self._from_file.get(key)

    def sibling_compute(self, key: tuple):
        """The compute (:func:`_compute`) of the choice of another thread
        count for ``key``'s problem, in the file or made by this process, or
        None; read after :meth:`lookup_file` and under :attr:`tuning`, so
        that the first thread count tuned fixes the compute of the others."""
        problem = key[:4] + key[5:]
        with self._file_lock:
            for other, choice in self._from_file.items():
                if other[:4] + other[5:] == problem:
                    return _compute(dispatch.get_kernel(choice.kernel))
        return None

    def save(self, key: tuple, choice: Choice) -> None:
        """Add ``key`` to the file under an exclusive lock on ``tune.json.lock``
        (other processes too): read, merge, write a new file, rename."""
        path = cache_path()
        signature = cpu_signature()
        entry = {"cpu": signature, "qkern": __version__, "key": list(key),
                 "choice": choice.to_json()}
        tmp = None
        with self._file_lock:
            self._from_file[key] = choice
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path.with_name(path.name + ".lock"), "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    _, entries = self._read(path, warn=False, refuse_newer=True)
                    entries = [e for e in entries if not _own_entry_to_replace(e, entry)]
                    data = {"format": FILE_FORMAT, "entries": entries + [entry]}
                    fd, tmp = tempfile.mkstemp(prefix=".tune-", dir=path.parent)
                    with os.fdopen(fd, "w") as fh:
                        json.dump(data, fh, indent=1)
                    os.replace(tmp, path)
                    tmp = None
            except (OSError, TypeError, ValueError) as e:
                warnings.warn(f"qkern.tune: cannot write {path} ({e}); results stay in memory",
                              RuntimeWarning, stacklevel=4)
            finally:
                if tmp is not None:
                    os.unlink(tmp)

    def clear(self) -> None:
        self.memory.clear()
        with self._file_lock:
            self._loaded_from = None
            self._from_file = {}


_STORE = _Store()


def clear() -> None:
    """Forget the results held in memory (the file stays)."""
    _STORE.clear()


WEIGHT_FORMS = ("packed", "widened")


def _weight(group_size: int, widened_ok: bool = False) -> str:
    """The weight part of a key: ``int8`` (``int8+widened`` when a widened
    copy is a candidate), or ``int4g<G>``."""
    if group_size:
        return f"int4g{group_size}"
    return "int8+widened" if widened_ok else "int8"


def _key(dtype: str, m: int, n: int, k: int, threads: int, layout: tuple,
         group_size: int = 0, widened_ok: bool = False) -> tuple:
    """(dtype, M bucket, N, K, threads, nr, kr, weight, ISA cap): plain str and ints."""
    return (dtype, m_bucket(int(m)), int(n), int(k), int(threads), int(layout[0]),
            int(layout[1]), _weight(group_size, widened_ok), dispatch.ISA_CAP)


def _own_entry_to_replace(old: dict, new: dict) -> bool:
    """Whether a file entry goes when ``new`` is written: one of this CPU
    and version with the same key, or with a malformed one."""
    if old["cpu"] != new["cpu"] or old["qkern"] != new["qkern"]:
        return False
    try:
        return list(_checked_key(old["key"])) == new["key"]
    except ValueError:
        return True


def _checked_key(raw) -> tuple:
    """A key read from the file, ValueError unless shaped like :func:`_key`'s."""
    if (not isinstance(raw, list) or len(raw) != 9 or not isinstance(raw[0], str)
            or not all(isinstance(v, str) for v in raw[7:])
            or not all(type(v) is int for v in raw[1:7])):
        raise ValueError(f"malformed key {raw!r}")
    return tuple(raw)


def _usable(choice: Choice, key: tuple) -> bool:
    """Whether a stored choice may run here for ``key``."""
    try:
        kern = dispatch.get_kernel(choice.kernel)  # unknown, or above the ISA cap: ValueError
    except ValueError:
        return False
    if key[0] not in kern.dtypes or (kern.weight_format == dispatch.INT4) != \
            key[7].startswith("int4"):
        return False
    if tuple(key[5:7]) != kern.layout or type(choice.threads) is not int \
            or not 1 <= choice.threads <= key[4]:
        return False
    if choice.weight_form not in WEIGHT_FORMS or (choice.weight_form == "widened" and not (
            kern.reads_widened_copy and key[7].endswith("+widened"))):
        return False
    try:
        choice.blocking.check(kern.kind, kern.packs_x)
    except (ValueError, TypeError):
        return False
    return True


def widened_ok(dtype, n: int, k: int, layout: tuple, memory_budget: int) -> bool:
    """Whether a widened copy of the (n, k) weight is a candidate: a kernel
    the tuner times (:data:`TUNED_WITH`) reads one and its bytes fit
    ``memory_budget``."""
    if memory_budget <= 0:
        return False
    name = dtype_name(dtype)
    isa = dispatch.top_level(DTYPES[name], layout)
    return any(dispatch.widened_copy_fits(kern, n, k, memory_budget)
               for kern in _kernels(name, layout, isa, dispatch.INT8))


@dataclass(frozen=True)
class _Candidate:
    kernel: Kernel
    blocking: Blocking
    threads: int
    widened: bool = False  # runs on the weight widened beforehand

    def describe(self) -> str:
        form = " on a widened copy" if self.widened else ""
        return f"{self.kernel.name}{form} {self.blocking} threads={self.threads}"


class _Problem:
    """The tuning input of one key: exact data, its exact result, packed
    (int8, or int4 in groups of ``group_size`` when that is not 0), and
    widened for the candidates that run on a widened copy."""

    def __init__(self, dtype: str, m: int, n: int, k: int, threads: int, layout: tuple,
                 group_size: int = 0):
        self._widened: dict = {}
        self.dtype = DTYPES[dtype]
        self.m = min(m_bucket(m), MAX_ROWS)
        nr = layout[0]
        weight_bytes = k // 2 if group_size else k  # per column
        panels_per_chunk = max(1, SLICE_CHUNK_BYTES // max(weight_bytes * nr, 1))
        cols = max(4 * threads * panels_per_chunk * nr,
                   min(int(TARGET_MACS / max(self.m * k, 1)),
                       MAX_WEIGHT_BYTES // max(weight_bytes, 1)))
        self.n = min(n, -(-cols // nr) * nr)
        self.k, self.layout, self.group_size = k, layout, group_size
        rng = np.random.default_rng(0)
        xi = rng.integers(-1, 2, (2, self.m, k)).astype(np.int64)
        xi[..., 1 << 16:] = 0  # keeps every sum below 2**23: exact in float32
        self.x = [a.astype(np.float32).astype(self.dtype) for a in xi]
        scale = 2.0 ** -6
        # float64 holds every product and sum exactly (|sum| < 2**24), and
        # so do the kernels' float32 steps: multiples of 2**-6 below 2**18
        if group_size:
            q = rng.integers(0, 16, (self.n, k), dtype=np.uint8)
            zero_points = rng.integers(0, 16, (k // group_size, self.n))
            self.sz = np.stack([np.full(zero_points.shape, scale), scale * (8 - zero_points)],
                               axis=-1).astype(self.dtype)
            w = q.astype(np.float64) - np.repeat(zero_points.T, group_size, axis=1)
            from qkern.woq_int4 import pack_int4

            self.packed = pack_int4(q)
        else:
            from qkern.packing import PackedWeight
            from qkern.woq import _padded_f32

            w = np.frombuffer(rng.bytes(self.n * k), np.int8).reshape(self.n, k)
            self.packed = PackedWeight(w, layout)
            self.scale_f32 = _padded_f32(np.full(self.n, scale, np.float32), layout[0])
        exact = (xi[0].astype(np.float64) @ w.T.astype(np.float64)) * scale
        self.want = exact.astype(np.float32).astype(self.dtype).view(np.uint8)

    def run(self, cand: _Candidate, x: np.ndarray) -> np.ndarray:
        if self.group_size:
            from qkern import woq_int4

            return woq_int4._run(cand.kernel, x, self.packed, self.n, self.k, self.group_size,
                                 self.sz, None, None, cand.threads, (), cand.blocking)
        from qkern.woq import _run

        widened = None
        if cand.widened:
            if cand.kernel.name not in self._widened:
                self._widened[cand.kernel.name] = self.packed.widened(cand.kernel)
            widened = self._widened[cand.kernel.name]
        return _run(cand.kernel, x, self.packed.data, self.layout, self.n, self.k,
                    self.scale_f32, None, None, cand.threads, (), cand.blocking, widened)

    def verify(self, cand: _Candidate) -> bool:
        y = self.run(cand, self.x[0])
        if _verify_hook is not None:
            y = _verify_hook(cand, y)
        return np.array_equal(y.view(np.uint8), self.want)


def _compute(kern: Kernel) -> tuple:
    """What fixes the order of a kernel's sums among the tuner's candidates:
    its ISA level, and for int4 whether it reads dequantized weights (the
    kernels of one compute give a row the same bits)."""
    return kern.isa, kern.dequantizes


class _Search:
    """Times candidates on one problem, best first (of those ``allowed``
    takes, every one by default); drops wrong ones."""

    def __init__(self, problem: _Problem, allowed=lambda cand: True):
        self.problem = problem
        self.allowed = allowed
        self.best = None
        self.best_seconds = math.inf
        self.timed = 0
        self.seen: dict = {}

    def time(self, cand: _Candidate) -> float:
        """The candidate's median seconds, inf if wrong or cut off."""
        if cand in self.seen:
            return self.seen[cand]
        seconds = math.inf
        if not self.problem.verify(cand):
            warnings.warn(f"qkern.tune: {cand.describe()} gave wrong results on the tuning "
                          "input: dropped", RuntimeWarning, stacklevel=5)
        else:
            self.timed += 1
            runs = []
            for x in itertools.islice(itertools.cycle(self.problem.x), RUNS):
                start = time.perf_counter()
                self.problem.run(cand, x)
                runs.append(time.perf_counter() - start)
                if len(runs) == 1 and runs[0] > CUT_OFF * self.best_seconds:
                    break
            seconds = sorted(runs)[len(runs) // 2] if len(runs) == RUNS else math.inf
        self.seen[cand] = seconds
        if seconds < self.best_seconds and self.allowed(cand):
            self.best, self.best_seconds = cand, seconds
        return seconds

    def improve(self, variants) -> None:
        """Try each variant of the best candidate so far."""
        for cand in list(variants):
            self.time(cand)

    def warm_up(self, cand: _Candidate) -> None:
        """Run ``cand`` for at least WARM_UP_SECONDS (and 3 calls) before any
        timing: an idle virtual CPU or thread takes milliseconds to wake."""
        start, calls = time.perf_counter(), 0
        while calls < 3 or time.perf_counter() - start < WARM_UP_SECONDS:
            self.problem.run(cand, self.problem.x[calls % 2])
            calls += 1

    def side_by_side(self, a: _Candidate, b: _Candidate) -> tuple:
        """Median seconds of ``a`` and ``b`` over FINAL_ROUNDS alternating calls."""
        times = ([], [])
        for r in range(FINAL_ROUNDS):
            for cand, out in ((a, times[0]), (b, times[1])):
                start = time.perf_counter()
                self.problem.run(cand, self.problem.x[r % 2])
                out.append(time.perf_counter() - start)
        return tuple(sorted(t)[len(t) // 2] for t in times)


def _blockings(kern: Kernel, base: Blocking, dimension: str) -> list:
    if dimension == "split":
        return [replace(base, split=s) for s in dispatch.SPLITS] if kern.kind != "kblock" else []
    if dimension == "chunk_bytes":
        return [replace(base, chunk_bytes=int(kern.blocking.chunk_bytes * f))
                for f in CHUNK_SCALES]
    if dimension == "rows":
        rows = KBLOCK_ROWS if kern.kind == "kblock" else PANEL_ROWS
        return [replace(base, rows=r) for r in rows]
    if dimension == "k_block":
        return [replace(base, k_block=b) for b in K_BLOCKS] if kern.kind == "kblock" else []
    raise ValueError(dimension)


def _thread_counts(threads: int) -> list:
    counts = {threads}
    while threads > 1:
        threads //= 2
        counts.add(threads)
    return sorted(counts, reverse=True)


#: Levels whose kernels the tuner times beside those of the highest level
#: (dispatch.top_level), on the same packed weight: on an AVX-512-BF16 CPU the AVX-512
#: (FMA) kernels, since which of vdpbf16ps and the FMA wins depends on the
#: CPU (vdpbf16ps at the FMA's instruction rate on Zen 4 and 5, at half of it
#: on Intel's); on an AMX CPU both, since the M from which the tile kernels
#: (which pack x first, and for int4 sum its groups) overtake them depends
#: on the shape and the CPU.  They sum in another order: a tuned choice of
#: one of them gives rows other last bits, which can then depend on M.
TUNED_WITH = {"avx512_bf16": ("avx512",), "amx": ("avx512_bf16", "avx512")}


def _kernels(dtype: str, layout: tuple, isa: str, weight_format: str) -> list:
    """The candidate kernels: those of ISA level ``isa`` (whose kernels give
    a row the same bits, but for an int4 kernel on dequantized weights) and
    of the levels :data:`TUNED_WITH` adds to it, that read ``layout`` in
    ``weight_format``."""
    levels = (isa, *TUNED_WITH.get(isa, ()))
    return [k for k in dispatch.REGISTRY
            if k.available and dtype in k.dtypes and k.isa in levels
            and k.weight_format == weight_format and k.layout == tuple(layout)
            and k.kind != "unpacked"]


def _forms(kern: Kernel, n: int, k: int, memory_budget: int) -> tuple:
    """The weight forms ``kern`` may run on: packed, and widened beforehand
    when its own copy of the (n, k) weight fits ``memory_budget``."""
    return (False, True) if dispatch.widened_copy_fits(kern, n, k, memory_budget) else (False,)


def _tune(dtype: str, m: int, n: int, k: int, threads: int, layout: tuple,
          exhaustive: bool = False, group_size: int = 0, memory_budget: int = 0,
          compute: tuple | None = None) -> Choice:
    """The best candidate for one key, timed; with ``compute``, of that
    compute only (the static choice is still timed, as the reference)."""
    start = time.perf_counter()
    problem = _Problem(dtype, m, n, k, threads, layout, group_size)
    search = _Search(problem, lambda cand: compute is None or _compute(cand.kernel) == compute)
    weight_format = dispatch.INT4 if group_size else dispatch.INT8
    static_kern = dispatch.choose_kernel(problem.dtype, m, layout, weight_format=weight_format,
                                          n=n)
    top = dispatch.top_level(problem.dtype, layout, weight_format)
    static = _Candidate(static_kern, static_kern.blocking, threads)
    search.warm_up(static)
    search.time(static)
    if exhaustive:
        for kern in _kernels(dtype, layout, top, weight_format):
            dims = [_blockings(kern, kern.blocking, d) or [kern.blocking]
                    for d in ("split", "chunk_bytes", "rows", "k_block")]
            for split, chunk, rows, kb in itertools.product(*dims):
                blocking = replace(kern.blocking, split=split.split, rows=rows.rows,
                                   chunk_bytes=chunk.chunk_bytes, k_block=kb.k_block)
                search.improve(_Candidate(kern, blocking, t, form)
                               for t in _thread_counts(threads)
                               for form in _forms(kern, n, k, memory_budget))
    else:
        search.improve(_Candidate(kern, kern.blocking, threads, form)
                       for kern in _kernels(dtype, layout, top, weight_format)
                       for form in _forms(kern, n, k, memory_budget))
        if search.best is not None:
            best = search.best
            search.improve(replace(best, threads=t) for t in _thread_counts(threads))
            for dimension in ("split", "chunk_bytes", "rows", "k_block"):
                best = search.best
                search.improve(replace(best, blocking=b)
                               for b in _blockings(best.kernel, best.blocking, dimension))
    if search.best is None or not math.isfinite(search.best_seconds):
        raise RuntimeError(f"qkern.tune: no candidate computed dtype={dtype} M={m} N={n} K={k} "
                           "correctly (see the warnings)")
    best = search.best
    packed = [c for c, t in search.seen.items()
              if not c.widened and math.isfinite(t) and search.allowed(c)]
    if best.widened and packed:
        # the copy costs memory: it must beat the best on the packed weight
        # by COPY_MIN_GAIN, side by side
        runner_up = min(packed, key=search.seen.get)
        on_copy, on_packed = search.side_by_side(best, runner_up)
        if on_copy * COPY_MIN_GAIN > on_packed:
            best = runner_up
    seconds = static_seconds = search.seen[best]
    if best != static:
        seconds, static_seconds = search.side_by_side(best, static)
        if seconds >= static_seconds and math.isfinite(search.seen[static]) \
                and search.allowed(static):
            best, seconds = static, static_seconds  # only a verified static choice
    return Choice(kernel=best.kernel.name, blocking=best.blocking, threads=best.threads,
                  seconds=seconds, static_seconds=static_seconds,
                  static_kernel=static_kern.name, candidates=search.timed,
                  tuning_seconds=time.perf_counter() - start,
                  weight_form="widened" if best.widened else "packed")


def compare(key: tuple, a: Choice, b: Choice) -> float:
    """``a``'s time over ``b``'s on the tuning problem of ``key`` (``(dtype,
    M, N, K, threads, group_size)``, as :func:`tune` returns it), timed side
    by side."""
    dtype, m, n, k, threads, group_size = key
    layout = _layout(dtype, group_size)
    search = _Search(_Problem(dtype, m, n, k, threads, layout, group_size))
    ca, cb = (_Candidate(dispatch.get_kernel(c.kernel), c.blocking, c.threads,
                         c.weight_form == "widened") for c in (a, b))
    search.warm_up(ca)
    ta, tb = search.side_by_side(ca, cb)
    return ta / tb


def _layout(dtype: str, group_size: int) -> tuple:
    """The layout a layer of ``dtype`` packs: an int8 layer's, or the int4 layout."""
    if group_size:
        return next(k.layout for k in dispatch.REGISTRY if k.weight_format == dispatch.INT4)
    return dispatch.choose_layout(DTYPES[dtype])


def choice_for(dtype, m: int, n: int, k: int, threads: int, layout: tuple | None = None,
               group_size: int = 0, memory_budget: int = 0) -> Choice:
    """The tuned choice for a key: from memory, else the file, else tuned now
    (and saved). Threads missing on one key tune it once; one key is tuned
    at a time, and among the kernels of the compute (the order of sums)
    chosen for the problem at another thread count, if any, so that the
    thread count changes no bit of a result.

    Parameters
    ----------
    dtype : numpy dtype or str
        The activations' dtype.
    m, n, k : int
        The problem (M is bucketed, see :func:`m_bucket`).
    threads : int
        The call's thread count (after :func:`qkern.woq` caps it).
    layout : tuple, optional
        The packed layout of the weight; default: the one a layer of this
        dtype packs (:func:`qkern.dispatch.choose_layout`, or the int4 layout).
    group_size : int
        0 for an int8 weight; else int4 in groups of this many k.
    memory_budget : int
        Bytes the layer may spend on a widened copy of an int8 weight
        (:func:`widened_ok`); 0: the packed weight only.

    Returns
    -------
    Choice
    """
    name = dtype_name(dtype)
    layout = tuple(layout) if layout is not None else _layout(name, group_size)
    ok = not group_size and widened_ok(name, n, k, layout, memory_budget)
    key = _key(name, m, n, k, threads, layout, group_size, ok)

    def build():
        found = _STORE.lookup_file(key)
        if found is not None:
            return found
        with _STORE.tuning:
            choice = _tune(name, m, n, k, threads, layout, group_size=group_size,
                           memory_budget=memory_budget if ok else 0,
                           compute=_STORE.sibling_compute(key))
            _STORE.save(key, choice)
        return choice

    return _STORE.memory.get(key, build)


def _check_shape(shape) -> tuple:
    """``(M, N, K)`` of :func:`tune`, each an int of at least 1."""
    try:
        dims = tuple(operator.index(v) for v in shape)
    except TypeError:
        raise TypeError(f"shapes: expected (M, N, K) of ints, got {shape!r}") from None
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"shapes: expected (M, N, K), each at least 1, got {shape!r}")
    return dims


def tune(shapes, dtypes=("bfloat16", "float32"), threads=None, *, exhaustive: bool = False,
         progress: bool = False, group_size: int = 0, memory_budget: int = 0) -> list:
    """Tune ahead of time: every (M, N, K) of ``shapes`` for every dtype and
    thread count, kept in memory and in the file.

    Parameters
    ----------
    shapes : iterable of (M, N, K)
        Problems, as a layer sees them (M rows of activations), each an
        int of at least 1.
    dtypes : iterable of str or numpy.dtype
        Activation dtypes: float32, float16 or bfloat16.
    threads : iterable of int, optional
        Thread counts, each checked as a call's ``num_threads`` is and
        capped as a call's is (at the processors); default: this
        process's (OpenMP's) count.
    exhaustive : bool
        Time the whole product of candidates instead of the search, for
        comparison; the result is not stored.
    progress : bool
        Show a progress bar (needs tqdm; ignored without it).
    group_size : int
        0 (the default) for int8 weights; else int4 weights in groups of
        this many k (32, 64, 128 or 256; :class:`qkern.Int4Linear`).
    memory_budget : int
        Bytes a layer may spend on a weight widened beforehand, as
        :class:`qkern.WoqLinear`'s ``memory_budget`` (int8 weights only);
        0 (the default): the packed weight only.

    Returns
    -------
    list of (key, Choice)
        ``key`` is ``(dtype, M, N, K, threads, group_size)``.
    """
    from qkern.woq import _check_threads
    from qkern.woq_int4 import GROUP_SIZES

    if group_size not in (0,) + GROUP_SIZES:
        raise ValueError(f"group_size: expected 0 (int8) or one of {GROUP_SIZES}, "
                         f"got {group_size!r}")
    memory_budget = check_memory_budget(memory_budget)
    shapes = [_check_shape(shape) for shape in shapes]
    for _, _, k in shapes:
        if group_size and k % group_size:
            raise ValueError(f"K={k} is not a multiple of group_size={group_size}")
    dtypes = [dtype_name(DTYPES.get(d, d) if isinstance(d, str) else d, "dtypes")
              for d in dtypes]
    # the counts calls will ask with: checked as a call's num_threads is,
    # and capped at the processors, as calls are
    threads = [_cpu.threads_for_call(_check_threads(t, "threads")) for t in (threads or [None])]
    jobs = [(d, m, n, k, t) for (m, n, k), d, t in itertools.product(shapes, dtypes, threads)]
    bar = None
    if progress:
        try:
            from tqdm import tqdm

            bar = tqdm(total=len(jobs), desc="qkern tune", unit="key")
        except ImportError:
            bar = None
    out = []
    for dtype, m, n, k, t in jobs:
        layout = _layout(dtype, group_size)
        if exhaustive:
            choice = _tune(dtype, m, n, k, t, layout, exhaustive=True, group_size=group_size,
                           memory_budget=0 if group_size else memory_budget)
        else:
            choice = choice_for(dtype, m, n, k, t, layout, group_size, memory_budget)
        out.append(((dtype, m, n, k, t, group_size), choice))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out
