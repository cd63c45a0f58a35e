"""PyTorch interop: qkern's int8 and int4 WoQ GEMM and int8 conv2d as custom ops and modules.

Imported only by ``import qkern.torch``; ``import qkern`` never imports torch.

Six custom ops, each with a fake (meta) implementation, so that they trace
under ``torch.compile(fullgraph=True)`` and ``torch.export``:

``torch.ops.qkern.weight_int8pack_mm(x, w, scales)``
    What ``torch._weight_int8pack_mm`` computes (the weight is packed on
    every call); :func:`weight_int8pack_mm` is its documented entry point.
``torch.ops.qkern.woq_linear(x, layer)``
    The forward of :class:`WoqLinear`: runs the packed ``qkern.WoqLinear``
    registered under the string ``layer`` in this process.
``torch.ops.qkern.weight_int4pack_mm(x, w_packed, group_size, scales_and_zeros)``
    What ``torch._weight_int4pack_mm_for_cpu`` computes, on qkern's packed
    int4 layout; :func:`weight_int4pack_mm` is its documented entry point.
``torch.ops.qkern.int4_linear(x, layer)``
    The forward of :class:`Int4Linear`.
``torch.ops.qkern.qconv2d(x, w, bias, act_scale, weight_scale, out_scale, ...)``
    :func:`qkern.qconv2d` on int8 CPU or CUDA tensors in PyTorch's layouts
    (NCHW logical shape, channels_last result); :func:`qconv2d` is its
    documented entry point, which also takes quantized tensors.
``torch.ops.qkern.qconv2d_layer(x, layer)``
    The forward of :class:`QConv2d` on a GPU: runs the module registered
    under ``layer``, with its weights and plans kept on the device.

In plain eager calls (CPU tensors, no gradient to record, nothing tracing or
watching), the entry points of the four GEMM ops run the op's
implementation directly, skipping the dispatcher's tens of microseconds.

Tensors cross into qkern without a copy: a CPU tensor is viewed as a NumPy
array over the same memory (bfloat16 through its int16 bits, since
``Tensor.numpy()`` has no bfloat16), a CUDA tensor is passed as itself
(DLPack), and the result tensor is allocated by torch and written by qkern
through ``out=``.

One job per module, each calling only the ones above it in this list (and
qkern's public API):

``_interop``
    Tensors to and from qkern without copies: NumPy views, dtype maps,
    result tensors, quantized tensors' int8 memory; and the GEMM ops'
    definition with an entry that skips the op where nothing needs it
    (``define_op``, ``plain_eager``).
``_checks``
    The ops' argument checks, shared by their eager and fake
    implementations, and the arguments in the form the ops' schemas take.
``_functional``
    The ops ``qkern::weight_int8pack_mm`` and ``qkern::qconv2d``, and
    :func:`weight_int8pack_mm` and :func:`qconv2d`.
``_quantization``
    :func:`quantize_per_channel`.
``_registry``
    The registry of live modules that the module ops look their module up
    in, and the op of a linear module (``define_linear_op``).
``_int4``
    The op ``qkern::weight_int4pack_mm`` and :func:`weight_int4pack_mm`,
    :class:`Int4Linear` and its op ``qkern::int4_linear``, and
    :func:`int4_from_torch_packed` (PyTorch's packed int4 weights).
``_linear``
    :class:`WoqLinear`, its op ``qkern::woq_linear``, :func:`swap_linears`
    (int8 or int4).
``_conv``
    :class:`QConv2d` and its op ``qkern::qconv2d_layer``.
"""

try:
    import torch  # noqa: F401  (every module of this package needs it)
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError("qkern.torch needs PyTorch: pip install 'qkern[torch]'") from exc

from qkern.torch._conv import QConv2d
from qkern.torch._functional import qconv2d, weight_int8pack_mm
from qkern.torch._int4 import Int4Linear, int4_from_torch_packed, weight_int4pack_mm
from qkern.torch._linear import WoqLinear, swap_linears
from qkern.torch._quantization import quantize_per_channel

__all__ = ["Int4Linear", "QConv2d", "WoqLinear", "int4_from_torch_packed", "qconv2d",
           "quantize_per_channel", "swap_linears", "weight_int4pack_mm", "weight_int8pack_mm"]
