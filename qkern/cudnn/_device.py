"""CUDA arrays, streams and device memory, through cuda.core and cuda.bindings.

Nothing here is imported from CUDA until :func:`require_device` runs.
:class:`ArraySpec` is the plain description of an array (pointer, shape,
element strides, dtype, device) that the checks in :mod:`qkern.cudnn._conv`
read; it is built from any ``__cuda_array_interface__`` / ``__dlpack__``
object by :func:`describe` (``cuda.core.utils.StridedMemoryView``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qkern.cudnn import _dlpack
from qkern.cudnn._errors import CudnnUnavailableError

__all__ = ["ArraySpec", "DeviceArray", "alignment", "describe", "pixel_pitch", "require_cuda",
           "require_device"]

MAX_ALIGNMENT = 16


def _core():
    try:
        import cuda.core as core
        from cuda.bindings import driver
    except ImportError as e:
        raise CudnnUnavailableError(f"cuda.core / cuda.bindings are not installed ({e})") from None
    return core, driver


def require_cuda() -> None:
    """Check that cuda.core imports and a CUDA driver with a device is present."""
    core, _ = _core()
    try:
        core.Device()
    except Exception as e:          # no driver library, no device
        raise CudnnUnavailableError(f"no CUDA driver or device ({type(e).__name__}: {e})") from None


def require_device(device: int):
    """``cuda.core.Device(device)``, made current; CudnnUnavailableError without one."""
    core, _ = _core()
    try:
        dev = core.Device(device)
        dev.set_current()
    except Exception as e:          # no driver, no device, bad ordinal
        raise CudnnUnavailableError(
            f"no usable CUDA device {device} ({type(e).__name__}: {e})") from None
    return dev


def alignment(ptr: int) -> int:
    """The largest power of two, up to 16, dividing ``ptr``."""
    return MAX_ALIGNMENT if ptr % MAX_ALIGNMENT == 0 else ptr & -ptr


@dataclass(frozen=True)
class ArraySpec:
    """Where an array's elements are:
    ``ptr + sum(i * s for i, s in zip(index, strides)) * itemsize``."""

    ptr: int
    shape: tuple
    strides: tuple
    dtype: np.dtype
    device: int
    owner: object = None

    @property
    def dense(self) -> bool:
        """C-contiguous (size-1 axes ignored)."""
        expect = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides)):
            if n != 1 and s != expect:
                return False
            expect *= n
        return True

    @property
    def nbytes(self) -> int:
        """Size in bytes of the elements (not of the span)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def span(self) -> tuple[int, int]:
        """``[first, last)`` byte addresses the array touches."""
        if 0 in self.shape:
            return self.ptr, self.ptr
        lo = sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        hi = sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        return self.ptr + lo * self.dtype.itemsize, self.ptr + (hi + 1) * self.dtype.itemsize


def _c_strides(shape) -> tuple:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return tuple(reversed(out))


def describe(name: str, obj, stream_ptr: int | None) -> ArraySpec:
    """The :class:`ArraySpec` of a CUDA (or DLPack host) array, ordered after ``stream_ptr``."""
    core, _ = _core()
    try:
        view = core.utils.StridedMemoryView.from_any_interface(obj, stream_ptr)
    except Exception as e:
        raise TypeError(f"{name}: cannot view {type(obj).__name__} as a strided array "
                        f"({type(e).__name__}: {e})") from None
    shape = tuple(int(n) for n in view.shape)
    strides = view.strides
    strides = _c_strides(shape) if strides is None else tuple(int(s) for s in strides)
    device = int(view.device_id) if view.is_device_accessible else -1
    return ArraySpec(int(view.ptr), shape, strides, np.dtype(view.dtype), device, obj)


def pixel_pitch(name: str, a: ArraySpec) -> int:
    """Elements between consecutive pixels of an NHWC array with unit channel stride.

    Raises
    ------
    ValueError
        Channels not unit-stride, or pixels not one stride apart.
    """
    n, h, w, c = a.shape
    sn, sh, sw, sc = a.strides
    p = sw if w > 1 else (sh // w if h > 1 else (sn // (h * w) if n > 1 else c))
    ok = (c == 1 or sc == 1) and p >= c and all(
        size == 1 or stride == want
        for size, stride, want in ((w, sw, p), (h, sh, w * p), (n, sn, h * w * p)))
    if not ok:
        raise ValueError(f"{name}: expected NHWC memory with unit channel stride and pixels one "
                         f"stride apart, got shape {a.shape} with element strides {a.strides}")
    return p


def resolve_stream(stream, dev):
    """A ``cuda.core.Stream`` from None, a Stream, ``__cuda_stream__``, a torch/CuPy stream
    or an int."""
    core, _ = _core()
    if stream is None:
        return dev.default_stream
    if isinstance(stream, core.Stream):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return dev.create_stream(stream)
    for attr in ("cuda_stream", "ptr"):          # torch.cuda.Stream, cupy.cuda.Stream
        handle = getattr(stream, attr, None)
        if isinstance(handle, int):
            return core.Stream.from_handle(handle)
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool):
        return core.Stream.from_handle(int(stream))
    raise TypeError(f"stream: expected a cuda.core Stream, an object with __cuda_stream__, "
                    f"a torch/CuPy stream or an int handle, got {type(stream).__name__}")


def stream_handle(stream) -> int:
    """The ``cudaStream_t`` of a cuda.core Stream, as an int."""
    return int(stream.handle)


def _check(result, what: str):
    _, driver = _core()
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise RuntimeError(f"{what} failed: {err.name}: {msg.decode() if msg else ''}")
    return result[1:]


def allocate(dev, nbytes: int, stream):
    """A stream-ordered device buffer of at least one byte (``cuda.core.Buffer``)."""
    return dev.allocate(max(int(nbytes), 1), stream=stream)


def buffer_ptr(buf) -> int:
    """The device address of a ``cuda.core.Buffer``."""
    return int(buf.handle)


def memset_zero(ptr: int, nbytes: int, stream) -> None:
    """Zero ``nbytes`` at ``ptr`` on ``stream``."""
    _, driver = _core()
    _check(driver.cuMemsetD8Async(ptr, 0, nbytes, stream_handle(stream)), "cuMemsetD8Async")


def upload(host: np.ndarray, ptr: int, stream) -> None:
    """Copy a C-contiguous host array to ``ptr``; returns when the copy is done."""
    _, driver = _core()
    host = np.ascontiguousarray(host)
    _check(driver.cuMemcpyHtoDAsync(ptr, host.ctypes.data, host.nbytes, stream_handle(stream)),
           "cuMemcpyHtoDAsync")
    stream.sync()


def download(a: ArraySpec, stream) -> np.ndarray:
    """A host copy of a dense device array."""
    _, driver = _core()
    out = np.empty(a.shape, dtype=a.dtype)
    _check(driver.cuMemcpyDtoHAsync(out.ctypes.data, a.ptr, out.nbytes, stream_handle(stream)),
           "cuMemcpyDtoHAsync")
    stream.sync()
    return out


def copy_rows(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int,
              stream) -> None:
    """Device-to-device 2-D copy of ``rows`` rows of ``width`` bytes (cuMemcpy2DAsync)."""
    if rows == 0 or width == 0:
        return
    _, driver = _core()
    cp = driver.CUDA_MEMCPY2D()
    cp.srcMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    cp.srcDevice = driver.CUdeviceptr(src)
    cp.srcPitch = src_pitch
    cp.dstMemoryType = driver.CUmemorytype.CU_MEMORYTYPE_DEVICE
    cp.dstDevice = driver.CUdeviceptr(dst)
    cp.dstPitch = dst_pitch
    cp.WidthInBytes = width
    cp.Height = rows
    _check(driver.cuMemcpy2DAsync(cp, stream_handle(stream)), "cuMemcpy2DAsync")


class DeviceArray:
    """An int8 array in device memory owned by qkern, exported as CAI v3 and DLPack.

    Returned by :func:`qkern.qconv2d` and :class:`QConv2d` for CUDA input.
    ``torch.from_dlpack(y)``, ``cupy.asarray(y)`` and
    ``cuda.core.utils.StridedMemoryView(y)`` take it without a copy.

    Attributes
    ----------
    shape : tuple
    dtype : numpy.dtype
        Always int8.
    device : int
        CUDA device ordinal.
    ptr : int
        Device address of element 0.
    """

    def __init__(self, buffer, shape: tuple, device: int, stream):
        self._buffer = buffer
        self.shape = tuple(shape)
        self.dtype = np.dtype(np.int8)
        self.device = device
        self.ptr = buffer_ptr(buffer)
        self._stream = stream

    @property
    def strides(self) -> tuple:
        """Element strides (C order)."""
        return _c_strides(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def __cuda_array_interface__(self) -> dict:
        handle = stream_handle(self._stream)
        return {"shape": self.shape, "typestr": "|i1", "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": handle if handle else 1}

    def __dlpack_device__(self) -> tuple:
        return (_dlpack.KDL_CUDA, self.device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("DeviceArray exports without copying only")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"DeviceArray lives on CUDA device {self.device}, not {dl_device}")
        if stream != -1 and stream != stream_handle(self._stream):
            self._stream.sync()         # conservative: any other consumer stream waits for ours
        return _dlpack.int8_capsule(self, self.ptr, self.shape, self.strides, _dlpack.KDL_CUDA,
                                    self.device)

    def spec(self) -> ArraySpec:
        """This array as an :class:`ArraySpec`."""
        return ArraySpec(self.ptr, self.shape, self.strides, self.dtype, self.device, self)

    def to_numpy(self) -> np.ndarray:
        """A host copy (waits for the producing stream)."""
        return download(self.spec(), self._stream)

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype=int8, device={self.device})"
