"""L0: the one lazy-export helper: a module's public names load their submodule on first use.

``agentrl/__init__.py`` (the book's names), ``agentrl/train/__init__.py`` and
``agentrl/jobs/plan.py`` (names that moved to :mod:`agentrl.jobs.resume`) use it, so that
``import agentrl`` imports neither torch nor a module that imports it back. Standard library only.
"""
from __future__ import annotations

import sys
from importlib import import_module
from typing import Callable

__all__ = ['lazy_exports']


def lazy_exports(module: str, exports: dict[str, str], *, base: str | None = None,
                 submodules: frozenset | set = frozenset()) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``module``: each name of ``exports`` is read from its submodule on first use.

    Args:
        module: the importing module's ``__name__`` (the loaded value is cached in it).
        exports: public name -> submodule name, relative to ``base``.
        base: the package the submodule names are relative to (default: ``module``, a package).
        submodules: names that are submodules themselves (``agentrl.gym`` as ``arl.gym``).

    Returns:
        the module-level ``__getattr__`` (raises ``AttributeError: module 'M' has no attribute 'X'``
        for any other name) and ``__dir__`` (the exported names, sorted, plus those already in the module).
    """
    base = base or module

    def __getattr__(name):
        if name in submodules:
            return import_module(f'.{name}', base)
        where = exports.get(name)
        if where is None:
            raise AttributeError(f'module {module!r} has no attribute {name!r}')
        value = getattr(import_module(f'.{where}', base), name)
        setattr(sys.modules[module], name, value)
        return value

    def __dir__():
        return getattr(sys.modules[module], '__all__', sorted(exports))
    return __getattr__, __dir__


class _LazyModule:
    """A stand-in for a module that imports it on first attribute use (the module is not put in
    ``sys.modules`` before then, so ``'torch' in sys.modules`` stays a true statement)."""
    __slots__ = ('_name',)

    def __init__(self, name: str):
        object.__setattr__(self, '_name', name)

    def __getattr__(self, attr):
        return getattr(import_module(self._name), attr)

    def __repr__(self) -> str:
        return f'<lazy module {self._name!r}>'


def lazy_module(name: str):
    """``name`` imported on first attribute use: ``torch = lazy_module('torch')`` at a module's top keeps
    ``import agentrl.record`` free of the torch import (1-2 s) until a tensor is built.

    Returns:
        a proxy whose attributes are the module's (``torch.long``, ``torch.is_tensor``); annotations
        stay strings (``from __future__ import annotations``). Raises ImportError on first use when the
        module is not installed.
    """
    return _LazyModule(name)


__all__.append('lazy_module')
