# Tier 1 of the cuDNN layer: the dozen cuDNN functions qkern calls, as a
# table of function pointers filled by dlopen/dlsym (load()).  No cuDNN
# header is needed to build qkern; enums are passed as C ints (their ABI).
from libc.stdint cimport int64_t

ctypedef void* cudnnHandle_t
ctypedef void* cudnnBackendDescriptor_t

ctypedef struct cudnn_api:
    size_t (*GetVersion)() noexcept nogil
    const char* (*GetErrorString)(int status) noexcept nogil
    void (*GetLastErrorString)(char* message, size_t max_size) noexcept nogil
    int (*Create)(cudnnHandle_t* handle) noexcept nogil
    int (*Destroy)(cudnnHandle_t handle) noexcept nogil
    int (*SetStream)(cudnnHandle_t handle, void* stream) noexcept nogil
    int (*BackendCreateDescriptor)(int descriptor_type, cudnnBackendDescriptor_t* out) noexcept nogil
    int (*BackendDestroyDescriptor)(cudnnBackendDescriptor_t desc) noexcept nogil
    int (*BackendSetAttribute)(cudnnBackendDescriptor_t desc, int name, int type, int64_t count,
                               const void* values) noexcept nogil
    int (*BackendGetAttribute)(cudnnBackendDescriptor_t desc, int name, int type, int64_t requested,
                               int64_t* count, void* values) noexcept nogil
    int (*BackendFinalize)(cudnnBackendDescriptor_t desc) noexcept nogil
    int (*BackendExecute)(cudnnHandle_t handle, cudnnBackendDescriptor_t plan,
                          cudnnBackendDescriptor_t variant_pack) noexcept nogil

# Filled by load(); every pointer is NULL before.
cdef cudnn_api api

# Raises RuntimeError when cuDNN has not been loaded.
cdef int require_loaded() except -1
