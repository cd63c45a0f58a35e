"""The GPU half of qkern: the fused int8 conv2d through the cuDNN backend API.

Importing this package loads nothing of CUDA or cuDNN; the first call with
a CUDA array does (``pip install qkern[cuda]``).  See :doc:`/qconv2d`.
"""

from qkern.cudnn import _device
from qkern.cudnn._conv import QConv2d, qconv2d
from qkern.cudnn._device import DeviceArray
from qkern.cudnn._errors import CudnnError, CudnnUnavailableError
from qkern.cudnn._loader import ensure_loaded as load
from qkern.cudnn._plancache import clear_plan_cache, plan_cache_info

__all__ = ["CudnnError", "CudnnUnavailableError", "DeviceArray", "QConv2d", "clear_plan_cache",
           "load", "plan_cache_info", "qconv2d", "unavailable_reason"]


def unavailable_reason() -> str | None:
    """Why the GPU path cannot run in this process, or None when it can.

    Checks what the first call with a CUDA array needs (cuda.core and
    cuda.bindings, a CUDA driver with a device, the cuDNN library) without
    raising.

    Returns
    -------
    str or None
        The message of the :class:`CudnnUnavailableError` that call would
        raise, or None.
    """
    try:
        _device.require_cuda()
        load()
    except CudnnUnavailableError as e:
        return str(e)
    return None
