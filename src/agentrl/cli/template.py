"""``agentrl template audit``: what a real chat template does to an agent episode.

Prints owner counts, per-message prefix stability, what thinking mode inserts, the bridge after a
tool turn and after a user turn, and the template fingerprint, all computed by rendering the
tokenizer's own template (``agentrl.templates``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..io import printable, read_json
from .options import UserError


@dataclass
class TemplateAuditOptions:
    """Options of ``agentrl template audit`` (one field per flag).

    Attributes:
        tokenizer: a local tokenizer folder (``tokenizer.json`` + ``tokenizer_config.json``) or a
            hub id (downloads unless ``HF_HUB_OFFLINE=1``).
        messages: JSON file with a list of messages (or ``{"messages": [...], "tools": [...]}``);
            None = the book's two-turn clamp episode (chapter 5.2).
        tools: JSON file with a list of tool schemas (MCP or OpenAI style); None = the gym's
            ``TOOL_SCHEMAS`` with the default conversation, the file's own ``tools`` otherwise.
        thinking: False renders with ``enable_thinking=False`` (``--no-thinking``).
    """
    tokenizer: str
    messages: str | None = None
    tools: str | None = None
    thinking: bool = True

    def validate(self) -> None:
        """Raise :class:`~agentrl.cli.options.UserError` naming the bad flag and the fix."""
        for flag, path in (('--messages', self.messages), ('--tools', self.tools)):
            if path is not None and not os.path.isfile(path):
                raise UserError(f'{flag} {path!r} does not exist; pass a JSON file')


def chapter_messages() -> list:
    """The book's two-turn clamp episode (section 5.2) as fresh message dicts, from the gym's texts.

    Raises:
        ImportError: the gym is not importable (a broken install; reinstall agentrl).

    Source: book chapter 5.2 (``messages`` of the Qwen3 rendering).
    """
    from .. import gym

    def call(name, **arguments):
        return [{'type': 'function', 'function': {'name': name, 'arguments': arguments}}]

    return [
        {'role': 'user', 'content': gym.CLAMP_ISSUE},
        {'role': 'assistant', 'content': '', 'reasoning_content': 'Read the source first.', 'tool_calls': call('read')},
        {'role': 'tool', 'content': gym.compact_source(gym.CLAMP_BUGGY)},
        {'role': 'assistant', 'content': '', 'reasoning_content': 'min and max are swapped.',
         'tool_calls': call('edit', op='swap_minmax')},
        {'role': 'tool', 'content': 'ok'},
    ]


def register(sub) -> None:
    """Add this subcommand's parser (every flag documented) to ``sub`` and set ``func=run``."""
    p = sub.add_parser('template',
                       help='audit a Hugging Face chat template (owners, prefix stability, thinking, bridges)',
                       description='Audit what a real chat template does to an agent episode.')
    tsub = p.add_subparsers(dest='template_command', metavar='ACTION')
    tsub.required = True
    a = tsub.add_parser('audit', help='owner counts, prefix stability, thinking insertions, bridges, fingerprint',
                        description='Render a conversation through TOKENIZER\'s chat template and print owner '
                                    'counts, per-message prefix stability, what thinking mode inserts, the '
                                    'bridge after a tool turn and after a user turn, and the fingerprint.')
    a.add_argument('tokenizer', metavar='TOKENIZER', help='local tokenizer folder or hub id')
    a.add_argument('--messages', metavar='FILE.json', default=None,
                   help='JSON list of messages (default: the book\'s two-turn clamp episode)')
    a.add_argument('--tools', metavar='FILE.json', default=None,
                   help='JSON list of tool schemas (default: the gym\'s TOOL_SCHEMAS with the default messages)')
    a.add_argument('--no-thinking', dest='thinking', action='store_false',
                   help='render with enable_thinking=False')
    a.set_defaults(func=run)


def _load_json(path: str, flag: str):
    """The JSON value of the file given to ``flag``; UserError ``FLAG 'PATH' is not valid JSON (...); fix``."""
    what = 'a JSON list of messages' if flag == '--messages' else 'a JSON list of tool schemas'
    try:
        return read_json(path, fix=f'pass {what} to {flag}')
    except ValueError as e:
        raise UserError(f'{flag} {e}') from None


def load_inputs(opts: TemplateAuditOptions) -> tuple:
    """(messages, tools) from the option files or the defaults.

    Raises:
        UserError: a file that is not JSON, or does not hold a list of messages / tool schemas.
    """
    tools = None
    if opts.messages is None:
        from .. import gym
        messages, tools = chapter_messages(), gym.TOOL_SCHEMAS
    else:
        data = _load_json(opts.messages, '--messages')
        if isinstance(data, dict):
            messages, tools = data.get('messages'), data.get('tools')
        else:
            messages = data
        if not isinstance(messages, list) or not messages:
            raise UserError(f'--messages {opts.messages!r} must hold a non-empty JSON list of messages '
                            '(or {"messages": [...], "tools": [...]})')
    if opts.tools is not None:
        tools = _load_json(opts.tools, '--tools')
        if not isinstance(tools, list):
            raise UserError(f'--tools {opts.tools!r} must hold a JSON list of tool schemas')
    return messages, tools


def run(args) -> int:
    """Run the subcommand for parsed ``args``; return the exit code (errors raise ``UserError``, one line)."""
    opts = TemplateAuditOptions(tokenizer=args.tokenizer, messages=args.messages, tools=args.tools,
                                thinking=args.thinking)
    opts.validate()
    from ..templates import audit_template, load_tokenizer
    messages, tools = load_inputs(opts)
    tok = load_tokenizer(opts.tokenizer)
    report = audit_template(tok, messages, tools=tools, thinking=opts.thinking)
    print(printable(f'tokenizer: {opts.tokenizer} ({type(tok).__name__}, {len(tok)} tokens)  '
                    f'thinking: {"on" if opts.thinking else "off"}  messages: {len(messages)}  '
                    f'tools: {len(tools or [])}'))
    print(printable(report.format(), newlines=True))
    return 0
