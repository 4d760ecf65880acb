"""Entry point of the ``agentrl`` command: dispatches to one module per subcommand.

Every module of the ``agentrl.cli`` package except this one is a subcommand: it defines
``register(subparsers)``, which adds its parser and sets ``func`` (called with the parsed
namespace, returns an exit code). Help lists them in :data:`ORDER`, then alphabetically. Errors are
printed as one line with the fix (``agentrl: error: ...``); ``--debug`` shows the traceback.
"""
from __future__ import annotations

import argparse
import pkgutil
import sys
from importlib import import_module

from .. import __version__

#: preferred help order of the subcommand modules; others follow alphabetically
ORDER = ['rollout', 'check', 'show', 'report', 'train', 'template', 'drift', 'make_test_model']


def commands() -> list[str]:
    """Names of the subcommand modules in ``agentrl.cli``, in help order."""
    from . import __path__ as cli_path
    found = {m.name for m in pkgutil.iter_modules(cli_path) if m.name != 'main' and not m.name.startswith('_')}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


class UserError(Exception):
    """An error caused by the user's input; printed as one line, without a traceback."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='agentrl', description='Token-exact trajectories for agent RL: rollouts, checks, templates, pictures.')
    parser.add_argument('--version', action='version', version=f'agentrl {__version__}')
    parser.add_argument('--debug', action='store_true', help='show full tracebacks on errors')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND')
    sub.required = True
    for name in commands():
        import_module(f'.{name}', __package__).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print('agentrl: interrupted', file=sys.stderr)
        return 130
    except (UserError, ValueError, FileNotFoundError, ImportError) as e:
        if args.debug:
            raise
        print(f'agentrl: error: {e}', file=sys.stderr)
        return 2


if __name__ == '__main__':
    sys.exit(main())
