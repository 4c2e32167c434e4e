"""Modules imported on first use: the runner's command line and the results API import the helpers, and
``python -m taskloss.runner --help`` should not wait for torch (seconds on a busy machine)."""
from __future__ import annotations

import importlib


class _Lazy:
    """A module (or a name in one) imported on first use. With ``bind`` and ``namespace`` (the using module's
    ``globals()``), the first use replaces the placeholder there by the real object, so later uses cost nothing."""

    def __init__(self, module: str, name: str | None = None, *, bind: str | None = None,
                 namespace: dict | None = None):
        self._where, self._bind, self._namespace = (module, name), bind, namespace

    def _load(self):
        module, name = self._where
        value = importlib.import_module(module)
        value = getattr(value, name) if name else value
        if self._bind and self._namespace is not None and self._namespace.get(self._bind) is self:
            self._namespace[self._bind] = value
        return value

    def __getattr__(self, attr: str):
        return getattr(self._load(), attr)

    def __instancecheck__(self, obj) -> bool:      # isinstance(x, Tensor)
        return isinstance(obj, self._load())

    def __subclasscheck__(self, cls) -> bool:
        return issubclass(cls, self._load())

