"""The GPU half of qkern: the fused int8 conv2d through the cuDNN backend API.

Importing this package loads nothing of CUDA or cuDNN; the first call with
a CUDA array does (``pip install qkern[cuda]``).  See :doc:`/qconv2d`.
"""

from qkern.cudnn._conv import QConv2d, qconv2d
from qkern.cudnn._device import DeviceArray
from qkern.cudnn._errors import CudnnError, CudnnUnavailableError
from qkern.cudnn._loader import ensure_loaded as load
from qkern.cudnn._plancache import clear_plan_cache, plan_cache_info

__all__ = ["CudnnError", "CudnnUnavailableError", "DeviceArray", "QConv2d", "clear_plan_cache",
           "load", "plan_cache_info", "qconv2d"]
