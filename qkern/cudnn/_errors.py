"""The two exceptions of :mod:`qkern.cudnn` and the cuDNN status names."""

from __future__ import annotations

__all__ = ["CudnnError", "CudnnUnavailableError", "status_name"]

# cudnnStatus_t (cudnn_graph.h, cuDNN 9).
_STATUS_NAMES = {
    0: "CUDNN_STATUS_SUCCESS",
    1001: "CUDNN_STATUS_NOT_INITIALIZED",
    1002: "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
    1003: "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH",
    1004: "CUDNN_STATUS_DEPRECATED",
    1005: "CUDNN_STATUS_LICENSE_ERROR",
    1006: "CUDNN_STATUS_RUNTIME_IN_PROGRESS",
    1007: "CUDNN_STATUS_RUNTIME_FP_OVERFLOW",
    1008: "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
    2000: "CUDNN_STATUS_BAD_PARAM",
    2001: "CUDNN_STATUS_INVALID_VALUE",
    2002: "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
    2003: "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
    2004: "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
    2005: "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND",
    2006: "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
    2007: "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH",
    2008: "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
    2009: "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES",
    2010: "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE",
    2011: "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH",
    2012: "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE",
    3000: "CUDNN_STATUS_NOT_SUPPORTED",
    3001: "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN",
    3002: "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
    3003: "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE",
    3004: "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT",
    3005: "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
    3006: "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART",
    3007: "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
    3008: "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
    3009: "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE",
    3010: "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT",
    3011: "CUDNN_STATUS_NOT_SUPPORTED_PADDING",
    3012: "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM",
    3013: "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API",
    3014: "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE",
    4000: "CUDNN_STATUS_INTERNAL_ERROR",
    4001: "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
    4002: "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE",
    4003: "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
    4004: "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
    4005: "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM",
    4006: "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED",
    5000: "CUDNN_STATUS_EXECUTION_FAILED",
    5001: "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
    5002: "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS",
    5003: "CUDNN_STATUS_EXECUTION_FAILED_CUDART",
    5004: "CUDNN_STATUS_EXECUTION_FAILED_CURAND",
}

EXTRA = "qkern[cuda]"


def status_name(status: int) -> str:
    """The ``cudnnStatus_t`` name of ``status`` (``CUDNN_STATUS_<n>`` when unknown)."""
    return _STATUS_NAMES.get(status, f"CUDNN_STATUS_{status}")


class CudnnError(RuntimeError):
    """A cuDNN call returned an error status.

    Attributes
    ----------
    status : int
        The ``cudnnStatus_t`` value.
    status_name : str
        Its name, e.g. ``CUDNN_STATUS_NOT_SUPPORTED_SHAPE``.
    step : str
        The call and the descriptor/attribute it acted on, e.g.
        ``finalize OPERATION_CONVOLUTION_FORWARD``.
    detail : str
        cuDNN's own last-error message (may be empty).
    problem : str or None
        The convolution problem being built or run.
    """

    def __init__(self, status: int, step: str, detail: str = "", problem: str | None = None):
        self.status = int(status)
        self.status_name = status_name(self.status)
        self.step = step
        self.detail = detail
        self.problem = problem
        msg = f"{self.status_name} ({self.status}) in {step}"
        if detail:
            msg += f": {detail}"
        if problem:
            msg += f" [problem: {problem}]"
        super().__init__(msg)

    def with_problem(self, problem: str) -> CudnnError:
        """The same error, naming the problem it occurred in."""
        return CudnnError(self.status, self.step, self.detail, problem)


class CudnnUnavailableError(RuntimeError):
    """cuDNN, CUDA or a GPU is missing; the message says which and how to get it."""

    def __init__(self, what: str):
        super().__init__(f"{what} (the GPU path needs `pip install {EXTRA}`: cuda-python, "
                         "nvidia-cudnn-cu13, cuBLAS and NVRTC, and an NVIDIA GPU with its driver)")
