"""Tier 2 of the cuDNN layer: descriptors, handles, one status check.

Every cuDNN status goes through :func:`check`, which raises
:class:`~qkern.cudnn.CudnnError` naming the status, the step (call,
descriptor and attribute) and cuDNN's last-error message.  Attribute types
come from one table (:data:`ATTRIBUTES`), so callers pass Python values and
never cast.  No policy lives here: which descriptors to build is tier 3's
business (:mod:`qkern.cudnn._graph`).
"""
from libc.stdint cimport int32_t, int64_t, uintptr_t
from libc.stdlib cimport free, malloc

from qkern.cudnn._api cimport api, cudnnBackendDescriptor_t, cudnnHandle_t, require_loaded

from qkern.cudnn._errors import CudnnError

# cudnnBackendDescriptorType_t
DESCRIPTOR_TYPES = {
    "POINTWISE": 0, "CONVOLUTION": 1, "ENGINE": 2, "ENGINECFG": 3, "ENGINEHEUR": 4,
    "EXECUTION_PLAN": 5, "OPERATION_CONVOLUTION_FORWARD": 10, "OPERATION_POINTWISE": 13,
    "OPERATIONGRAPH": 15, "VARIANT_PACK": 16, "TENSOR": 17,
}

# cudnnBackendAttributeType_t values, and the C element each is stored as.
cdef enum Element:
    E_ENUM, E_INT64, E_FLOAT, E_BOOL, E_DESC, E_PTR, E_CHAR

_TYPE_HANDLE, _TYPE_DATA_TYPE, _TYPE_BOOLEAN, _TYPE_INT64, _TYPE_FLOAT = 0, 1, 2, 3, 4
_TYPE_VOID_PTR, _TYPE_CONVOLUTION_MODE, _TYPE_HEUR_MODE = 6, 7, 8
_TYPE_POINTWISE_MODE, _TYPE_BACKEND_DESCRIPTOR, _TYPE_CHAR = 14, 15, 24

# name -> (cudnnBackendAttributeName_t, cudnnBackendAttributeType_t, element)
ATTRIBUTES = {
    "POINTWISE_MODE": (0, _TYPE_POINTWISE_MODE, E_ENUM),
    "POINTWISE_MATH_PREC": (1, _TYPE_DATA_TYPE, E_ENUM),
    "CONVOLUTION_COMP_TYPE": (100, _TYPE_DATA_TYPE, E_ENUM),
    "CONVOLUTION_CONV_MODE": (101, _TYPE_CONVOLUTION_MODE, E_ENUM),
    "CONVOLUTION_DILATIONS": (102, _TYPE_INT64, E_INT64),
    "CONVOLUTION_FILTER_STRIDES": (103, _TYPE_INT64, E_INT64),
    "CONVOLUTION_POST_PADDINGS": (104, _TYPE_INT64, E_INT64),
    "CONVOLUTION_PRE_PADDINGS": (105, _TYPE_INT64, E_INT64),
    "CONVOLUTION_SPATIAL_DIMS": (106, _TYPE_INT64, E_INT64),
    "ENGINEHEUR_MODE": (200, _TYPE_HEUR_MODE, E_ENUM),
    "ENGINEHEUR_OPERATION_GRAPH": (201, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "ENGINEHEUR_RESULTS": (202, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "ENGINECFG_ENGINE": (300, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "EXECUTION_PLAN_HANDLE": (400, _TYPE_HANDLE, E_PTR),
    "EXECUTION_PLAN_ENGINE_CONFIG": (401, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "EXECUTION_PLAN_WORKSPACE_SIZE": (402, _TYPE_INT64, E_INT64),
    "EXECUTION_PLAN_JSON_REPRESENTATION": (405, _TYPE_CHAR, E_CHAR),
    "OPERATION_CONVOLUTION_FORWARD_ALPHA": (700, _TYPE_FLOAT, E_FLOAT),
    "OPERATION_CONVOLUTION_FORWARD_BETA": (701, _TYPE_FLOAT, E_FLOAT),
    "OPERATION_CONVOLUTION_FORWARD_CONV_DESC": (702, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "OPERATION_CONVOLUTION_FORWARD_W": (703, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "OPERATION_CONVOLUTION_FORWARD_X": (704, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "OPERATION_CONVOLUTION_FORWARD_Y": (705, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "OPERATION_POINTWISE_PW_DESCRIPTOR": (750, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "OPERATION_POINTWISE_XDESC": (751, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "OPERATION_POINTWISE_BDESC": (752, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "OPERATION_POINTWISE_YDESC": (753, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "OPERATIONGRAPH_HANDLE": (800, _TYPE_HANDLE, E_PTR),
    "OPERATIONGRAPH_OPS": (801, _TYPE_BACKEND_DESCRIPTOR, E_DESC),
    "TENSOR_BYTE_ALIGNMENT": (900, _TYPE_INT64, E_INT64),
    "TENSOR_DATA_TYPE": (901, _TYPE_DATA_TYPE, E_ENUM),
    "TENSOR_DIMENSIONS": (902, _TYPE_INT64, E_INT64),
    "TENSOR_STRIDES": (903, _TYPE_INT64, E_INT64),
    "TENSOR_UNIQUE_ID": (906, _TYPE_INT64, E_INT64),
    "TENSOR_IS_VIRTUAL": (907, _TYPE_BOOLEAN, E_BOOL),
    "VARIANT_PACK_UNIQUE_IDS": (1000, _TYPE_INT64, E_INT64),
    "VARIANT_PACK_DATA_POINTERS": (1001, _TYPE_VOID_PTR, E_PTR),
    "VARIANT_PACK_WORKSPACE": (1003, _TYPE_VOID_PTR, E_PTR),
    "ENGINE_GLOBAL_INDEX": (1301, _TYPE_INT64, E_INT64),
}

# Enum values passed through E_ENUM attributes.
DATA_FLOAT, DATA_INT8, DATA_INT32 = 0, 3, 4
POINTWISE_ADD, POINTWISE_MUL, POINTWISE_RELU_FWD = 0, 1, 100
CROSS_CORRELATION = 1
HEUR_MODE_FALLBACK, HEUR_MODE_A = 2, 3

cdef size_t _ELEMENT_SIZE[7]
_ELEMENT_SIZE[:] = [sizeof(int32_t), sizeof(int64_t), sizeof(float), sizeof(unsigned char),
                    sizeof(void*), sizeof(void*), sizeof(char)]


cdef int check(int status, str step) except -1:
    cdef char buf[1024]
    if status == 0:
        return 0
    buf[0] = 0
    api.GetLastErrorString(buf, sizeof(buf))
    raise CudnnError(status, step, buf.decode("utf-8", "replace").strip())


def check_status(int status, str step):
    """Raise :class:`~qkern.cudnn.CudnnError` unless ``status`` is success."""
    require_loaded()
    check(status, step)


cdef class Descriptor:
    """One cuDNN backend descriptor, destroyed with this object.

    Parameters
    ----------
    kind : str
        A key of :data:`DESCRIPTOR_TYPES`, e.g. ``"TENSOR"``.
    label : str, optional
        Its role (e.g. ``"x"``), named in errors.

    Descriptors set as attribute values are kept referenced until this one
    is destroyed, since cuDNN holds on to them.
    """

    def __cinit__(self, str kind, str label=""):
        require_loaded()
        self.kind = kind
        self.label = label
        self._refs = []
        cdef int t = DESCRIPTOR_TYPES[kind]
        check(api.BackendCreateDescriptor(t, &self.ptr), f"create {kind}")

    def __dealloc__(self):
        self.destroy()

    cpdef destroy(self):
        """Destroy the cuDNN descriptor now (idempotent)."""
        if self.ptr != NULL:
            api.BackendDestroyDescriptor(self.ptr)
            self.ptr = NULL
        self._refs = []

    @property
    def address(self):
        """The ``cudnnBackendDescriptor_t`` as an int (0 once destroyed)."""
        return <uintptr_t>self.ptr

    def set(self, str name, values):
        """Set attribute ``name`` (a key of :data:`ATTRIBUTES`) to a value or a list."""
        attr, atype, element = ATTRIBUTES[name]
        vals = list(values) if isinstance(values, (list, tuple)) else [values]
        cdef Py_ssize_t i, n = len(vals)
        cdef void* buf = malloc(max(n, 1) * _ELEMENT_SIZE[element])
        if buf == NULL:
            raise MemoryError()
        cdef Descriptor d
        try:
            for i in range(n):
                if element == E_ENUM:
                    (<int32_t*>buf)[i] = vals[i]
                elif element == E_INT64:
                    (<int64_t*>buf)[i] = vals[i]
                elif element == E_FLOAT:
                    (<float*>buf)[i] = vals[i]
                elif element == E_BOOL:
                    (<unsigned char*>buf)[i] = 1 if vals[i] else 0  # C bool
                elif element == E_DESC:
                    d = vals[i]
                    (<cudnnBackendDescriptor_t*>buf)[i] = d.ptr
                elif element == E_PTR:
                    (<void**>buf)[i] = <void*><uintptr_t>vals[i]
                else:
                    raise TypeError(f"{name} cannot be set")
            check(api.BackendSetAttribute(self.ptr, attr, atype, n, buf), f"set {self._name()}.{name}")
        finally:
            free(buf)
        if element == E_DESC:
            self._refs.extend(vals)

    def finalize(self):
        """``cudnnBackendFinalize``."""
        check(api.BackendFinalize(self.ptr), f"finalize {self._name()}")
        self.finalized = True

    def get(self, str name, Py_ssize_t count=1):
        """Read an int64 (list of ``count``) or char (str) attribute."""
        attr, atype, element = ATTRIBUTES[name]
        cdef int64_t got = 0
        cdef int64_t* ints
        cdef char* chars
        if element == E_CHAR:
            check(api.BackendGetAttribute(self.ptr, attr, atype, 0, &got, NULL), f"get {self._name()}.{name}")
            chars = <char*>malloc(got + 1)
            if chars == NULL:
                raise MemoryError()
            try:
                check(api.BackendGetAttribute(self.ptr, attr, atype, got, &got, chars),
                      f"get {self._name()}.{name}")
                chars[got] = 0
                return chars[:got].decode("utf-8", "replace").rstrip("\0")
            finally:
                free(chars)
        if element != E_INT64:
            raise TypeError(f"{name}: use get_descriptors")
        ints = <int64_t*>malloc(max(count, 1) * sizeof(int64_t))
        if ints == NULL:
            raise MemoryError()
        try:
            check(api.BackendGetAttribute(self.ptr, attr, atype, count, &got, ints),
                  f"get {self._name()}.{name}")
            return [ints[i] for i in range(min(got, count))]
        finally:
            free(ints)

    def count(self, str name):
        """How many elements attribute ``name`` holds (a request for zero)."""
        attr, atype, _ = ATTRIBUTES[name]
        cdef int64_t got = 0
        check(api.BackendGetAttribute(self.ptr, attr, atype, 0, &got, NULL), f"count {self._name()}.{name}")
        return got

    def get_descriptors(self, str name, str kind, Py_ssize_t count):
        """Read a descriptor-valued attribute into ``count`` new descriptors of ``kind``."""
        attr, atype, element = ATTRIBUTES[name]
        if element != E_DESC:
            raise TypeError(f"{name} does not hold descriptors")
        out = [Descriptor(kind) for _ in range(count)]
        cdef cudnnBackendDescriptor_t* arr = <cudnnBackendDescriptor_t*>malloc(
            max(count, 1) * sizeof(cudnnBackendDescriptor_t))
        if arr == NULL:
            raise MemoryError()
        cdef int64_t got = 0
        cdef Py_ssize_t i
        cdef Descriptor d
        try:
            for i in range(count):
                d = out[i]
                arr[i] = d.ptr
            check(api.BackendGetAttribute(self.ptr, attr, atype, count, &got, arr),
                  f"get {self._name()}.{name}")
        finally:
            free(arr)
        return out[:got]

    def _name(self):
        return f"{self.kind} '{self.label}'" if self.label else self.kind

    def __repr__(self):
        return f"<cuDNN {self._name()} descriptor{' (finalized)' if self.finalized else ''}>"


cdef class Handle:
    """A ``cudnnHandle_t`` on the current CUDA device; destroyed with this object."""

    def __cinit__(self, int device):
        require_loaded()
        self.device = device
        check(api.Create(&self.ptr), f"cudnnCreate on device {device}")

    def __dealloc__(self):
        if self.ptr != NULL:
            api.Destroy(self.ptr)
            self.ptr = NULL

    @property
    def address(self):
        """The handle as an int."""
        return <uintptr_t>self.ptr

    def set_stream(self, uintptr_t stream):
        """``cudnnSetStream``: later executions run on ``stream``."""
        check(api.SetStream(self.ptr, <void*>stream), "cudnnSetStream")


def execute(Handle handle, Descriptor plan, Descriptor variant_pack):
    """``cudnnBackendExecute``, with the GIL released."""
    cdef int status
    with nogil:
        status = api.BackendExecute(handle.ptr, plan.ptr, variant_pack.ptr)
    check(status, "execute EXECUTION_PLAN")
