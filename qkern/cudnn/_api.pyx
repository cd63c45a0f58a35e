"""Tier 1 of the cuDNN layer: load libcudnn by path and resolve its functions.

Nothing is loaded at import.  :func:`load` is called once, by
:mod:`qkern.cudnn._loader`, with the path it found.  The library stays
loaded for the life of the process (cuDNN does not support unloading
while handles or descriptors exist).
"""
from posix.dlfcn cimport RTLD_LOCAL, RTLD_NOW, dlclose, dlerror, dlopen, dlsym

_loaded_path = None

# (field of cudnn_api, exported symbol)
_SYMBOLS = (
    "cudnnGetVersion", "cudnnGetErrorString", "cudnnGetLastErrorString", "cudnnCreate",
    "cudnnDestroy", "cudnnSetStream", "cudnnBackendCreateDescriptor",
    "cudnnBackendDestroyDescriptor", "cudnnBackendSetAttribute", "cudnnBackendGetAttribute",
    "cudnnBackendFinalize", "cudnnBackendExecute",
)


cdef void* _sym(void* lib, str name) except NULL:
    cdef void* p = dlsym(lib, name.encode())
    if p == NULL:
        raise OSError(f"{name} not found in the cuDNN library: {(<bytes>dlerror()).decode()}")
    return p


def load(str path):
    """dlopen ``path`` and resolve the functions; a second call is a no-op.

    Raises
    ------
    OSError
        The library cannot be opened or lacks a function (a cuDNN older
        than 9).  A different path after a successful load is refused.
    """
    global _loaded_path
    if _loaded_path is not None:
        if path != _loaded_path:
            raise OSError(f"cuDNN is already loaded from {_loaded_path}; cannot switch to {path}")
        return
    cdef void* lib = dlopen(path.encode(), RTLD_NOW | RTLD_LOCAL)
    if lib == NULL:
        raise OSError(f"cannot load {path}: {(<bytes>dlerror()).decode()}")
    cdef cudnn_api t
    try:
        _resolve(lib, &t)
    except OSError:
        dlclose(lib)
        raise
    global api
    api = t
    _loaded_path = path


cdef int _resolve(void* lib, cudnn_api* t) except -1:
    t.GetVersion = <size_t (*)() noexcept nogil>_sym(lib, _SYMBOLS[0])
    t.GetErrorString = <const char* (*)(int) noexcept nogil>_sym(lib, _SYMBOLS[1])
    t.GetLastErrorString = <void (*)(char*, size_t) noexcept nogil>_sym(lib, _SYMBOLS[2])
    t.Create = <int (*)(cudnnHandle_t*) noexcept nogil>_sym(lib, _SYMBOLS[3])
    t.Destroy = <int (*)(cudnnHandle_t) noexcept nogil>_sym(lib, _SYMBOLS[4])
    t.SetStream = <int (*)(cudnnHandle_t, void*) noexcept nogil>_sym(lib, _SYMBOLS[5])
    t.BackendCreateDescriptor = <int (*)(int, cudnnBackendDescriptor_t*) noexcept nogil>_sym(lib, _SYMBOLS[6])
    t.BackendDestroyDescriptor = <int (*)(cudnnBackendDescriptor_t) noexcept nogil>_sym(lib, _SYMBOLS[7])
    t.BackendSetAttribute = <int (*)(cudnnBackendDescriptor_t, int, int, int64_t, const void*) noexcept nogil>_sym(lib, _SYMBOLS[8])
    t.BackendGetAttribute = <int (*)(cudnnBackendDescriptor_t, int, int, int64_t, int64_t*, void*) noexcept nogil>_sym(lib, _SYMBOLS[9])
    t.BackendFinalize = <int (*)(cudnnBackendDescriptor_t) noexcept nogil>_sym(lib, _SYMBOLS[10])
    t.BackendExecute = <int (*)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t) noexcept nogil>_sym(lib, _SYMBOLS[11])
    return 0


def loaded_path():
    """The path of the loaded library, or None."""
    return _loaded_path


def version():
    """``cudnnGetVersion()``, e.g. 92801 for 9.28.1."""
    require_loaded()
    return api.GetVersion()


cdef int require_loaded() except -1:
    if _loaded_path is None:
        raise RuntimeError("cuDNN is not loaded (qkern.cudnn loads it at first use)")
    return 0
