"""Export a strided memory region as a DLPack capsule (unversioned, DLPack 0.8 ABI).

Thin: the caller (:class:`qkern.cudnn.DeviceArray`) says where the memory
is and keeps nothing alive by itself; the capsule holds a reference to
``owner`` until the consumer calls the deleter.
"""
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc

cdef extern from *:
    """
    typedef struct { int32_t device_type; int32_t device_id; } qk_DLDevice;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } qk_DLDataType;
    typedef struct {
        void* data; qk_DLDevice device; int32_t ndim; qk_DLDataType dtype;
        int64_t* shape; int64_t* strides; uint64_t byte_offset;
    } qk_DLTensor;
    typedef struct qk_DLManagedTensor {
        qk_DLTensor dl_tensor; void* manager_ctx;
        void (*deleter)(struct qk_DLManagedTensor*);
    } qk_DLManagedTensor;
    """
    ctypedef struct qk_DLDevice:
        int32_t device_type
        int32_t device_id
    ctypedef struct qk_DLDataType:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct qk_DLTensor:
        void* data
        qk_DLDevice device
        int32_t ndim
        qk_DLDataType dtype
        int64_t* shape
        int64_t* strides
        uint64_t byte_offset
    ctypedef struct qk_DLManagedTensor:
        qk_DLTensor dl_tensor
        void* manager_ctx
        void (*deleter)(qk_DLManagedTensor*) noexcept

KDL_CPU, KDL_CUDA = 1, 2
_KDL_INT = 0


cdef void _deleter(qk_DLManagedTensor* m) noexcept with gil:
    if m == NULL:
        return
    Py_DECREF(<object><PyObject*>m.manager_ctx)
    free(m.dl_tensor.shape)
    free(m)


cdef void _capsule_destructor(object capsule) noexcept:
    # A capsule never consumed (still named "dltensor") owns its tensor.
    cdef qk_DLManagedTensor* m
    if PyCapsule_IsValid(capsule, b"dltensor"):
        m = <qk_DLManagedTensor*>PyCapsule_GetPointer(capsule, b"dltensor")
        m.deleter(m)


def int8_capsule(owner, uintptr_t data, shape, strides, int device_type, int device_id):
    """A ``dltensor`` capsule of int8 elements; ``strides`` in elements."""
    cdef int ndim = len(shape)
    cdef qk_DLManagedTensor* m = <qk_DLManagedTensor*>malloc(sizeof(qk_DLManagedTensor))
    if m == NULL:
        raise MemoryError()
    cdef int64_t* dims = <int64_t*>malloc(2 * max(ndim, 1) * sizeof(int64_t))
    if dims == NULL:
        free(m)
        raise MemoryError()
    cdef int i
    for i in range(ndim):
        dims[i] = shape[i]
        dims[ndim + i] = strides[i]
    m.dl_tensor.data = <void*>data
    m.dl_tensor.device.device_type = device_type
    m.dl_tensor.device.device_id = device_id
    m.dl_tensor.ndim = ndim
    m.dl_tensor.dtype.code = _KDL_INT
    m.dl_tensor.dtype.bits = 8
    m.dl_tensor.dtype.lanes = 1
    m.dl_tensor.shape = dims
    m.dl_tensor.strides = dims + ndim
    m.dl_tensor.byte_offset = 0
    Py_INCREF(owner)
    m.manager_ctx = <void*><PyObject*>owner
    m.deleter = _deleter
    return PyCapsule_New(m, b"dltensor", _capsule_destructor)
