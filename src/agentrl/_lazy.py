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
