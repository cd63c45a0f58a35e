"""Tensors to and from qkern without copies.

A CPU tensor is viewed as a NumPy array over the same memory (bfloat16
through its int16 bits, since ``Tensor.numpy()`` has no bfloat16); results
are tensors allocated by torch, which qkern writes in place through
``out=``. Conv tensors follow PyTorch's convention, logical shape NCHW (x,
result) and OIHW (w), while qkern works on NHWC / OHWI memory, which is what
``t.permute(0, 2, 3, 1)`` of a channels_last tensor is, without a copy.
Quantized (qint8) tensors are read and written through int8 views of their
own memory.

:func:`plain_eager` tells when a GEMM op's entry point may run qkern
directly instead of calling its custom op (the op's trip through PyTorch's
dispatcher costs about 30 microseconds a call, a tenth of a one-row layer's
time at 4096 x 4096); :func:`define_op` defines such an op and its entry.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

__all__ = ["DTYPES", "TORCH_DTYPES", "as_numpy", "check_cpu_tensor", "define_op", "from_numpy",
           "host", "int8_view", "new_output", "nhwc", "plain_eager", "run_into", "unquantize"]

# Activation dtypes, torch -> NumPy.
DTYPES = {torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
          torch.bfloat16: np.dtype(ml_dtypes.bfloat16)}
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}


def _skipping_hooks():
    """The private PyTorch functions :func:`plain_eager` asks: whether a
    TorchFunction mode, a TorchDispatch mode or a functorch transform is
    active, whether the JIT tracer or a profiler runs, and a tensor's
    dispatch keys; None where this PyTorch lacks one of them (every call
    then takes the op)."""
    try:
        return (torch._C._len_torch_function_stack, torch._C._len_torch_dispatch_stack,
                torch._C._are_functorch_transforms_active, torch._C._get_tracing_state,
                torch._C._autograd._profiler_enabled, torch._C._dispatch_keys)
    except AttributeError:
        return None


_HOOKS = _skipping_hooks()
_plain_keys: tuple = ()  # see _plain_dispatch_keys


def _plain_dispatch_keys(dispatch_keys) -> tuple:
    """The dispatch keys of a plain dense CPU tensor made outside and inside
    ``torch.inference_mode()`` (an inference tensor has no autograd keys).
    Made on the first call that asks, which :func:`plain_eager` makes only
    when no mode is active (one, at import, could make a meta or fake
    tensor)."""
    global _plain_keys
    if not _plain_keys:
        with torch.inference_mode(False):  # whatever the caller's mode
            normal = dispatch_keys(torch.empty(0, device="cpu"))
        with torch.inference_mode():
            inference = dispatch_keys(torch.empty(0, device="cpu"))
        _plain_keys = (normal, inference)
    return _plain_keys


def plain_eager(*tensors) -> bool:
    """Whether an op's call on ``tensors`` may skip the custom op and run
    qkern directly, with the same result and errors.

    True for plain dense CPU tensors (inference tensors included) in eager
    mode, when no gradient is to be recorded and nothing traces, watches or
    transforms the call: not while ``torch.compile``, ``torch.export`` or
    ``torch.jit.trace`` traces, under a ``TorchFunctionMode`` or
    ``TorchDispatchMode`` (fake tensors, ``FlopCounterMode``, a default
    device), a functorch transform or a profiler, nor for tensor
    subclasses, meta or other devices, or inputs that require grad while
    grad mode is on.  Those go through the op, which records itself (and
    refuses a backward pass) as before.
    """
    if _HOOKS is None or torch.compiler.is_compiling():
        return False
    function_modes, dispatch_modes, transforms, tracing, profiling, dispatch_keys = _HOOKS
    if (function_modes() or dispatch_modes() or transforms() or tracing() is not None
            or profiling()):
        return False
    grad = torch.is_grad_enabled()
    plain_keys = _plain_keys or _plain_dispatch_keys(dispatch_keys)
    for t in tensors:
        if (type(t) is not torch.Tensor or dispatch_keys(t) not in plain_keys
                or (grad and t.requires_grad)):
            return False
    return True


def define_op(op: str, impl) -> tuple:
    """Define the custom op ``op`` (``"namespace::name"``) from ``impl``,
    whose annotations give its schema; returns ``(the op, call)``.

    ``call(*args)`` runs ``impl`` itself where :func:`plain_eager` allows it
    for the arguments that are not plain ints or strings, and otherwise the
    op, looked up in ``torch.ops`` at the call (so that a compiled graph
    holds its packet)."""
    defined = torch.library.custom_op(op, mutates_args=())(impl)
    namespace, name = op.split("::")

    def call(*args):
        if plain_eager(*(a for a in args if type(a) not in (int, str))):
            return impl(*args)
        return getattr(getattr(torch.ops, namespace), name)(*args)

    return defined, call


def check_cpu_tensor(name: str, t) -> None:
    """Raise TypeError unless ``t`` is a tensor, ValueError unless it is on the CPU."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor, got device {t.device}")


def as_numpy(name: str, t) -> np.ndarray:
    """A NumPy array over the memory of the CPU tensor ``t`` (no copy)."""
    check_cpu_tensor(name, t)
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(DTYPES[torch.bfloat16])
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A torch tensor holding a copy of ``a`` (bfloat16 through its bits)."""
    if a.dtype == DTYPES[torch.bfloat16]:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def run_into(fn, x: torch.Tensor, n: int) -> torch.Tensor:
    """``fn(x, out=y, num_threads=...)`` over NumPy views; returns the new tensor ``y``.

    ``y`` is a fresh contiguous tensor of shape ``(..., n)``; qkern writes it
    in place, on ``torch.get_num_threads()`` threads.
    """
    y = x.new_empty(x.shape[:-1] + (n,))
    fn(as_numpy("x", x), out=as_numpy("out", y), num_threads=torch.get_num_threads())
    return y


def nhwc(t: torch.Tensor) -> torch.Tensor:
    """The NHWC (or OHWI) view of a 4-d NCHW-logical (or OIHW) tensor."""
    return t.permute(0, 2, 3, 1)


def new_output(x: torch.Tensor, shape: tuple, out_scale: float | None = None) -> torch.Tensor:
    """An int8 (or, given ``out_scale``, qint8) channels_last tensor on ``x``'s device."""
    if out_scale is None:
        return torch.empty(shape, dtype=torch.int8, device=x.device,
                           memory_format=torch.channels_last)
    return torch._empty_affine_quantized(shape, scale=out_scale, zero_point=0, dtype=torch.qint8,
                                         device=x.device, memory_format=torch.channels_last)


def int8_view(q: torch.Tensor) -> torch.Tensor:
    """A plain int8 tensor over the memory of the qint8 tensor ``q`` (``int_repr()`` copies)."""
    return torch.empty(0, dtype=torch.int8, device=q.device).set_(
        q.untyped_storage(), q.storage_offset(), q.shape, q.stride())


def host(t: torch.Tensor | None):
    """A float32 host array of ``bias`` or per-channel ``weight_scale``; a float for a 0-d scale."""
    if t is None:
        return None
    t = t.detach().cpu()
    return float(t) if t.dim() == 0 else t.numpy()


def unquantize(name: str, t: torch.Tensor, scale, scale_name: str, per_channel: bool) -> tuple:
    """``(int8 tensor, scale)`` of ``t``: a qint8 tensor's own memory and q-params, or ``t, scale``.

    A quantized ``t`` carries its scale, so ``scale`` must then be None; a
    plain tensor needs it. ``per_channel`` allows per-channel (axis 0) q-params.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_quantized:
        if scale is None:
            raise TypeError(f"{scale_name}: required when {name} is not a quantized tensor")
        return t, scale
    if t.dtype != torch.qint8:
        raise TypeError(f"{name}: expected a qint8 quantized tensor (symmetric int8), got "
                        f"{t.dtype}")
    if scale is not None:
        raise ValueError(f"{scale_name}: must be None when {name} is quantized (its scale is "
                         f"{name}'s own)")
    if per_channel and t.qscheme() == torch.per_channel_affine:
        if t.q_per_channel_axis() != 0:
            raise ValueError(f"{name}: expected per-channel scales along axis 0 (output "
                             f"channels), got axis {t.q_per_channel_axis()}")
        if t.q_per_channel_zero_points().any():
            raise ValueError(f"{name}: expected zero points 0 (qkern's quantization is "
                             "symmetric), got non-zero per-channel zero points")
        scale = t.q_per_channel_scales().to(torch.float32)
    else:
        if t.qscheme() != torch.per_tensor_affine:
            raise ValueError(f"{name}: expected a per-tensor quantized tensor, got {t.qscheme()}")
        if t.q_zero_point() != 0:
            raise ValueError(f"{name}: expected zero_point 0 (qkern's quantization is "
                             f"symmetric), got {t.q_zero_point()}")
        scale = t.q_scale()
    return int8_view(t), scale
