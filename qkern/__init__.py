"""qkern: quantized kernels for NumPy and CUDA arrays.

Public API only; see the documentation for semantics.  :mod:`qkern.cudnn`
is imported here but loads nothing of CUDA or cuDNN until a CUDA array is
first used.
"""

from qkern import cudnn
from qkern._version import __version__
from qkern.dispatch import ISA_LEVELS, cpu_features, kernels
from qkern.qconv import qconv2d
from qkern.tuning import tune
from qkern.woq import WoqLinear, weight_int8pack_mm
from qkern.woq_int4 import Int4Linear, pack_int4, quantize_int4, unpack_int4, weight_int4pack_mm

__all__ = ["ISA_LEVELS", "Int4Linear", "WoqLinear", "cpu_features", "cudnn", "kernels",
           "pack_int4", "qconv2d", "quantize_int4", "tune", "unpack_int4",
           "weight_int4pack_mm", "weight_int8pack_mm", "__version__"]
