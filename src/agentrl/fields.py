"""L0: option fields: a dataclass field that carries its flag's help and checks, and the one check of them.

Every options dataclass of agentrl (``RolloutOptions``, ``TrainConfig``, the export, import and
make-test-model options) declares each flag once, as :func:`option` fields. The metadata keys are
``help``, ``choices``, ``min``, ``max`` (inclusive), ``gt`` (exclusive), ``allow_inf``, ``flag``,
``metavar``, ``parse='list'``, ``positional``, ``engines`` and ``wrong_engine``;
:mod:`agentrl.cli.options` turns them into ``argparse`` arguments and :func:`check_fields` checks
the values before anything runs. Standard library only.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, Field, field, fields

__all__ = ['option', 'field_default', 'flag_of', 'check_fields']

#: metavars that name a path (an empty one would mean the current folder)
PATH_METAVARS = ('DIR', 'FILE', 'PATH', 'OUT', 'RUN')


def option(default, help: str, **checks) -> Field:
    """A dataclass field whose metadata is its flag's help and checks (keys: see the module).

    A list default (or None with ``parse='list'``) is stored as None: dataclasses refuse mutable
    defaults, and the options' ``__post_init__`` fills it in.
    """
    if isinstance(default, list) or default is None and checks.get('parse') == 'list':
        return field(default=None, metadata=dict(checks, help=help))
    return field(default=default, metadata=dict(checks, help=help))


def field_default(f: Field):
    """The default value of a dataclass field (``default_factory()`` called; None when it has none)."""
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else None


def flag_of(f: Field) -> str:
    """The command-line flag of a dataclass field: ``metadata['flag']`` or ``--`` + name with dashes."""
    return f.metadata.get('flag') or '--' + f.name.replace('_', '-')


def _check_number(flag: str, v, m) -> None:
    if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and not m.get('allow_inf'))):
        raise ValueError(f'{flag} must be a finite number, got {v}')
    lo, hi, gt = m.get('min'), m.get('max'), m.get('gt')
    if lo is not None and v < lo or hi is not None and v > hi or gt is not None and not v > gt:
        lo_s = f'> {gt}' if gt is not None else f'>= {lo}' if lo is not None else ''
        hi_s = f'<= {hi}' if hi is not None else ''
        raise ValueError(f'{flag} must be {" and ".join(s for s in (lo_s, hi_s) if s)}, got {v}')


def check_fields(obj, engine: str | None = None) -> None:
    """Check the values of an options dataclass against its fields' metadata.

    Every ``int``/``float`` field must be finite (``metadata['allow_inf']`` lets ``inf`` through)
    and within ``min``/``max`` (inclusive) and above ``gt`` (exclusive); a ``choices`` field must
    hold one of them; with ``engine``, a field whose ``metadata['engines']`` excludes it must keep
    its default (a flag that does not apply is refused, not ignored); a text field must not be
    empty or whitespace (an empty path would mean the current folder).

    Raises:
        ValueError: ``--FLAG must be ...`` naming the flag, the range and the value given;
            ``--FLAG is empty; ...``; ``--FLAG 'X' is not known; choose from ...``.
    """
    for f in fields(obj):
        v, m = getattr(obj, f.name), f.metadata
        flag = flag_of(f)
        if isinstance(v, str) and not v.strip():
            raise ValueError(f'{flag} is empty; pass a path (`.` for the current folder)' if m.get('metavar') in
                             PATH_METAVARS else f'{flag} is empty; pass a value or drop the flag')
        if 'choices' in m and v is not None and v not in m['choices']:
            raise ValueError(f'{flag} {v!r} is not known; choose from {",".join(map(str, m["choices"]))}')
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            _check_number(flag, v, m)
        if engine is not None and 'engines' in m and engine not in m['engines'] and v != field_default(f):
            raise ValueError(m.get('wrong_engine') or f'{flag} applies to --engine {"/".join(m["engines"])}, not '
                             f'--engine {engine}; drop {flag} or choose --engine {m["engines"][0]}')
