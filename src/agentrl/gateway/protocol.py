"""L5: the chat-completions request the gateway accepts, validated into :class:`ChatRequest`.

Every refusal is a :class:`GatewayError` (HTTP status + one OpenAI-style error message naming the
field); nothing is written for a refused request. Sampling fields map onto
:class:`agentrl.record.SamplingSpec`; a field the engine cannot honour is refused with 400
naming it, never ignored.

Source: the OpenAI chat-completions API (fields, error JSON ``{"error": {message, type, param,
code}}``); vLLM's extensions ``top_k``, ``min_p``, ``repetition_penalty``, ``return_token_ids``,
``chat_template_kwargs`` and its ``reasoning_effort`` values and mapping (:func:`template_options`).
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field

from ..record import SamplingSpec
from ..templates.chat import check_messages, function_tools
from .inputs import MAX_JSON_DEPTH, flag_problem, tool_calls_problem, tree_problem

__all__ = ['GatewayError', 'ChatRequest', 'parse_request', 'body_digest', 'error_body', 'REASONING_EFFORTS',
           'template_options', 'load_body']

#: Request fields accepted and ignored: they do not change what is sampled or recorded.
_IGNORED = {'model', 'user', 'metadata', 'store', 'parallel_tool_calls', 'stream_options', 'service_tier',
            'prompt_cache_key', 'safety_identifier'}
#: The ``reasoning_effort`` values vLLM accepts.
REASONING_EFFORTS = ('none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max')
#: ``chat_template_kwargs`` keys that are not template variables here: the template, tokenization and
#: the rendering options the gateway sets itself (vLLM refuses the first two too).
_NOT_TEMPLATE_KWARGS = ('chat_template', 'tokenize', 'tools', 'documents', 'add_generation_prompt',
                        'continue_final_message', 'stop_tokens', 'content_text')
_SAMPLING = {'temperature', 'top_p', 'top_k', 'min_p', 'presence_penalty', 'frequency_penalty',
             'repetition_penalty'}
_OWN = {'messages', 'tools', 'tool_choice', 'max_tokens', 'max_completion_tokens', 'stop', 'stream', 'seed', 'n',
        'logprobs', 'top_logprobs', 'return_token_ids', 'response_format', 'logit_bias', 'functions',
        'chat_template_kwargs', 'reasoning_effort', 'reasoning'}
#: The keys of an adapter's ``reasoning`` object the gateway maps (OpenRouter's and LiteLLM's form).
_REASONING_KEYS = ('effort', 'enabled')


class GatewayError(Exception):
    """A refused request: HTTP ``status``, one-line ``message``, OpenAI error ``type``, ``param``, ``code``."""

    def __init__(self, status: int, message: str, *, type: str = 'invalid_request_error', param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        """The OpenAI-style error JSON."""
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = 'invalid_request_error', param=None, code=None) -> dict:
    """``{"error": {"message", "type", "param", "code"}}``."""
    return {'error': {'message': message, 'type': type, 'param': param, 'code': code}}


def bad(message: str, param: str | None = None, status: int = 400, code: str | None = None) -> GatewayError:
    return GatewayError(status, message, param=param, code=code)


@dataclass
class ChatRequest:
    """A validated chat-completions request.

    Attributes:
        messages: checked messages (content parts flattened to text, but a user or tool message holding
            ``image_url`` parts keeps its parts: :func:`agentrl.templates.messages.image_parts`).
        tools: OpenAI function tools (``[{'type': 'function', 'function': {...}}]``) or None.
        tool_choice: ``'auto'``, ``'none'``, ``'required'`` or a named function
            ``{'type': 'function', 'function': {'name': N}}`` (N one of ``tools``): the last two are
            sampled under the family's call grammar (:meth:`agentrl.families.Family.call_grammar`).
        spec: the :class:`~agentrl.record.SamplingSpec`.
        max_tokens: the turn's token budget (None: the server's default).
        stop: stop strings (cut after the token that completes one; the string is not returned).
        stream, logprobs, return_token_ids: output options. seed: the sampling seed or None.
        chat_template_kwargs: the request's template options (a dict, ``{}`` when absent).
        reasoning_effort: one of :data:`REASONING_EFFORTS`, or None (also from ``reasoning.effort``).
        dialect: the wire dialect the call came in (``'chat'``; :mod:`agentrl.gateway.dialects`).
        reasoning_enabled: ``reasoning.enabled`` (an adapter's switch: False turns thinking off where the
            template has the switch), or None.
    """
    messages: list
    tools: list | None = None
    tool_choice: str | dict = 'auto'
    spec: SamplingSpec = field(default_factory=SamplingSpec)
    max_tokens: int | None = None
    stop: list = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    return_token_ids: bool = False
    seed: int | None = None
    chat_template_kwargs: dict = field(default_factory=dict)
    reasoning_effort: str | None = None
    dialect: str = 'chat'
    reasoning_enabled: bool | None = None

    @property
    def forced(self) -> str | None:
        """What ``tool_choice`` forces: ``'required'``, the named function's name, or None (auto / none)."""
        if isinstance(self.tool_choice, dict):
            return self.tool_choice['function']['name']
        return 'required' if self.tool_choice == 'required' else None

    @property
    def parses_calls(self) -> bool:
        """Whether the reply's call blocks become ``tool_calls``: only with ``tools`` and ``tool_choice`` not none
        (a request without tools gets the sampled text as ``content``)."""
        return self.tools is not None and self.tool_choice != 'none'

    def recorded(self) -> dict:
        """What the journal keeps of the request (enough to replay the session's state)."""
        out = {'messages': self.messages, 'tools': self.tools, 'tool_choice': self.tool_choice,
               'spec': self.spec.to_dict(), 'max_tokens': self.max_tokens, 'stop': self.stop, 'seed': self.seed}
        if self.chat_template_kwargs:
            out['chat_template_kwargs'] = self.chat_template_kwargs
        if self.reasoning_effort is not None:
            out['reasoning_effort'] = self.reasoning_effort
        if self.dialect != 'chat':
            out['dialect'] = self.dialect
        if self.reasoning_enabled is not None:
            out['reasoning_enabled'] = self.reasoning_enabled
        return out

    @classmethod
    def from_recorded(cls, d: dict) -> 'ChatRequest':
        """The inverse of :meth:`recorded` (output options off)."""
        return cls(messages=d['messages'], tools=d['tools'], tool_choice=d['tool_choice'],
                   spec=SamplingSpec.from_dict(d['spec']), max_tokens=d['max_tokens'], stop=d['stop'], seed=d['seed'],
                   chat_template_kwargs=dict(d.get('chat_template_kwargs') or {}),
                   reasoning_effort=d.get('reasoning_effort'), reasoning_enabled=d.get('reasoning_enabled'),
                   dialect=d.get('dialect', 'chat'))


def template_options(req: ChatRequest, reads) -> dict:
    """The template options a request renders under, mapped as vLLM maps them.

    ``reasoning_effort`` sets ``enable_thinking = effort != 'none'`` unless ``chat_template_kwargs``
    sets it, and is passed itself as ``reasoning_effort`` (gpt-oss renders ``Reasoning: high``);
    ``reasoning.enabled`` sets ``enable_thinking`` over the effort's; ``chat_template_kwargs`` are passed as
    given. Only variables the template reads are kept (vLLM drops the others too: they change nothing the
    template renders).

    Args:
        req: the parsed request. reads: the names the template's source reads (a container of str).

    Returns:
        ``{name: value}``, sorted by name (``{}`` for a request that sets none).

    Source: vLLM's chat-completions request (``build_chat_params``, ``resolve_chat_template_kwargs``).
    """
    opts = {}
    if req.reasoning_effort is not None:
        opts['reasoning_effort'] = req.reasoning_effort
        opts['enable_thinking'] = req.reasoning_effort != 'none'
    if req.reasoning_enabled is not None:
        opts['enable_thinking'] = req.reasoning_enabled
    opts.update(req.chat_template_kwargs)
    return {k: opts[k] for k in sorted(opts) if k in reads}


def body_digest(body: bytes, parsed=None) -> str:
    """sha256 hex of a request body's bytes (``parsed`` is accepted and unused).

    A marked retry is the SDK sending the same bytes again. The bytes are hashed, not a canonical
    re-serialization: ``json.dumps(sort_keys=True)`` of a 200-turn body cost 0.3 ms a call, the
    hash 0.015 ms (bench/RESULTS.md, "Recording gateway").
    """
    return hashlib.sha256(body).hexdigest()


def _number(body: dict, name: str, lo: float, hi: float, default, integer: bool = False):
    v = body.get(name)
    if v is None:
        return default
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if isinstance(v, bool) or not ok or not lo <= v <= hi:
        kind = 'an integer' if integer else 'a number'
        raise bad(f'{name} must be {kind} in [{lo}, {hi}], got {v!r}', name)
    return v


def _tools(body: dict) -> list | None:
    tools = body.get('tools')
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad(f'tools must be a list of tool objects, got {type(tools).__name__}', 'tools')
    for i, t in enumerate(tools):
        fn = t.get('function') if isinstance(t, dict) else None
        if not (isinstance(t, dict) and t.get('type', 'function') == 'function' and isinstance(fn, dict)
                and isinstance(fn.get('name'), str) and fn['name']):
            raise bad(f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., "parameters": {{...}}}}}}',
                      f'tools[{i}]')
        params = fn.get('parameters', {})
        if not isinstance(params, dict) or params.get('type', 'object') != 'object':
            raise bad(f'tools[{i}].function.parameters must be a JSON Schema object ({{"type": "object", ...}})',
                      f'tools[{i}].function.parameters')
    return function_tools(tools)


def _spec(body: dict) -> SamplingSpec:
    temperature = _number(body, 'temperature', 0, 2, 1.0)
    top_p = _number(body, 'top_p', 0, 1, 1.0)
    if top_p == 0:
        raise bad('top_p must be in (0, 1], got 0', 'top_p')
    presence = _number(body, 'presence_penalty', -2, 2, 0.0)
    frequency = _number(body, 'frequency_penalty', -2, 2, 0.0)
    return SamplingSpec(temperature=float(temperature), top_p=float(top_p),
                        top_k=max(0, _number(body, 'top_k', -1, 1 << 20, 0, integer=True)),
                        min_p=float(_number(body, 'min_p', 0, 0.999999, 0.0)),
                        repetition_penalty=float(_number(body, 'repetition_penalty', 1e-6, 1e6, 1.0)),
                        presence_penalty=float(presence), frequency_penalty=float(frequency),
                        penalty_semantics='vllm' if (presence or frequency) else 'transformers')


def _template_kwargs(body: dict) -> dict:
    kw = body.get('chat_template_kwargs')
    if kw is None:
        return {}
    if not isinstance(kw, dict):
        raise bad(f'chat_template_kwargs must be a JSON object of template options, got {type(kw).__name__}',
                  'chat_template_kwargs')
    for k in kw:
        if k in _NOT_TEMPLATE_KWARGS:
            raise bad(f'chat_template_kwargs.{k} cannot be honoured: the gateway renders with the template and '
                      'options it serves; remove it', f'chat_template_kwargs.{k}')
    return dict(kw)


def _effort(body: dict) -> str | None:
    e = body.get('reasoning_effort')
    if e is not None and e not in REASONING_EFFORTS:
        raise bad(f'reasoning_effort must be one of {", ".join(REASONING_EFFORTS)}, got {json.dumps(e)[:60]}',
                  'reasoning_effort')
    return e


def _reasoning(body: dict) -> tuple:
    """``(reasoning_effort, reasoning_enabled)`` of ``reasoning_effort`` and an adapter's ``reasoning`` object
    (``{"effort": ..., "enabled": ...}``, OpenRouter's / LiteLLM's form); 400 naming a key it cannot honour."""
    effort, r = _effort(body), body.get('reasoning')
    if r is None:
        return effort, None
    if not isinstance(r, dict):
        raise bad(f'reasoning must be a JSON object like {{"effort": "high", "enabled": true}}, got '
                  f'{type(r).__name__}', 'reasoning')
    extra = sorted(set(r) - set(_REASONING_KEYS))
    if extra:
        raise bad(f'reasoning.{extra[0]} cannot be honoured by this gateway; send only reasoning.effort and '
                  'reasoning.enabled', f'reasoning.{extra[0]}')
    e, on = r.get('effort'), r.get('enabled')
    if e is not None and e not in REASONING_EFFORTS:
        raise bad(f'reasoning.effort must be one of {", ".join(REASONING_EFFORTS)}, got {json.dumps(e)[:60]}',
                  'reasoning.effort')
    if e is not None and effort is not None and e != effort:
        raise bad(f'reasoning.effort={json.dumps(e)} differs from reasoning_effort={json.dumps(effort)}; send one',
                  'reasoning.effort')
    if on is not None and not isinstance(on, bool):
        raise bad(f'reasoning.enabled must be true or false, got {json.dumps(on)[:60]}', 'reasoning.enabled')
    kw = body.get('chat_template_kwargs')
    if on is not None and isinstance(kw, dict) and kw.get('enable_thinking', on) != on:
        raise bad(f'reasoning.enabled={json.dumps(on)} contradicts chat_template_kwargs.enable_thinking='
                  f'{json.dumps(kw["enable_thinking"])}; send one', 'reasoning.enabled')
    return (e if e is not None else effort), on


def _tool_choice(body: dict, tools: list | None):
    """``'auto'``, ``'none'``, ``'required'`` or ``{'type': 'function', 'function': {'name': N}}`` (N one of the
    tools); 400 for another value, or a forced call without tools to call."""
    choice = body.get('tool_choice', 'auto')
    if choice in ('auto', 'none'):
        return choice
    shown = json.dumps(choice)[:80]
    if isinstance(choice, dict):
        fn = choice.get('function')
        name = fn.get('name') if isinstance(fn, dict) else None
        if choice.get('type', 'function') != 'function' or not isinstance(name, str) or not name:
            raise bad(f'tool_choice={shown} is not a tool choice; use "auto", "none", "required" or '
                      '{"type": "function", "function": {"name": ...}}', 'tool_choice')
        choice = {'type': 'function', 'function': {'name': name}}
    elif choice != 'required':
        raise bad(f'tool_choice={shown} is not a tool choice; use "auto", "none", "required" or '
                  '{"type": "function", "function": {"name": ...}}', 'tool_choice')
    if not tools:
        raise bad(f'tool_choice={shown} forces a tool call, but the request has no tools; send tools or use "auto"',
                  'tool_choice')
    names = [t['function']['name'] for t in tools]
    if isinstance(choice, dict) and choice['function']['name'] not in names:
        raise bad(f'tool_choice names {choice["function"]["name"]!r}, which is not one of the tools '
                  f'({", ".join(names)}); name one of them', 'tool_choice')
    return choice


def _stop(body: dict) -> list:
    stop = body.get('stop')
    if stop is None:
        return []
    stop = [stop] if isinstance(stop, str) else stop
    if not (isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) and s for s in stop)):
        raise bad('stop must be a non-empty string or a list of at most 4 non-empty strings', 'stop')
    return list(stop)


def _checked(messages, known) -> list:
    """``check_messages`` of ``messages``, reusing the checked prefix ``known`` shares with them; image parts are
    kept (the gateway refuses them for a model without an image processor, :meth:`Gateway.take_images`)."""
    if not known or not isinstance(messages, list):
        return _with_calls(check_messages(messages, images=True))
    old, done = known
    k = min(len(old), len(messages))
    while k and old[:k] != messages[:k]:            # one C-level comparison in the common case
        k //= 2
    try:
        out = list(done[:k]) + check_messages(messages[k:], images=True)
    except ValueError:
        return _with_calls(check_messages(messages, images=True))    # the error names the message's index
    _raise(tool_calls_problem(out[k:], k))
    return out


def _with_calls(messages: list) -> list:
    _raise(tool_calls_problem(messages))
    return messages


def parse_request(raw: bytes, max_bytes: int, known: tuple | None = None) -> tuple:
    """Validate a request body: ``(ChatRequest, body dict)``.

    ``known``: ``(raw messages, checked messages)`` of an earlier request (the session's previous
    call): the prefix of ``messages`` equal to it is taken as checked (one list comparison), so
    only the new messages are validated (each message is checked on its own).

    Raises:
        GatewayError: 413 for a body over ``max_bytes``; 400 for malformed JSON, a missing or bad
            ``messages`` (unknown role: the message names the index), bad tools, a sampling field
            out of range, ``n != 1``, ``top_logprobs``, ``logit_bias``, a ``response_format`` other
            than text, ``chat_template_kwargs`` that is not an object or sets the template or a rendering
            option the gateway sets (``tools``, ``add_generation_prompt`` ...), a ``reasoning_effort``
            outside :data:`REASONING_EFFORTS` (or a ``reasoning`` object with another key, or contradicting
            them), a ``tool_choice`` other than auto/none/required/a named function of ``tools`` (or
            required / named without tools), a last message from the assistant,
            or an unknown field (each message names the field).
    """
    if len(raw) > max_bytes:
        raise GatewayError(413, f'request body is {len(raw)} bytes, over the limit of {max_bytes}; send a shorter '
                                'history', code='body_too_large')
    body = load_body(raw, 'a JSON object', empty=False)
    if not isinstance(body, dict):
        raise bad(f'request body must be a JSON object, got {type(body).__name__}')
    unknown = sorted(set(body) - _IGNORED - _SAMPLING - _OWN)
    if unknown:
        raise bad(f'unsupported field {unknown[0]!r}: this gateway cannot honour it; remove it', unknown[0])
    for name, ok in (('n', lambda v: v == 1), ('logit_bias', lambda v: not v), ('functions', lambda v: not v),
                     ('top_logprobs', lambda v: not v),
                     ('response_format', lambda v: isinstance(v, dict) and v.get('type') == 'text')):
        if body.get(name) is not None and not ok(body[name]):
            raise bad(f'{name}={json.dumps(body[name])[:60]} cannot be honoured by this engine; remove it', name)
    if 'messages' not in body:
        raise bad('messages is missing: send the conversation as "messages"', 'messages')
    try:
        messages = _checked(body['messages'], known)
    except ValueError as e:
        raise bad(str(e), 'messages') from None
    if not messages:
        raise bad('messages is empty: send at least one message', 'messages')
    if messages[-1]['role'] == 'assistant':
        raise bad(f'messages[{len(messages) - 1}] is an assistant message: the gateway samples the next assistant '
                  'turn; end the conversation with a user, tool or system message', 'messages')
    tools = _tools(body)
    choice = _tool_choice(body, tools)
    try:
        spec = _spec(body)
    except ValueError as e:
        raise bad(str(e)) from None
    max_tokens = body.get('max_completion_tokens', body.get('max_tokens'))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise bad(f'max_tokens must be an integer >= 1, got {max_tokens!r}', 'max_tokens')
    seed = body.get('seed')
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad(f'seed must be an integer, got {seed!r}', 'seed')
    opts = _options(body)
    effort, enabled = _reasoning(body)
    return ChatRequest(messages=messages, tools=tools, tool_choice=choice, spec=spec, max_tokens=max_tokens,
                       stop=_stop(body), stream=body.get('stream') is True,
                       include_usage=opts.get('include_usage') is True,
                       logprobs=body.get('logprobs') is True, return_token_ids=body.get('return_token_ids') is True,
                       seed=None if seed is None else int(seed) & ((1 << 63) - 1),
                       chat_template_kwargs=_template_kwargs(body), reasoning_effort=effort,
                       reasoning_enabled=enabled), body


#: The boolean fields of a request (true, false or null; anything else is refused naming the field).
_FLAGS = ('stream', 'logprobs', 'return_token_ids', 'parallel_tool_calls', 'store')


def _raise(problem: tuple | None) -> None:
    if problem is not None:
        raise bad(problem[1], problem[0])


def _options(body: dict) -> dict:
    """The booleans checked (:data:`_FLAGS`), then ``stream_options`` (an object with a boolean ``include_usage``)."""
    for name in _FLAGS:
        _raise(flag_problem(body, name))
    opts = body.get('stream_options')
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise bad(f'stream_options must be an object {{"include_usage": true}}, got {type(opts).__name__}',
                  'stream_options')
    _raise(flag_problem(opts, 'include_usage', 'stream_options.include_usage'))
    return opts


def load_body(raw: bytes, hint: str, empty: bool = True):
    """Parse a request body: JSON nested at most ``MAX_JSON_DEPTH`` levels, every string valid Unicode.

    Args:
        raw: the body's bytes. hint: what to send instead, for the messages (``'a JSON object'``).
        empty: a blank body is ``{}`` (else it is refused as not JSON).

    Raises:
        GatewayError: 400 naming the request body (not JSON, nested deeper than the bound or than the
            parser's stack, an integer of more digits than Python parses) or the field holding a lone
            surrogate (``messages[0].content``); the message never quotes the parser's exception.

    Source: docs/design.md#bounds (:data:`agentrl.gateway.inputs.MAX_JSON_DEPTH`).
    """
    if empty and not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except RecursionError:
        raise bad(f'request body nests lists and objects too deep to parse; send {hint} nested at most '
                  f'{MAX_JSON_DEPTH} levels (docs/design.md#bounds)') from None
    except ValueError as e:
        if 'integer string conversion' in str(e):
            raise bad(f'request body holds an integer of more than {sys.get_int_max_str_digits()} digits; send '
                      f'{hint} with numbers of ordinary size') from None
        if isinstance(e, json.JSONDecodeError):
            raise bad(f'request body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); send '
                      f'{hint}') from None
        raise bad(f'request body is not valid JSON (not UTF-8, UTF-16 or UTF-32 text); send {hint}') from None
    _raise(tree_problem(body))
    return body
