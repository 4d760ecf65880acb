"""L5: the Anthropic Messages dialect (``POST /v1/messages``, ``/v1/messages/count_tokens``) over chat completions.

A Messages request becomes chat messages (:meth:`AnthropicMessages.to_chat`): ``system`` (a string or
text blocks) opens the conversation as a system message; a user message's ``tool_result`` blocks become
``tool`` messages (in block order, text blocks between them one user message); an assistant message's
``text`` blocks its content, its ``tool_use`` blocks its tool calls (the ids as given, the input as
JSON arguments) and its ``thinking`` block its ``reasoning_content``. The gateway signs each thinking
block it returns (:func:`thinking_signature`: the call's response id and a hash of its reasoning);
an echoed block whose signature names a call of the session gets that call's exact reasoning back, so
the branch continues the sampled ids with nothing noted. An ``image`` block (base64 source) in a user
message or a ``tool_result``'s content becomes an ``image_url`` part with its data URL. ``tools``
(``input_schema``) become function tools; ``tool_choice`` auto / any / tool / none becomes chat's
``auto`` / ``required`` / the named function / ``none``; ``thinking`` enabled / disabled sets the
template's ``enable_thinking`` (adaptive leaves the served default: the model decides),
``output_config.effort`` its ``reasoning_effort`` (each passed only to a template that reads it).
``max_tokens`` beyond the context is capped to the room left, as for every call
(:meth:`agentrl.gateway.service.Gateway.prepare`).

The reply is the chat response's message as content blocks (thinking, text, tool_use; a thinking
block's text left empty under ``thinking.display: "omitted"``, its signature kept), its
``stop_reason`` from the chat ``finish_reason`` and the stop string that cut the turn; a stream is
the Messages event sequence built from the completed response. ``count_tokens`` answers the prompt
length a call of the request would be planned with (:meth:`agentrl.gateway.service.Gateway.count_prompt`).
Errors are Anthropic's ``{"type": "error", "error": {"type", "message"}}`` with the same HTTP status.

Source: docs/gateway.md#anthropic-messages (the fields accepted, ignored and refused); the Anthropic
Messages API (request, response and streaming event formats), as the ``anthropic`` SDK and Claude
Code send and read them.
"""
from __future__ import annotations

import hashlib
import json

from ..images import IMAGE_TYPES
from .dialects import Dialect, sse_event
from .parse import message_deltas
from .protocol import GatewayError

__all__ = ['AnthropicMessages', 'ANTHROPIC', 'thinking_signature']

#: Top-level fields accepted and ignored: they change neither what is sampled nor what is recorded.
_IGNORED = {'model', 'metadata', 'cache_control', 'service_tier', 'speed', 'inference_geo', 'diagnostics',
            'context_management', 'container', 'user_profile_id', 'workspace_id'}
_OWN = {'messages', 'system', 'max_tokens', 'stop_sequences', 'temperature', 'top_p', 'top_k', 'tools',
        'tool_choice', 'thinking', 'output_config', 'mcp_servers', 'stream'}
#: Block fields accepted and ignored (prompt caching, citations: they change nothing rendered).
_BLOCK_IGNORED = {'cache_control', 'citations'}
#: HTTP status -> Anthropic's error type (other 5xx: ``api_error``; other 4xx: ``invalid_request_error``).
_ERROR_TYPES = {400: 'invalid_request_error', 401: 'authentication_error', 403: 'permission_error',
                404: 'not_found_error', 413: 'request_too_large', 429: 'rate_limit_error', 503: 'overloaded_error',
                529: 'overloaded_error'}


def _bad(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param)


def thinking_signature(response_id: str, reasoning: str) -> str:
    """The ``signature`` of the thinking block of chat response ``response_id`` whose reasoning is ``reasoning``.

    ``'RESPONSE_ID.'`` + 40 hex of sha256(response id, reasoning): it names the call (the gateway's
    response ids are ``chatcmpl-SID12-INDEX``) and identifies the reasoning it sampled.
    """
    digest = hashlib.sha256(f'{response_id}\n{reasoning}'.encode()).hexdigest()[:40]
    return f'{response_id}.{digest}'


def _signed_reasoning(session, signature) -> str | None:
    """The reasoning of the session's call a signature names, or None when it names none (or not exactly)."""
    if not isinstance(signature, str) or '.' not in signature:
        return None
    rid = signature.rsplit('.', 1)[0]
    index = rid.rsplit('-', 1)[-1]
    if not (index.isascii() and index.isdigit() and len(index) <= 9) or int(index) >= len(session.calls):
        return None
    response = session.calls[int(index)]['response']
    reasoning = response['choices'][0]['message'].get('reasoning_content')
    if response['id'] != rid or reasoning is None or thinking_signature(rid, reasoning) != signature:
        return None
    return reasoning


def _check_block(b, where: str, allowed: dict) -> str:
    """A content block's type, checked: a dict whose type is in ``allowed`` (type -> the fields it may have)."""
    kind = b.get('type') if isinstance(b, dict) else None
    if kind not in allowed:
        what = repr(kind) if isinstance(b, dict) else type(b).__name__
        raise _bad(f'{where}: block type {what} cannot be rendered; this gateway takes {", ".join(sorted(allowed))} '
                   'blocks here (it records text only: describe other input in text)', where)
    extra = sorted(set(b) - {'type'} - set(allowed[kind]) - _BLOCK_IGNORED)
    if extra:
        raise _bad(f'{where}.{extra[0]} cannot be honoured by this gateway; remove it', f'{where}.{extra[0]}')
    return kind


def _text(b: dict, where: str) -> str:
    if not isinstance(b.get('text'), str):
        raise _bad(f'{where}.text must be a string', f'{where}.text')
    return b['text']


def _image(b: dict, where: str) -> dict:
    """The chat ``image_url`` part of an ``image`` block whose source is base64 (``data:MEDIA;base64,DATA``).

    Raises:
        GatewayError: 400 naming ``where.source...``: a ``url`` or ``file`` source (the gateway fetches nothing:
            the record must hold the bytes the model saw), a media type other than PNG or JPEG, data not a string.
    """
    src = b.get('source')
    kind = src.get('type') if isinstance(src, dict) else None
    if kind in ('url', 'file'):
        raise _bad(f'{where}.source.type is {kind!r}: this gateway does not fetch images (the record must hold the '
                   'bytes the model saw); send {"type": "base64", "media_type": "image/png", "data": ...}',
                   f'{where}.source.type')
    if kind != 'base64':
        raise _bad(f'{where}.source must be {{"type": "base64", "media_type": "image/png", "data": ...}}',
                   f'{where}.source')
    media = src.get('media_type')
    if media not in IMAGE_TYPES:
        raise _bad(f'{where}.source.media_type is {media!r}; send one of {", ".join(sorted(IMAGE_TYPES))}',
                   f'{where}.source.media_type')
    if not isinstance(src.get('data'), str):
        raise _bad(f'{where}.source.data must be the base64 string of the image', f'{where}.source.data')
    return {'type': 'image_url', 'image_url': {'url': f'data:{media};base64,{src["data"]}'}}


def _text_parts(content, where: str, images: bool = False) -> list:
    """Chat parts of a string or a list of text blocks (and ``image`` blocks with ``images``: :func:`_image`)."""
    if isinstance(content, str):
        return [{'type': 'text', 'text': content}]
    if not isinstance(content, list):
        raise _bad(f'{where} must be a string or a list of text blocks, got {type(content).__name__}', where)
    out = []
    allowed = {'text': ('text',), 'image': ('source',)} if images else {'text': ('text',)}
    for j, b in enumerate(content):
        if _check_block(b, f'{where}[{j}]', allowed) == 'image':
            out.append(_image(b, f'{where}[{j}]'))
        else:
            out.append({'type': 'text', 'text': _text(b, f'{where}[{j}]')})
    return out


def _user(role: str, content, where: str) -> list:
    """Chat messages of a user (or system) message: its tool results as tool messages, its text between them."""
    blocks = [{'type': 'text', 'text': content}] if isinstance(content, str) else content
    if not isinstance(blocks, list):
        raise _bad(f'{where}.content must be a string or a list of content blocks', f'{where}.content')
    out, text = [], []
    allowed = {'text': ('text',), 'image': ('source',), 'tool_result': ('tool_use_id', 'content', 'is_error')} \
        if role == 'user' else {'text': ('text',)}
    for j, b in enumerate(blocks):
        at = f'{where}.content[{j}]'
        kind = _check_block(b, at, allowed)
        if kind in ('text', 'image'):
            text.append({'type': 'text', 'text': _text(b, at)} if kind == 'text' else _image(b, at))
            continue
        if text:
            out.append({'role': role, 'content': text})
            text = []
        if not isinstance(b.get('tool_use_id'), str) or not b['tool_use_id']:
            raise _bad(f'{at}.tool_use_id must be the id of the tool_use it answers', f'{at}.tool_use_id')
        out.append({'role': 'tool', 'tool_call_id': b['tool_use_id'],
                    'content': _text_parts(b.get('content', ''), f'{at}.content', images=True)})
    if text or not out:
        out.append({'role': role, 'content': text})
    return out


def _assistant(content, where: str, session) -> dict:
    """The chat assistant message of an echoed assistant message (a signed thinking block: that call's reasoning)."""
    blocks = [{'type': 'text', 'text': content}] if isinstance(content, str) else content
    if not isinstance(blocks, list):
        raise _bad(f'{where}.content must be a string or a list of content blocks', f'{where}.content')
    text, reasoning, calls = [], [], []
    allowed = {'text': ('text',), 'thinking': ('thinking', 'signature'), 'redacted_thinking': ('data',),
               'tool_use': ('id', 'name', 'input')}
    for j, b in enumerate(blocks):
        at = f'{where}.content[{j}]'
        kind = _check_block(b, at, allowed)
        if kind == 'text':
            text.append(_text(b, at))
        elif kind in ('thinking', 'redacted_thinking'):
            signed = _signed_reasoning(session, b.get('signature' if kind == 'thinking' else 'data'))
            if signed is not None:
                reasoning.append(signed)
            elif kind == 'thinking' and isinstance(b.get('thinking'), str):
                reasoning.append(b['thinking'])          # not ours: kept as sent (a redacted one is dropped)
        else:
            if not isinstance(b.get('name'), str) or not isinstance(b.get('input', {}), dict):
                raise _bad(f'{at} must be {{"type": "tool_use", "id", "name": str, "input": {{...}}}}', at)
            calls.append({'id': str(b.get('id', '')), 'type': 'function',
                          'function': {'name': b['name'],
                                       'arguments': json.dumps(b.get('input', {}), ensure_ascii=False)}})
    joined = ''.join(text)
    m = {'role': 'assistant', 'content': joined if (joined or not calls) else None}
    if reasoning:
        m['reasoning_content'] = ''.join(reasoning)
    if calls:
        m['tool_calls'] = calls
    return m


def _messages(body: dict, session) -> list:
    out = []
    system = body.get('system')
    if system is not None and system != '' and system != []:
        out.append({'role': 'system', 'content': _text_parts(system, 'system')})
    messages = body.get('messages')
    if not isinstance(messages, list) or not messages:
        raise _bad('messages must be a non-empty list of {"role": "user" | "assistant", "content"} objects',
                   'messages')
    for i, m in enumerate(messages):
        where = f'messages[{i}]'
        role = m.get('role') if isinstance(m, dict) else None
        if role not in ('user', 'assistant', 'system'):
            raise _bad(f'{where}.role is {role!r}; use "user" or "assistant"', f'{where}.role')
        extra = sorted(set(m) - {'role', 'content', 'output_config'})
        if extra:
            raise _bad(f'{where}.{extra[0]} cannot be honoured by this gateway; remove it', f'{where}.{extra[0]}')
        if role == 'assistant':
            out.append(_assistant(m.get('content', ''), where, session))
        else:
            out += _user(role, m.get('content', ''), where)
    if messages[-1]['role'] == 'assistant':
        raise _bad(f'messages[{len(messages) - 1}] is an assistant message (a prefill): the gateway samples the '
                   'next turn whole and cannot continue a given prefix; end with a user message', 'messages')
    return out


def _tools(tools) -> list | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise _bad(f'tools must be a list of tool objects, got {type(tools).__name__}', 'tools')
    out = []
    for i, t in enumerate(tools):
        where = f'tools[{i}]'
        if not isinstance(t, dict) or t.get('type', 'custom') not in ('custom', None):
            kind = t.get('type') if isinstance(t, dict) else type(t).__name__
            raise _bad(f'{where} is a {kind!r} tool: only client tools ({{"name", "description", "input_schema"}}) '
                       'can be sampled and recorded here; remove it', f'{where}.type')
        if t.get('strict'):
            raise _bad(f'{where}.strict=true cannot be honoured (no constrained decoding of tool inputs); remove it',
                       f'{where}.strict')
        extra = sorted(set(t) - {'type', 'name', 'description', 'input_schema', 'cache_control', 'strict',
                                 'defer_loading', 'eager_input_streaming', 'input_examples'})
        if extra:
            raise _bad(f'{where}.{extra[0]} cannot be honoured by this gateway; remove it', f'{where}.{extra[0]}')
        schema = t.get('input_schema')
        if not isinstance(t.get('name'), str) or not t['name'] or not isinstance(schema, dict):
            raise _bad(f'{where} must be {{"name": str, "description": str, "input_schema": {{"type": "object", '
                       '...}}}}', where)
        fn = {'name': t['name'], 'description': t.get('description', ''), 'parameters': schema}
        out.append({'type': 'function', 'function': fn})
    return out


def _tool_choice(choice):
    """Chat's ``tool_choice`` of an Anthropic one (None: absent)."""
    if choice is None:
        return None
    kind = choice.get('type') if isinstance(choice, dict) else None
    if kind not in ('auto', 'any', 'tool', 'none'):
        raise _bad(f'tool_choice must be {{"type": "auto" | "any" | "tool" | "none"}}, got {json.dumps(choice)[:60]}',
                   'tool_choice')
    if choice.get('disable_parallel_tool_use'):
        raise _bad('tool_choice.disable_parallel_tool_use=true cannot be honoured (the model may write several '
                   'calls and nothing constrains it to one); remove it', 'tool_choice.disable_parallel_tool_use')
    if kind == 'tool':
        if not isinstance(choice.get('name'), str) or not choice['name']:
            raise _bad('tool_choice.name must name one of the tools', 'tool_choice.name')
        return {'type': 'function', 'function': {'name': choice['name']}}
    return {'auto': 'auto', 'any': 'required', 'none': 'none'}[kind]


def _effort(config, where: str) -> str | None:
    """The ``effort`` of an ``output_config`` (None: none); its other settings cannot be honoured."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise _bad(f'{where} must be an object ({{"effort": ...}})', where)
    for k, v in config.items():
        if k != 'effort' and v is not None:
            raise _bad(f'{where}.{k} cannot be honoured (no constrained decoding); remove it', f'{where}.{k}')
    effort = config.get('effort')
    if effort is not None and not isinstance(effort, str):
        raise _bad(f'{where}.effort must be a string, got {json.dumps(effort)[:40]}', f'{where}.effort')
    return effort


def _template_kwargs(body: dict) -> dict:
    """``chat_template_kwargs`` of ``thinking`` and ``output_config`` (the request's, and any per message: the
    same effort, as one request renders under one set of template options)."""
    kw = {}
    thinking = body.get('thinking')
    if thinking is not None:
        kind = thinking.get('type') if isinstance(thinking, dict) else None
        if kind not in ('enabled', 'adaptive', 'disabled'):
            raise _bad(f'thinking must be {{"type": "enabled" | "adaptive" | "disabled"}}, got '
                       f'{json.dumps(thinking)[:60]}', 'thinking.type')
        extra = sorted(set(thinking) - {'type', 'budget_tokens', 'display'})
        if extra:
            raise _bad(f'thinking.{extra[0]} cannot be honoured by this gateway; remove it', f'thinking.{extra[0]}')
        if kind != 'adaptive':
            kw['enable_thinking'] = kind == 'enabled'
    effort = _effort(body.get('output_config'), 'output_config')
    for i, m in enumerate(body['messages']):
        where = f'messages[{i}].output_config'
        mine = _effort(m.get('output_config'), where)
        if mine is not None and effort is not None and mine != effort:
            raise _bad(f'{where}.effort={mine!r} differs from the request\'s ({effort!r}): a request renders '
                       'under one effort; send one', f'{where}.effort')
        effort = effort if mine is None else mine
    if effort is not None:
        kw['reasoning_effort'] = effort
    return kw


def _stop(body: dict) -> list:
    stops = body.get('stop_sequences')
    if stops is None:
        return []
    if not (isinstance(stops, list) and len(stops) <= 4 and all(isinstance(s, str) and s for s in stops)):
        raise _bad('stop_sequences must be a list of at most 4 non-empty strings', 'stop_sequences')
    return list(stops)


def _blocks(message: dict, response_id: str, shown: bool = True) -> list:
    """The content blocks of a chat assistant message: thinking (signed; its text left empty unless ``shown``),
    text, tool_use (non-empty ones only)."""
    out = []
    if message.get('reasoning_content'):
        r = message['reasoning_content']
        out.append({'type': 'thinking', 'thinking': r if shown else '',
                    'signature': thinking_signature(response_id, r)})
    if message.get('content'):
        out.append({'type': 'text', 'text': message['content']})
    for c in message.get('tool_calls') or ():
        out.append({'type': 'tool_use', 'id': c['id'], 'name': c['function']['name'],
                    'input': json.loads(c['function']['arguments'])})
    return out


def _shown(body: dict) -> bool:
    """Whether the request shows thinking text (``thinking.display`` other than ``"omitted"``)."""
    thinking = body.get('thinking')
    return not (isinstance(thinking, dict) and thinking.get('display') == 'omitted')


def _stop_reason(response: dict) -> tuple:
    """``(stop_reason, stop_sequence)`` of a chat response."""
    choice = response['choices'][0]
    reason = choice['finish_reason']
    if reason == 'length':
        return 'max_tokens', None
    if reason == 'tool_calls':
        return 'tool_use', None
    hit = choice.get('stop_reason')
    return ('stop_sequence', hit) if isinstance(hit, str) else ('end_turn', None)


class AnthropicMessages(Dialect):
    """The Anthropic Messages dialect (module docstring): ``/v1/messages`` under the session prefix.

    Paths: ``/v1/messages`` (a client whose base URL is the session URL without ``/v1``, as Claude
    Code and the ``anthropic`` SDK want it) and ``/v1/v1/messages`` (the SDK given the session's
    ``base_url`` as it is); :attr:`count_paths` the same with ``/count_tokens``.
    """
    name = 'anthropic'
    paths = ('/v1/messages', '/v1/v1/messages')
    count_paths = ('/v1/messages/count_tokens', '/v1/v1/messages/count_tokens')

    def to_chat(self, body: dict, session) -> dict:
        """The chat-completions body of a Messages request (module docstring; ``stream`` is left to the app).

        Raises:
            GatewayError: 400 naming the field: an unknown top-level field, a block this gateway cannot
                render (document, server tool results; an image whose source is a URL or a file, or not PNG/JPEG),
                a server tool, ``strict`` tools,
                ``disable_parallel_tool_use``, a thinking type other than enabled/adaptive/disabled,
                ``output_config.format``, non-empty ``mcp_servers``, an assistant message last (a prefill),
                more than 4 ``stop_sequences``.
        """
        unknown = sorted(set(body) - _IGNORED - _OWN)
        if unknown:
            raise _bad(f'unsupported field {unknown[0]!r}: this gateway cannot honour it; remove it', unknown[0])
        if body.get('mcp_servers'):
            raise _bad('mcp_servers cannot be honoured: the gateway calls no tools itself; run the MCP servers in the '
                       'harness', 'mcp_servers')
        chat = {'messages': _messages(body, session)}
        for k in ('max_tokens', 'temperature', 'top_p', 'top_k'):
            if body.get(k) is not None:
                chat[k] = body[k]
        stop = _stop(body)
        if stop:
            chat['stop'] = stop
        tools = _tools(body.get('tools'))
        if tools:
            chat['tools'] = tools
        choice = _tool_choice(body.get('tool_choice'))
        if choice is not None:
            chat['tool_choice'] = choice
        kw = _template_kwargs(body)
        if kw:
            chat['chat_template_kwargs'] = kw
        return chat

    def reply(self, response: dict, body: dict) -> dict:
        """The Messages reply: ``{"id", "type": "message", "role", "model", "content", "stop_reason",
        "stop_sequence", "usage": {"input_tokens", "output_tokens", ...}}`` (content: thinking, text, tool_use)."""
        reason, hit = _stop_reason(response)
        usage = response['usage']
        return {'id': 'msg_' + response['id'].split('-', 1)[-1], 'type': 'message', 'role': 'assistant',
                'model': response['model'],
                'content': _blocks(response['choices'][0]['message'], response['id'], _shown(body)),
                'stop_reason': reason, 'stop_sequence': hit,
                'usage': {'input_tokens': usage['prompt_tokens'], 'output_tokens': usage['completion_tokens'],
                          'cache_creation_input_tokens': 0, 'cache_read_input_tokens': 0}}

    def events(self, response: dict, body: dict) -> list:
        """The Messages stream of a completed response: ``message_start``, per block ``content_block_start``,
        its deltas (``thinking_delta`` + ``signature_delta``, ``text_delta``, ``input_json_delta``) and
        ``content_block_stop``, then ``message_delta`` (stop_reason, usage) and ``message_stop``. The
        deltas of a block concatenate to its text (tool_use: its input's JSON)."""
        whole = self.reply(response, body)
        head = dict(whole, content=[], stop_reason=None, stop_sequence=None,
                    usage=dict(whole['usage'], output_tokens=0))
        out = [sse_event({'type': 'message_start', 'message': head}, 'message_start')]
        blocks, k = whole['content'], -1

        def start(block):
            nonlocal k
            if k >= 0:
                stop()
            k += 1
            empty = {'thinking': {'thinking': '', 'signature': ''}, 'text': {'text': ''}, 'tool_use': {'input': {}}}
            first = dict({x: y for x, y in block.items() if x not in ('thinking', 'signature', 'text', 'input')},
                         **empty[block['type']])
            out.append(sse_event({'type': 'content_block_start', 'index': k, 'content_block': first},
                                 'content_block_start'))

        def delta(d):
            out.append(sse_event({'type': 'content_block_delta', 'index': k, 'delta': d}, 'content_block_delta'))

        def stop():
            if blocks[k]['type'] == 'thinking':
                delta({'type': 'signature_delta', 'signature': blocks[k]['signature']})
            out.append(sse_event({'type': 'content_block_stop', 'index': k}, 'content_block_stop'))

        for d in message_deltas(response['choices'][0]['message'])[1:]:
            if 'reasoning_content' in d:
                if k < 0 or blocks[k]['type'] != 'thinking':
                    start(blocks[k + 1])
                if blocks[k]['thinking']:                      # display "omitted": the signature only
                    delta({'type': 'thinking_delta', 'thinking': d['reasoning_content']})
            elif 'content' in d:
                if k < 0 or blocks[k]['type'] != 'text':
                    start(blocks[k + 1])
                delta({'type': 'text_delta', 'text': d['content']})
            else:
                call = d['tool_calls'][0]
                if 'id' in call:
                    start(blocks[k + 1])
                else:
                    delta({'type': 'input_json_delta', 'partial_json': call['function']['arguments']})
        if k >= 0:
            stop()
        out.append(sse_event({'type': 'message_delta', 'delta': {'stop_reason': whole['stop_reason'],
                                                                  'stop_sequence': whole['stop_sequence']},
                              'usage': whole['usage']}, 'message_delta'))
        out.append(sse_event({'type': 'message_stop'}, 'message_stop'))
        return out

    def error(self, e: GatewayError) -> dict:
        """``{"type": "error", "error": {"type", "message"}}``; the type from the HTTP status (400
        invalid_request_error, 404 not_found_error, 429 rate_limit_error, 503 overloaded_error, other 5xx
        api_error ...)."""
        kind = _ERROR_TYPES.get(e.status, 'api_error' if e.status >= 500 else 'invalid_request_error')
        return {'type': 'error', 'error': {'type': kind, 'message': e.message}}

    def counted(self, n: int) -> dict:
        """The ``count_tokens`` reply of a prompt of ``n`` tokens: ``{"input_tokens": n}``."""
        return {'input_tokens': n}


#: The instance the app serves (:data:`agentrl.gateway.app.DIALECTS`).
ANTHROPIC = AnthropicMessages()
