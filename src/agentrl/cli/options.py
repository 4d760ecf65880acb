"""Command-line options built from documented dataclasses: each flag is declared once, as a field.

A command's options are a dataclass of :func:`agentrl.fields.option` fields, carrying help and checks in
``metadata`` (``help``, ``choices``, ``min``, ``max``, ``gt``, ``allow_inf``, ``flag``,
``metavar``, ``parse='list'``, ``positional``, ``engines``). :func:`add_fields` turns the fields
into ``argparse`` arguments (type, default and help from the field), :func:`from_args` builds the
dataclass back from the parsed namespace, and :func:`check_numbers` range-checks every number
before anything runs (CleanRL's one-``Args``-dataclass style, read by plain argparse).

:class:`UserError` is an error caused by the user's input: printed as one line, no traceback.
"""
from __future__ import annotations

import argparse
import typing
from dataclasses import fields

from ..fields import check_fields, field_default, flag_of

__all__ = ['UserError', 'add_fields', 'from_args', 'check_numbers', 'given_flags', 'refuse_empty']

#: the namespace attribute holding the ``dest`` of every flag given on the command line
GIVEN = '_given'


class UserError(Exception):
    """An error caused by the user's input; printed as one line, without a traceback."""


def _type_of(cls, f):
    hints = typing.get_type_hints(cls)
    t = hints.get(f.name, str)
    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if args else t


def _mark_given(namespace, dest: str) -> None:
    setattr(namespace, GIVEN, getattr(namespace, GIVEN, frozenset()) | {dest})


class _Given:
    """Mixin for an argparse action: also record the flag as given (:func:`given_flags`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        _mark_given(namespace, self.dest)


class _Store(_Given, argparse._StoreAction):
    pass


class _Extend(_Given, argparse._StoreAction):
    """A repeatable list flag (``metadata['repeatable']``): each use adds its comma-separated values."""

    def __call__(self, parser, namespace, values, option_string=None):
        values = list(getattr(namespace, self.dest, None) or []) + list(values)
        super().__call__(parser, namespace, values, option_string)


class _StoreTrue(_Given, argparse._StoreTrueAction):
    pass


class _StoreFalse(_Given, argparse._StoreFalseAction):
    pass


def given_flags(args: argparse.Namespace) -> frozenset:
    """The field names whose flags were given on the command line (not left at their default).

    Only flags added by :func:`add_fields` are tracked; a flag given with its default value counts
    as given (a ``--resume`` compares every given flag with the run's plan).
    """
    return frozenset(getattr(args, GIVEN, frozenset()))


def _split_list(s: str) -> list[str]:
    # empty names are kept, so the options' validate refuses `oracle,,blind` instead of dropping one
    return [x.strip() for x in s.split(',')]


def add_fields(parser: argparse.ArgumentParser, cls, skip: tuple = ()) -> None:
    """Add one argument per field of the dataclass ``cls`` (help, type, default from the field).

    Every flag it adds records itself as given when it appears on the command line
    (:func:`given_flags`), so a default can be told apart from the same value given explicitly.

    ``--some-name`` for ``some_name`` (``metadata['flag']`` overrides, e.g. ``--no-batch`` for a
    ``bool`` defaulting to True); a ``bool`` field is a switch; ``parse='list'`` takes
    comma-separated values (``repeatable``: the flag may be given again, the lists are joined);
    ``positional`` makes it a positional argument.
    """
    for f in fields(cls):
        if f.name in skip:
            continue
        m = f.metadata
        default = field_default(f)
        t = _type_of(cls, f)
        help_ = m.get('help', '')
        if default is not None and not isinstance(default, bool) and m.get('parse') != 'list':
            help_ += f' (default: {default})'
        kw: dict = {'help': help_}
        if m.get('metavar'):
            kw['metavar'] = m['metavar']
        if t is bool or isinstance(default, bool):
            kw['action'] = _StoreFalse if default else _StoreTrue
            parser.add_argument(flag_of(f), dest=f.name, **kw)
            continue
        if m.get('parse') == 'list':
            kw['type'] = _split_list
        elif t is float:
            kw['type'] = float          # nan and inf are refused by check_numbers, in one line
        elif t is int:
            kw['type'] = int
        if 'choices' in m:
            kw['choices'] = list(m['choices'])
        if m.get('positional'):
            parser.add_argument(f.name, **kw)
        else:
            action = _Extend if m.get('repeatable') else _Store
            parser.add_argument(flag_of(f), dest=f.name, default=default, action=action, **kw)


def from_args(cls, args: argparse.Namespace, **extra):
    """Build the dataclass ``cls`` from the parsed ``args`` (fields absent from ``args`` keep their default)."""
    kw = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    kw.update(extra)
    return cls(**kw)


def check_numbers(obj) -> None:
    """Range-check every number of an options dataclass from its fields' metadata.

    :func:`agentrl.fields.check_fields`: every ``int``/``float`` field must be finite (``allow_inf``
    lets infinity through) and within ``min``/``max`` (inclusive) and above ``gt``.

    Raises:
        UserError: ``--FLAG must be ...``, naming the flag, its range and the value given.
    """
    try:
        check_fields(obj)
    except ValueError as e:
        raise UserError(str(e)) from None


#: metavars and names (``dest``) of the arguments that take a path
PATH_METAVARS = ('DIR', 'FILE', 'PATH', 'OUT', 'RUN', 'RUN_DIR', 'TOKENIZER', 'FILE.json')
PATH_DESTS = ('path', 'out', 'tokenizer', 'resume', 'checkpoint', 'run_dir', 'records', 'messages', 'tools')


def refuse_empty(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse an empty or whitespace-only text value, or a NaN, of any argument of ``parser`` (every command's).

    An empty path would otherwise mean the current folder (``--out ''`` wrote a run there); a NaN
    threshold switches a comparison off. Each command's options check their ranges themselves
    (:func:`agentrl.fields.check_fields`); this sweep runs first, for every command alike.

    Raises:
        UserError: ``--FLAG is empty; pass a path (`.` for the current folder)`` for a path
            argument (``pass a value or drop the flag`` for another text flag);
            ``--FLAG must be a finite number, got nan``; ``--FLAG must be a 64-bit integer ...`` for an
            integer no C long holds (it would overflow in pyarrow or torch).
    """
    for name, v in vars(args).items():
        if isinstance(v, float) and v != v:
            raise UserError(f'--{name.replace("_", "-")} must be a finite number, got nan')
        if isinstance(v, int) and not isinstance(v, bool) and not -2 ** 63 <= v < 2 ** 63:   # no C long holds it
            raise UserError(f'--{name.replace("_", "-")} must be a 64-bit integer (below 2**63 in size), got {v}')
    for a in parser._actions:
        v = getattr(args, a.dest, None) if a.dest != argparse.SUPPRESS else None
        if not isinstance(v, str) or v.strip():
            continue
        name = '/'.join(a.option_strings[:1]) or (a.metavar or a.dest.upper())
        if a.dest in PATH_DESTS or a.metavar in PATH_METAVARS:
            raise UserError(f'{name} is empty; pass a path (`.` for the current folder)')
        raise UserError(f'{name} is empty; pass a value or drop the flag')
