"""The packed weight: an (N, K) int8 weight in the layout of a family of kernels.

One object owns the packed bytes and knows what they are (shape, layout,
format), packs and unpacks them in C (``src/woq/woq_pack.c``), reports its
size, and pickles and checks itself, so that nothing inconsistent reaches a
kernel (docs/kernels.rst, "Packed weight layouts").
"""

from __future__ import annotations

import numpy as np

from qkern import _woq
from qkern.dispatch import INT8, REGISTRY

__all__ = ["PackedWeight", "aligned_empty", "check_array", "check_int8_weight"]

_ALIGN = 64
FORMAT = INT8


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised int8 array of ``nbytes`` bytes starting on a 64-byte boundary."""
    raw = np.empty(nbytes + _ALIGN, dtype=np.int8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start:start + nbytes]


def freeze(a: np.ndarray) -> np.ndarray:
    """``a`` read-only for good: ``a`` itself where it views a buffer (an
    :func:`aligned_empty` one), which is made read-only too, else a view of
    it; NumPy refuses to make such a view writeable again."""
    if not isinstance(a.base, np.ndarray):
        a = a.view()
    a.flags.writeable = False
    a.base.flags.writeable = False
    return a


def _check_layout(layout) -> tuple:
    layouts = {k.layout for k in REGISTRY if k.weight_format == FORMAT}
    if not isinstance(layout, tuple) or tuple(layout) not in layouts:
        raise ValueError(f"layout: expected one of the registry's {sorted(layouts)}, "
                         f"got {layout!r}")
    return tuple(int(v) for v in layout)


def check_array(name: str, a, ndim: int | None = None) -> np.ndarray:
    """``a`` if it is a NumPy array (of ``ndim`` dimensions, when given);
    TypeError or ValueError naming argument ``name`` otherwise."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(a).__name__}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimension(s), got shape {a.shape}")
    return a


def check_int8_weight(w) -> np.ndarray:
    """``w`` if it is a C-contiguous 2-D int8 array; TypeError or ValueError
    naming what it is otherwise."""
    check_array("w", w, 2)
    if w.dtype != np.int8:
        raise TypeError(f"w: expected dtype int8, got {w.dtype}")
    if not w.flags.c_contiguous:
        raise ValueError("w: expected a C-contiguous (N, K) array, got a strided view; "
                         "pass np.ascontiguousarray(w)")
    return w


class PackedWeight:
    """An int8 ``(N, K)`` weight packed once into the layout ``(nr, kr)`` of a
    family of kernels (``include/qkern/woq.h``), in 64-byte-aligned memory it
    owns.

    Parameters
    ----------
    w : numpy.ndarray
        int8, shape ``(N, K)``, C-contiguous; copied, not kept.
    layout : tuple of int
        ``(nr, kr)`` of a registry kernel (:attr:`qkern.dispatch.Kernel.layout`).

    Attributes
    ----------
    format : str
        How the values are stored and scaled: ``"int8_per_channel"``.

    Examples
    --------
    >>> import numpy as np
    >>> from qkern.packing import PackedWeight
    >>> w = np.arange(6, dtype=np.int8).reshape(2, 3)
    >>> p = PackedWeight(w, (16, 1))
    >>> p.shape, p.layout, p.nbytes
    ((2, 3), (16, 1), 6)
    >>> bool((p.unpack() == w).all())
    True
    """

    format = FORMAT

    def __init__(self, w, layout):
        w = check_int8_weight(w)
        self._layout = _check_layout(layout)
        self._shape = w.shape
        self._data = aligned_empty(_woq.packed_size(*self.shape, *self.layout))
        _woq.pack(w, *self.layout, self._data)
        self._data = freeze(self._data)

    @property
    def shape(self) -> tuple:
        """``(N, K)``."""
        return self._shape

    @property
    def layout(self) -> tuple:
        """``(nr, kr)``: the kernels whose layout this is may read the bytes."""
        return self._layout

    @property
    def nbytes(self) -> int:
        """Bytes of the packed weight."""
        return self._data.nbytes

    @property
    def data(self) -> np.ndarray:
        """The packed bytes, a read-only 1-D int8 array (what the kernels read)."""
        return self._data

    def unpack(self) -> np.ndarray:
        """The ``(N, K)`` int8 weight, unpacked in C (a new array)."""
        w = np.empty(self.shape, np.int8)
        _woq.unpack(self._data, *self.layout, w)
        return w

    def widened(self, kernel) -> np.ndarray:
        """This weight widened beforehand for ``kernel`` (a
        :class:`~qkern.dispatch.Kernel` whose ``widened`` panels it reads, of
        this layout): a new read-only 1-D int8 array of the widened bytes
        (:func:`qkern.dispatch.widened_nbytes`), 64-byte aligned."""
        if kernel.layout != self.layout:
            raise ValueError(f"{kernel.name} reads layout {kernel.layout}, not {self.layout}")
        out = aligned_empty(_woq.widened_size(kernel.index, *self.shape))
        _woq.widen_weight(kernel.index, self._data, *self.shape, out.view(np.uint8))
        return freeze(out)

    def repacked(self, layout) -> PackedWeight:
        """This weight in ``layout``: itself when it is already, else packed anew."""
        return self if _check_layout(layout) == self.layout else PackedWeight(self.unpack(), layout)

    def __getstate__(self) -> dict:
        return {"shape": self.shape, "layout": self.layout, "format": self.format,
                "data": self._data.tobytes()}

    def __setstate__(self, state: dict) -> None:
        """Rebuild from :meth:`__getstate__`'s dict; every part is checked
        against the others before the bytes are kept."""
        if not isinstance(state, dict) or set(state) != {"shape", "layout", "format", "data"}:
            raise TypeError("PackedWeight state: expected a dict with the keys shape, layout, "
                            f"format and data, got {state!r:.200}")
        shape, data = state["shape"], state["data"]
        if state["format"] != FORMAT:
            raise ValueError(f"PackedWeight state: format {state['format']!r} is not {FORMAT!r}")
        if (not isinstance(shape, tuple) or len(shape) != 2
                or not all(isinstance(v, int) and 0 <= v < 2**63 for v in shape)):
            raise ValueError(f"PackedWeight state: shape {shape!r} is not (N, K)")
        layout = _check_layout(state["layout"])
        if not isinstance(data, bytes):
            raise TypeError(f"PackedWeight state: data must be bytes, got {type(data).__name__}")
        if len(data) != _woq.packed_size(*shape, *layout):
            raise ValueError(f"PackedWeight state: {len(data)} bytes do not hold a {shape} "
                             f"weight in layout {layout}")
        self._shape, self._layout = shape, layout
        self._data = aligned_empty(len(data))
        self._data[:] = np.frombuffer(data, np.int8)
        self._data = freeze(self._data)

    def __repr__(self) -> str:
        n, k = self.shape
        return (f"PackedWeight(N={n}, K={k}, layout=nr{self.layout[0]}c{self.layout[1]}, "
                f"{self.format}, {self.nbytes} bytes)")
