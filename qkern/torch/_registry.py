"""Live modules by string key: how a module's custom op finds the module that called it."""

from __future__ import annotations

import uuid
import weakref

import torch

from qkern.torch._checks import check_x
from qkern.torch._interop import TORCH_DTYPES, define_op, run_into

__all__ = ["LiveRegistry", "define_linear_op", "load_layer_state"]


class LiveRegistry:
    """What the custom op of a module class needs, by a string key that the
    module's forward passes to the op (a string, so a compiled graph can hold
    it); held weakly, so an entry goes with its module.

    Keys are random UUIDs, unique across processes: a graph traced in one
    process (an exported program, say) names no module of another, where the
    op then raises rather than running some other module of that name."""

    def __init__(self, op: str, module: str, prefix: str):
        self._entries: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._op, self._module, self._prefix = op, module, prefix

    def new_key(self) -> str:
        """A key no other module, of this process or another, has had."""
        return f"{self._prefix}{uuid.uuid4().hex}"

    def __setitem__(self, key: str, entry) -> None:
        self._entries[key] = entry

    def __getitem__(self, key: str):
        try:
            return self._entries[key]
        except KeyError:
            raise RuntimeError(f"{self._op}: no live {self._module} with key {key!r} "
                               "in this process") from None


def define_linear_op(op: str, registry: LiveRegistry):
    """Define the custom op ``op(x, layer) -> Tensor`` (with its fake) that runs
    the qkern linear layer (``shape``, ``dtype``, ``__call__(x, out=,
    num_threads=)``) registered in ``registry`` under the string ``layer``.

    Returns ``call(x, layer)``, the module's forward: the op, or where
    :func:`~qkern.torch._interop.plain_eager` allows, its implementation
    called directly (:func:`~qkern.torch._interop.define_op`)."""

    def run_layer(x: torch.Tensor, layer: str) -> torch.Tensor:
        lin = registry[layer]
        check_x(x, lin.shape[1], TORCH_DTYPES[lin.dtype])
        return run_into(lin, x, lin.shape[0])

    linear, call = define_op(op, run_layer)

    @linear.register_fake
    def _(x, layer):
        lin = registry[layer]
        check_x(x, lin.shape[1], TORCH_DTYPES[lin.dtype])
        return x.new_empty(x.shape[:-1] + (lin.shape[0],))

    return call


def load_layer_state(module, state_dict, prefix, local_metadata, strict, missing_keys,
                     unexpected_keys, error_msgs, expected: dict, weight: tuple):
    """``nn.Module._load_from_state_dict`` for a layer module without
    parameters: run the pre-hooks, record unexpected and missing keys, and
    check each tensor's shape against ``expected`` (``{name: shape}``, the
    names the module saves) and the dtype of ``weight`` (``(name, dtype)``),
    with PyTorch's messages. Returns ``{name: tensor}``, or None when a key
    is missing or an error was recorded (the module is then left alone)."""
    for hook in module._load_state_dict_pre_hooks.values():
        hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
             error_msgs)
    if strict:
        unexpected_keys.extend(key for key in state_dict if key.startswith(prefix)
                               and key[len(prefix):] not in expected)
    missing = [prefix + name for name in expected if prefix + name not in state_dict]
    missing_keys.extend(missing)
    if missing:
        return None
    loaded = {name: state_dict[prefix + name] for name in expected}
    bad = [f"size mismatch for {prefix}{name}: copying a param with shape "
           f"{tuple(t.shape)} from checkpoint, the shape in current model is "
           f"{tuple(expected[name])}." for name, t in loaded.items()
           if tuple(t.shape) != tuple(expected[name])]
    name, dtype = weight
    if loaded[name].dtype != dtype:
        bad.append(f"dtype mismatch for {prefix}{name}: expected {dtype}, got "
                   f"{loaded[name].dtype}.")
    if bad:
        error_msgs.extend(bad)
        return None
    return loaded
