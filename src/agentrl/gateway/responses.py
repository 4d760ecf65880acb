"""L5: the OpenAI Responses dialect (``POST {base_url}/responses``) over the gateway's chat-completions calls.

A Responses request (``input`` items, ``instructions``, function and namespace ``tools``) becomes the
chat messages the gateway serves (:meth:`Responses.to_chat`); the sampled assistant message comes
back as a Response object (``output``: a ``reasoning`` item, a ``message`` item, ``function_call``
items) or as the Responses server-sent events, built once the call is journalled.

Input items map to chat messages: ``message`` (roles user/system/assistant; ``developer`` as
system), ``function_call`` (an assistant tool call), ``function_call_output`` (a tool message),
``reasoning`` (the assistant turn's ``reasoning_content``). An ``input_image`` part (its ``image_url`` a
data URL) of a user message or of a ``function_call_output``'s ``output`` list becomes an ``image_url``
part. Consecutive reasoning, assistant-message
and function-call items form one assistant turn, so an echoed output extends its branch exactly as
a chat-completions echo does. ``instructions`` is a system message first.

Reasoning round trip without server state (``store: false`` + ``include:
["reasoning.encrypted_content"]``, Codex CLI's default): a reasoning item's ``encrypted_content``
is ``agentrl.{call}.{digest}`` with digest = sha256 of the session id, the call index and the
reasoning text. Echoed back, it is checked against the session's own call (a value from another
session or an edited one is refused with 400 naming the item) and restores the call's exact
``reasoning_content``. ``store`` (default true) keeps each response's conversation in memory per
session (bounded) so a later ``previous_response_id`` prepends it.

Namespace tools (Codex's ``multi_agent_v1``) are flattened to chat tools named ``NAMESPACE__NAME``;
calls of them go back as ``function_call`` items with ``name`` and ``namespace``. Tools the server
would run (``web_search``, ``file_search``, ``code_interpreter``, ...) are dropped: a local model
cannot run them.

Source: docs/gateway.md#openai-responses; the OpenAI Responses API (request fields, output items,
streaming events), and what Codex CLI 0.171.0 sends (/work/shared/spec/dialects.md).
"""
from __future__ import annotations

import hashlib
import hmac
import itertools
import json
from collections import OrderedDict

from .dialects import Dialect, sse_event
from .protocol import GatewayError, error_body

__all__ = ['Responses', 'RESPONSES', 'DROPPED_TOOLS', 'IGNORED_FIELDS', 'seal']

#: Tool types the server runs on OpenAI's side: accepted and dropped (the model is not shown them).
DROPPED_TOOLS = ('web_search', 'web_search_preview', 'web_search_preview_2025_03_11', 'file_search',
                 'code_interpreter', 'image_generation', 'computer_use_preview', 'computer_use', 'mcp',
                 'tool_search')
#: Request fields accepted and ignored: they do not change what is sampled or recorded.
IGNORED_FIELDS = ('model', 'stream', 'stream_options', 'store', 'include', 'metadata', 'user', 'client_metadata',
                  'prompt_cache_key', 'prompt_cache_retention', 'safety_identifier', 'service_tier', 'truncation',
                  'parallel_tool_calls', 'background')
_MAPPED = ('input', 'instructions', 'tools', 'tool_choice', 'max_output_tokens', 'temperature', 'top_p', 'reasoning',
           'previous_response_id', 'text', 'seed', 'top_logprobs', 'max_tool_calls', 'conversation', 'prompt')
#: chat-completions field -> the Responses field a chat-level refusal is about
_PARAMS = {'messages': 'input', 'max_tokens': 'max_output_tokens', 'reasoning_effort': 'reasoning.effort',
           'tools': 'tools'}
_STASH = object()                 # the key of the request's own state in its body dict (never a JSON key)
_PER_SESSION, _SESSIONS = 256, 4096


def _bad(message: str, param: str | None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def _digest(*parts) -> str:
    return hashlib.sha256('/'.join(str(p) for p in parts).encode()).hexdigest()


def seal(sid: str, call: int, reasoning: str) -> str:
    """The ``encrypted_content`` of call ``call``'s reasoning in session ``sid``: ``agentrl.{call}.{32 hex}``."""
    return f'agentrl.{call}.{_digest(sid, call, reasoning)[:32]}'


def _text_parts(content, where: str, kinds=('input_text', 'output_text', 'text'), images: bool = False):
    """The text of a string or a list of text parts; with ``images``, a list holding ``input_image`` parts
    becomes chat parts (text, and ``image_url`` of each image's data URL: :func:`_image`)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f'{where} must be a string or a list of content parts, got {type(content).__name__}', where)
    out, parts = [], []
    for j, part in enumerate(content):
        kind = part.get('type') if isinstance(part, dict) else None
        if kind in kinds and isinstance(part.get('text'), str):
            out.append(part['text'])
            parts.append({'type': 'text', 'text': part['text']})
        elif kind == 'input_image' and images:
            parts.append(_image(part, f'{where}[{j}]'))
        else:
            also = ' and input_image' if images else ''
            raise _bad(f'{where}[{j}] is a {kind!r} part: agentrl records text{also} only here; send parts of type '
                       f'{", ".join(kinds)}{also}', f'{where}[{j}]')
    return parts if len(parts) > len(out) else ''.join(out)


def _image(part: dict, where: str) -> dict:
    """The chat ``image_url`` part of an ``input_image`` part whose ``image_url`` is a data URL.

    Raises:
        GatewayError: 400 naming ``where``: a ``file_id`` image, or an ``image_url`` that is an http(s) URL
            (the gateway fetches nothing: the record must hold the bytes the model saw) or not a data URL.
    """
    url = part.get('image_url')
    if part.get('file_id') is not None or not isinstance(url, str):
        raise _bad(f'{where} is an input_image without an image_url data URL (a file_id is not fetched); send '
                   'image_url "data:image/png;base64,..."', f'{where}.image_url')
    if not url.startswith('data:'):
        raise _bad(f'{where}.image_url is not a data URL: this gateway does not fetch images (the record must hold '
                   'the bytes the model saw); send "data:image/png;base64,..."', f'{where}.image_url')
    return {'type': 'image_url', 'image_url': {'url': url}}


def _chat_tools(tools) -> tuple:
    """``(chat tools or None, {chat name: (namespace, name)} of namespaced functions)``."""
    if tools is None:
        return None, {}
    if not isinstance(tools, list):
        raise _bad(f'tools must be a list of tool objects, got {type(tools).__name__}', 'tools')
    out, spaced = [], {}

    def function(t, where, ns=None):
        if not (isinstance(t.get('name'), str) and t['name']):
            raise _bad(f'{where} must be {{"type": "function", "name": ..., "parameters": {{...}}}}', where)
        name = f'{ns}__{t["name"]}' if ns else t['name']
        if ns:
            spaced[name] = (ns, t['name'])
        fn = {'name': name, 'description': t.get('description') or '',
              'parameters': t.get('parameters') or {'type': 'object', 'properties': {}}}
        out.append({'type': 'function', 'function': fn})

    for i, t in enumerate(tools):
        kind = t.get('type') if isinstance(t, dict) else None
        if kind == 'function':
            function(t, f'tools[{i}]')
        elif kind == 'namespace':
            if not (isinstance(t.get('name'), str) and t['name'] and isinstance(t.get('tools'), list)):
                raise _bad(f'tools[{i}] must be {{"type": "namespace", "name": ..., "tools": [...]}}', f'tools[{i}]')
            for j, u in enumerate(t['tools']):
                if not (isinstance(u, dict) and u.get('type', 'function') == 'function'):
                    raise _bad(f'tools[{i}].tools[{j}] must be a function tool', f'tools[{i}].tools[{j}]')
                function(u, f'tools[{i}].tools[{j}]', t['name'])
        elif kind in DROPPED_TOOLS:
            continue
        else:
            raise _bad(f'tools[{i}] has type {kind!r}, which this gateway cannot serve; send function or namespace '
                       f'tools (server tools {", ".join(DROPPED_TOOLS[:3])}... are dropped)', f'tools[{i}].type')
    names = [t['function']['name'] for t in out]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise _bad(f'tools: two tools are named {dup!r}; give each function its own name', 'tools')
    return out or None, spaced


def _tool_choice(choice, spaced: dict):
    if choice is None or choice in ('auto', 'none', 'required'):
        return choice
    if isinstance(choice, dict) and choice.get('type') == 'function' and isinstance(choice.get('name'), str):
        name = f'{choice["namespace"]}__{choice["name"]}' if choice.get('namespace') else choice['name']
        return {'type': 'function', 'function': {'name': name}}
    raise _bad(f'tool_choice={json.dumps(choice)[:80]} cannot be honoured; use "auto", "none", "required" or '
               '{"type": "function", "name": ...}', 'tool_choice')


class _Turn:
    """The assistant turn being assembled from consecutive output items."""

    def __init__(self):
        self.reasoning, self.content, self.calls, self.any = None, None, [], False

    def message(self) -> dict:
        m = {'role': 'assistant', 'content': self.content if (self.content or not self.calls) else None}
        if self.reasoning is not None:
            m['reasoning_content'] = self.reasoning
        if self.calls:
            m['tool_calls'] = self.calls
        return m


class Responses(Dialect):
    """The OpenAI Responses dialect (see the module docstring; fields: docs/gateway.md#openai-responses).

    Attributes:
        stored: ``{session id: OrderedDict(response id -> chat messages)}`` of the responses made with
            ``store`` (in memory; at most 256 per session and 4096 sessions, oldest dropped first).
    """
    name = 'responses'
    paths = ('/v1/responses', '/responses')

    def __init__(self):
        self.stored: OrderedDict = OrderedDict()

    # ------------------------------------------------------------------ request
    def to_chat(self, body: dict, session) -> dict:
        """The chat-completions body of a Responses request (see :meth:`Dialect.to_chat`).

        Raises:
            GatewayError: 400 naming the field: an unknown field, an input item or content part it
                cannot render (images, ``item_reference``...), a reasoning item whose
                ``encrypted_content`` is not this session's, an unknown ``previous_response_id``, a
                tool kind it cannot serve, ``text.format`` other than text, ``background``,
                ``conversation``, ``prompt``, ``max_tool_calls``, ``top_logprobs``.
        """
        unknown = sorted(set(body) - set(IGNORED_FIELDS) - set(_MAPPED))
        if unknown:
            raise _bad(f'unsupported field {unknown[0]!r}: this gateway cannot honour it; remove it', unknown[0])
        for name in ('background', 'conversation', 'prompt', 'max_tool_calls', 'top_logprobs'):
            if body.get(name):
                raise _bad(f'{name}={json.dumps(body[name])[:60]} cannot be honoured by this gateway; remove it', name)
        if body.get('text') is not None and not isinstance(body['text'], dict):
            raise _bad('text must be an object {"format": {"type": "text"}}', 'text')
        fmt = (body.get('text') or {}).get('format')
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get('type') == 'text'):
            raise _bad(f'text.format={json.dumps(fmt)[:60]} cannot be honoured (no constrained decoding); use '
                       '{"type": "text"} or remove it', 'text.format')
        tools, spaced = _chat_tools(body.get('tools'))
        messages = []
        if body.get('instructions') is not None:
            if not isinstance(body['instructions'], str):
                raise _bad('instructions must be a string', 'instructions')
            messages.append({'role': 'system', 'content': body['instructions']})
        prev = body.get('previous_response_id')
        if prev is not None:
            old = self.stored.get(session.sid, {}).get(prev) if isinstance(prev, str) else None
            if old is None:
                raise _bad(f'previous_response_id {json.dumps(prev)[:60]} is not a stored response of this session '
                           '(responses are kept in memory with store=true); send the whole input instead',
                           'previous_response_id', 'previous_response_not_found')
            messages += old
        own = self.input_messages(body.get('input'), session, spaced)
        messages += own
        if not messages:
            raise _bad('input is empty: send at least one message', 'input')
        if messages[-1]['role'] == 'assistant':
            raise _bad('input ends with an assistant item: the gateway samples the next assistant turn; end with a '
                       'user message or a function_call_output', 'input')
        chat = {'messages': messages}
        if tools is not None:
            chat['tools'] = tools
        choice = _tool_choice(body.get('tool_choice'), spaced)
        if choice is not None:
            chat['tool_choice'] = choice
        if body.get('max_output_tokens') is not None:
            v = body['max_output_tokens']
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise _bad(f'max_output_tokens must be an integer >= 1, got {v!r}', 'max_output_tokens')
            chat['max_tokens'] = v
        for name in ('temperature', 'top_p', 'seed'):
            if body.get(name) is not None:
                chat[name] = body[name]
        reasoning = body.get('reasoning')
        if reasoning is not None and not isinstance(reasoning, dict):
            raise _bad('reasoning must be an object {"effort", "summary"}', 'reasoning')
        if (reasoning or {}).get('effort') is not None:
            chat['reasoning_effort'] = reasoning['effort']
        body[_STASH] = (session, [m for m in messages if not (body.get('instructions') is not None and m is
                                                              messages[0])], spaced)
        return chat

    def input_messages(self, items, session, spaced: dict) -> list:
        """The chat messages of a request's ``input`` (a string, or a list of items).

        Raises:
            GatewayError: 400 naming ``input[i]`` for an item it cannot map.
        """
        if isinstance(items, str):
            return [{'role': 'user', 'content': items}]
        if items is None:
            return []
        if not isinstance(items, list):
            raise _bad(f'input must be a string or a list of items, got {type(items).__name__}', 'input')
        out, turn = [], _Turn()

        def flush():
            nonlocal turn
            if turn.any:
                out.append(turn.message())
            turn = _Turn()
        for i, it in enumerate(items):
            where = f'input[{i}]'
            if not isinstance(it, dict):
                raise _bad(f'{where} must be an item object, got {type(it).__name__}', where)
            kind = it.get('type', 'message' if 'role' in it else None)
            if kind == 'message':
                role = it.get('role')
                if role not in ('user', 'system', 'developer', 'assistant'):
                    raise _bad(f'{where}.role is {role!r}; use user, system, developer or assistant', f'{where}.role')
                text = _text_parts(it.get('content', ''), f'{where}.content', images=role == 'user')
                if role == 'assistant':
                    if turn.content is not None or turn.calls:
                        flush()
                    turn.content, turn.any = text, True
                else:
                    flush()
                    out.append({'role': 'system' if role == 'developer' else role, 'content': text})
            elif kind == 'function_call':
                if not all(isinstance(it.get(k), str) for k in ('call_id', 'name', 'arguments')):
                    raise _bad(f'{where} must be {{"type": "function_call", "call_id", "name", "arguments"}} with '
                               'string values', where)
                name = f'{it["namespace"]}__{it["name"]}' if it.get('namespace') else it['name']
                turn.calls.append({'id': it['call_id'], 'type': 'function',
                                   'function': {'name': name, 'arguments': it['arguments']}})
                turn.any = True
            elif kind == 'function_call_output':
                if not isinstance(it.get('call_id'), str):
                    raise _bad(f'{where}.call_id must be a string', f'{where}.call_id')
                flush()
                out.append({'role': 'tool', 'tool_call_id': it['call_id'],
                            'content': _text_parts(it.get('output', ''), f'{where}.output', ('input_text', 'text',
                                                                                              'output_text'), True)})
            elif kind == 'reasoning':
                if turn.any:
                    flush()
                turn.reasoning, turn.any = self.reasoning_text(it, session, where), True
            else:
                raise _bad(f'{where} has type {kind!r}, which this gateway cannot map; send message, function_call, '
                           'function_call_output or reasoning items', f'{where}.type')
        flush()
        return out

    @staticmethod
    def reasoning_text(item: dict, session, where: str):
        """The reasoning text of an echoed ``reasoning`` item: the session's own call's text when it carries
        ``encrypted_content`` (verified), else its ``content`` (reasoning_text parts), else its summary text,
        else None (reasoning dropped).

        Raises:
            GatewayError: 400 naming ``input[i].encrypted_content`` when it is not a value this session handed out.
        """
        sealed = item.get('encrypted_content')
        if sealed is not None:
            parts = sealed.split('.') if isinstance(sealed, str) else []
            plain = len(parts) == 3 and parts[0] == 'agentrl' and parts[1].isascii() and parts[1].isdigit()
            call = int(parts[1]) if plain and len(parts[1]) <= 9 else -1
            msg = session.calls[call]['response']['choices'][0]['message'] if 0 <= call < len(session.calls) else {}
            text = msg.get('reasoning_content')
            if text is None or not hmac.compare_digest(seal(session.sid, call, text).encode(),
                                                       sealed.encode('utf-8', 'surrogatepass')):
                raise _bad(f'{where}.encrypted_content is not a reasoning item this session returned (from another '
                           'session, another gateway run, or edited); send the item as it was returned, or drop it',
                           f'{where}.encrypted_content', 'invalid_encrypted_content')
            return text
        if item.get('content'):
            return _text_parts(item['content'], f'{where}.content', ('reasoning_text', 'text'))
        if item.get('summary'):
            return _text_parts(item['summary'], f'{where}.summary', ('summary_text',))
        return None

    # ------------------------------------------------------------------ reply
    def reply(self, response: dict, body: dict) -> dict:
        """The Response object of a chat-completions ``response`` (see :meth:`Dialect.reply`); with
        ``store`` (default true) its conversation is kept for ``previous_response_id``."""
        session, messages, spaced = body.get(_STASH, (None, [], {}))
        call = next((c['index'] for c in reversed(session.calls) if c['response'] is response), None) \
            if session is not None else None
        choice = response['choices'][0]
        msg = choice['message']
        h = _digest(response['id'])[:32]
        rid = f'resp_{h}'
        output = []
        if msg.get('reasoning_content') is not None:
            r = msg['reasoning_content']
            summary = [{'type': 'summary_text', 'text': r}] if (body.get('reasoning') or {}).get('summary') else []
            include = body.get('include') or ()
            sealed = seal(session.sid, call, r) if 'reasoning.encrypted_content' in include and call is not None \
                else None
            output.append({'type': 'reasoning', 'id': f'rs_{h}', 'summary': summary,
                           'content': [{'type': 'reasoning_text', 'text': r}], 'encrypted_content': sealed,
                           'status': 'completed'})
        if msg.get('content') or not msg.get('tool_calls'):
            output.append({'type': 'message', 'id': f'msg_{h}', 'status': 'completed', 'role': 'assistant',
                           'content': [{'type': 'output_text', 'text': msg.get('content') or '', 'annotations': [],
                                        'logprobs': []}]})
        for k, c in enumerate(msg.get('tool_calls') or ()):
            name = c['function']['name']
            item = {'type': 'function_call', 'id': f'fc_{h}_{k}', 'call_id': c['id'], 'name': name,
                    'arguments': c['function']['arguments'], 'status': 'completed'}
            if name in spaced:
                item['namespace'], item['name'] = spaced[name]
            output.append(item)
        u = response['usage']
        truncated = choice['finish_reason'] == 'length'
        reasoning = body.get('reasoning') if isinstance(body.get('reasoning'), dict) else {}
        obj = {'id': rid, 'object': 'response', 'created_at': response['created'],
               'status': 'incomplete' if truncated else 'completed', 'error': None,
               'incomplete_details': {'reason': 'max_output_tokens'} if truncated else None,
               'instructions': body.get('instructions'), 'max_output_tokens': body.get('max_output_tokens'),
               'model': response['model'], 'output': output,
               'parallel_tool_calls': body.get('parallel_tool_calls', True),
               'previous_response_id': body.get('previous_response_id'),
               'reasoning': {'effort': reasoning.get('effort'), 'summary': reasoning.get('summary')},
               'store': body.get('store', True) is not False, 'temperature': body.get('temperature', 1.0),
               'text': {'format': {'type': 'text'}}, 'tool_choice': body.get('tool_choice', 'auto'),
               'tools': body.get('tools') or [], 'top_p': body.get('top_p', 1.0),
               'truncation': body.get('truncation', 'disabled'),
               'usage': {'input_tokens': u['prompt_tokens'], 'input_tokens_details': {'cached_tokens': 0},
                         'output_tokens': u['completion_tokens'], 'output_tokens_details': {'reasoning_tokens': 0},
                         'total_tokens': u['total_tokens']},
               'metadata': body.get('metadata') or {}, 'user': body.get('user')}
        if session is not None and obj['store']:
            kept = self.stored.setdefault(session.sid, OrderedDict())
            self.stored.move_to_end(session.sid)
            kept[rid] = messages + [msg]
            while len(kept) > _PER_SESSION:
                kept.popitem(last=False)
            while len(self.stored) > _SESSIONS:
                self.stored.popitem(last=False)
        return obj

    def events(self, response: dict, body: dict) -> list:
        """The Responses stream of a completed ``response`` (see :meth:`Dialect.events`): ``response.created``,
        ``response.in_progress``, per output item its added/delta/done events, then ``response.completed``
        (``response.incomplete`` for a turn cut at its budget); each event ``event: TYPE`` + ``data:`` with a
        ``sequence_number``."""
        obj = self.reply(response, body)
        seq = itertools.count()

        def ev(kind, **data):
            return sse_event({'type': kind, 'sequence_number': next(seq), **data}, kind)
        start = dict(obj, status='in_progress', output=[], usage=None, incomplete_details=None)
        out = [ev('response.created', response=start), ev('response.in_progress', response=start)]
        for i, item in enumerate(obj['output']):
            at = {'item_id': item['id'], 'output_index': i}
            if item['type'] == 'message':
                out.append(ev('response.output_item.added', output_index=i,
                              item=dict(item, status='in_progress', content=[])))
                for j, part in enumerate(item['content']):
                    out.append(ev('response.content_part.added', **at, content_index=j, part=dict(part, text='')))
                    out.append(ev('response.output_text.delta', **at, content_index=j, delta=part['text'],
                                  logprobs=[]))
                    out.append(ev('response.output_text.done', **at, content_index=j, text=part['text'], logprobs=[]))
                    out.append(ev('response.content_part.done', **at, content_index=j, part=part))
            elif item['type'] == 'function_call':
                out.append(ev('response.output_item.added', output_index=i,
                              item=dict(item, status='in_progress', arguments='')))
                out.append(ev('response.function_call_arguments.delta', **at, delta=item['arguments']))
                out.append(ev('response.function_call_arguments.done', **at, name=item['name'],
                              arguments=item['arguments']))
            else:
                out.append(ev('response.output_item.added', output_index=i,
                              item=dict(item, status='in_progress', summary=[], content=[], encrypted_content=None)))
                for j, part in enumerate(item['summary']):
                    out.append(ev('response.reasoning_summary_part.added', **at, summary_index=j,
                                  part=dict(part, text='')))
                    out.append(ev('response.reasoning_summary_text.delta', **at, summary_index=j, delta=part['text']))
                    out.append(ev('response.reasoning_summary_text.done', **at, summary_index=j, text=part['text']))
                    out.append(ev('response.reasoning_summary_part.done', **at, summary_index=j, part=part))
                for j, part in enumerate(item['content']):
                    out.append(ev('response.reasoning_text.delta', **at, content_index=j, delta=part['text']))
                    out.append(ev('response.reasoning_text.done', **at, content_index=j, text=part['text']))
            out.append(ev('response.output_item.done', output_index=i, item=item))
        out.append(ev('response.completed' if obj['status'] == 'completed' else 'response.incomplete', response=obj))
        return out

    def error(self, e: GatewayError) -> dict:
        """OpenAI's error JSON, its ``param`` named as the Responses field (``messages`` -> ``input``...)."""
        param = e.param
        if isinstance(param, str) and (param.startswith(('messages', 'max_tokens', 'reasoning_effort'))
                                       or param.startswith('tools[') and '.function' in param):
            param = _PARAMS[param.split('[')[0].split('.')[0]]      # a chat field: its index is not the input's
        return error_body(e.message, e.type, param, e.code)


#: The instance the app serves (:data:`agentrl.gateway.app.DIALECTS`).
RESPONSES = Responses()
