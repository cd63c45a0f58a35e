"""Live modules by string key: how a module's custom op finds the module that called it."""

from __future__ import annotations

import itertools
import weakref

import torch

from qkern.torch._checks import check_x
from qkern.torch._interop import TORCH_DTYPES, run_into

__all__ = ["LiveRegistry", "define_linear_op"]


class LiveRegistry:
    """What the custom op of a module class needs, by a string key that the
    module's forward passes to the op (a string, so a compiled graph can hold
    it); held weakly, so an entry goes with its module."""

    _keys = itertools.count()  # shared: a key is unique in the process

    def __init__(self, op: str, module: str, prefix: str):
        self._entries: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._op, self._module, self._prefix = op, module, prefix

    def new_key(self) -> str:
        """A key no module of this process has had."""
        return f"{self._prefix}{next(self._keys)}"

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
    num_threads=)``) registered in ``registry`` under the string ``layer``."""

    @torch.library.custom_op(op, mutates_args=())
    def linear(x: torch.Tensor, layer: str) -> torch.Tensor:
        lin = registry[layer]
        check_x(x, lin.shape[1], TORCH_DTYPES[lin.dtype])
        return run_into(lin, x, lin.shape[0])

    @linear.register_fake
    def _(x, layer):
        lin = registry[layer]
        check_x(x, lin.shape[1], TORCH_DTYPES[lin.dtype])
        return x.new_empty(x.shape[:-1] + (lin.shape[0],))

    return linear
