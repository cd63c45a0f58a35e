# Tier 2 of the cuDNN layer: owned descriptors and handles, one status check.
from qkern.cudnn._api cimport cudnnBackendDescriptor_t, cudnnHandle_t


cdef int check(int status, str step) except -1


cdef class Descriptor:
    cdef cudnnBackendDescriptor_t ptr
    cdef readonly str kind
    cdef readonly str label
    cdef readonly bint finalized
    cdef list _refs
    cpdef destroy(self)


cdef class Handle:
    cdef cudnnHandle_t ptr
    cdef readonly int device
