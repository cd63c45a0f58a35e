"""qkern: quantized kernels for NumPy and CUDA arrays.

Public API only; see the documentation for semantics.  :mod:`qkern.cudnn`
is imported here but loads nothing of CUDA or cuDNN until a CUDA array is
first used.
"""

from qkern import cudnn
from qkern.dispatch import ISA_LEVELS, cpu_features, kernels
from qkern.qconv import qconv2d
from qkern.woq import WoqLinear, weight_int8pack_mm

__version__ = "0.1.0"

__all__ = ["ISA_LEVELS", "WoqLinear", "cpu_features", "cudnn", "kernels", "qconv2d",
           "weight_int8pack_mm", "__version__"]
