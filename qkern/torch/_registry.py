"""Live modules by string key: how a module's custom op finds the module that called it."""

from __future__ import annotations

import itertools
import weakref

__all__ = ["LiveRegistry"]


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
