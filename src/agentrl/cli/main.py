"""Entry point of the ``agentrl`` command: dispatches to one module per subcommand.

Every module of the ``agentrl.cli`` package except this one is a subcommand: it defines
``register(subparsers)``, which adds its parser and sets ``func`` (called with the parsed
namespace, returns an exit code). Help lists them in :data:`ORDER`, then alphabetically. Errors are
printed as one line with the fix (``agentrl: error: ...``); ``--debug`` shows the traceback. Warnings
are one line too (``agentrl: warning: ...``).
"""
from __future__ import annotations

import argparse
import atexit
import os
import pkgutil
import sys
import warnings
from importlib import import_module

from .._version import __version__
from ..io import printable
from . import __path__ as cli_path
from .options import UserError, refuse_empty

#: preferred help order of the subcommand modules; others follow alphabetically
ORDER = ['rollout', 'check', 'show', 'report', 'train', 'template', 'drift', 'make_test_model']


def commands() -> list[str]:
    """Names of the subcommand modules in ``agentrl.cli``, in help order."""
    found = {m.name for m in pkgutil.iter_modules(cli_path) if m.name not in ('main', 'options')
             and not m.name.startswith('_')}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def _one_line(e: BaseException) -> str:
    """The error as one line; OS errors name the file and say what to do."""
    import errno
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        where = f': {e.filename!r}' if e.filename else ''
        return f'No space left on device{where}; free some space or write elsewhere (no partial file was kept)'
    if isinstance(e, OSError) and not isinstance(e, FileNotFoundError) and e.filename:
        hint = {FileExistsError: 'remove it or choose another path',
                IsADirectoryError: 'pass a file, not a folder',
                NotADirectoryError: 'a path component is a file; choose another path',
                PermissionError: 'choose a path you can write'}.get(type(e), 'check the path')
        return f'{e.strerror}: {e.filename!r}; {hint}'
    return ' '.join(str(e).split()) or type(e).__name__


#: exceptions caused by the input (files, flags, data, the machine), printed as one line
_INPUT_ERRORS = (UserError, ValueError, OSError, ImportError, MemoryError, EOFError)


def _exit_code(e: BaseException) -> int:
    """1 for refused data (an error with ``exit_code = 1``, e.g. a ``RecordError``) and internal errors, else 2."""
    code = getattr(e, 'exit_code', None)
    if isinstance(code, int):
        return code
    return 2 if isinstance(e, _INPUT_ERRORS) else 1


def _error_line(e: BaseException) -> str:
    """The error as one printable line; an unexpected error type adds how to see the traceback."""
    if isinstance(e, MemoryError):           # the store's names its row group and the fix already
        msg = _one_line(e)
        line = msg if msg.startswith('out of memory') else f'out of memory ({msg}); use smaller inputs or batches'
    elif isinstance(e, _INPUT_ERRORS):
        line = _one_line(e)
    else:
        line = f'{type(e).__name__}: {_one_line(e)} (an internal error; rerun with --debug for the traceback)'
    return printable(line)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Show a warning as one line, ``agentrl: warning: MESSAGE`` (the category named unless a UserWarning)."""
    kind = '' if issubclass(category, UserWarning) else f'{category.__name__}: '
    print(f'agentrl: warning: {kind}{printable(message)}', file=sys.stderr if file is None else file)


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line, not argparse's usage block.

    Its subparsers (``add_subparsers`` makes them of the parser's own class) inherit the rule.
    """

    def error(self, message: str):
        """Print ``PROG: error: MESSAGE (see PROG --help)`` to stderr and exit with status 2.

        ``PROG`` is the command, e.g. ``agentrl rollout`` or ``agentrl template audit``.

        Raises:
            SystemExit: always, with code 2.
        """
        self.exit(2, f'{self.prog}: error: {printable(message)} (see {self.prog} --help)\n')


def build_parser() -> argparse.ArgumentParser:
    """The ``agentrl`` argument parser with every subcommand module of ``agentrl.cli`` registered.

    Every parser in it is a :class:`OneLineParser`: a usage error (unknown flag, missing
    argument, bad choice or value) prints one line and exits with status 2.
    """
    parser = OneLineParser(
        prog='agentrl', description='Token-exact trajectories for agent RL: rollouts, checks, templates, pictures.')
    parser.add_argument('--version', action='version', version=f'agentrl {__version__}')
    parser.add_argument('--debug', action='store_true', help='show full tracebacks on errors')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND')
    sub.required = True
    for name in commands():
        import_module(f'.{name}', __package__).register(sub)
    return parser


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the innermost subcommand ``args`` selected (``agentrl template audit``'s for that command)."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name not in (subs[0].choices if subs else {}):
            return parser
        parser = subs[0].choices[name]


def main(argv: list[str] | None = None) -> int:
    """Run ``agentrl`` with ``argv`` (default ``sys.argv[1:]``) and return the exit code.

    0 ok; 1 a check failed, data was refused (a malformed row names its file, row and field) or an
    internal error; 2 a usage or input error (one line on stderr, the traceback with ``--debug``,
    accepted before or after the subcommand); 130 interrupted. No exception escapes as a
    traceback without ``--debug``.

    Called as the process's entry point (``argv`` None: the ``agentrl`` script, ``python -m agentrl``), the
    process ends as soon as the exit handlers ran (:func:`end_process`): the interpreter's teardown of
    torch's modules and the objects a command leaves took 2-6 s after the last line (``check``, ``serve``).
    A call with a list (tests, scripts) returns as any function does.
    """
    if argv is None:
        return _as_process(sys.argv[1:])
    argv = list(argv)
    debug = '--debug' in argv          # accepted before or after the subcommand
    argv = [a for a in argv if a != '--debug']
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:           # argparse would blame the top parser; name the (sub)command that was given them
        _innermost(parser, args).error(f'unrecognized arguments: {" ".join(extra)}')
    args.debug = debug
    try:
        refuse_empty(_innermost(parser, args), args)     # an empty path (the current folder) or a NaN
        with warnings.catch_warnings():     # restores the default display when the command returns
            if not debug:
                warnings.showwarning = _show_warning
            return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print('agentrl: interrupted', file=sys.stderr)
        return 130
    except BrokenPipeError:                 # `agentrl ... | head`: the reader left, not an error of ours
        sys.stderr.close()
        return 0
    except Exception as e:        # one line, never a traceback without --debug
        if args.debug:
            raise
        print(f'agentrl: error: {_error_line(e)}', file=sys.stderr)
        return _exit_code(e)


def _as_process(argv: list) -> int:
    """:func:`main` for the whole process: the exit code is kept for :func:`end_process`, registered first
    (exit handlers run last-registered first, so it runs after every library's, then ends the process)."""
    state = {'code': 1}
    atexit.register(end_process, state)
    try:
        state['code'] = main(argv)
    except SystemExit as e:                 # argparse: --help (0), a usage error (2)
        state['code'] = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        raise
    except KeyboardInterrupt:
        state['code'] = 130
        raise
    return state['code']


def end_process(state: dict) -> None:
    """The last exit handler of an ``agentrl`` process: flush stdout and stderr, then ``os._exit(state['code'])``.

    By then non-daemon threads were joined and every other exit handler ran (Ray, multiprocessing,
    logging, temporary folders); what is skipped is the interpreter's teardown of modules and objects,
    whose garbage collections over torch's objects kept a finished command alive for seconds. Every file
    agentrl writes is closed (and renamed) before the command returns, so nothing buffered is lost.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):        # a closed or broken pipe: nothing more can be written anyway
            pass
    os._exit(state['code'])


if __name__ == '__main__':
    sys.exit(main())
