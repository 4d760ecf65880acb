"""L4: import OpenAI-compatible server responses (vLLM, SGLang) as agentrl records, one per episode.

An episode is a list of exchanges ``{'request': ..., 'response': ...}`` as sent and received:

* vLLM ``/v1/chat/completions`` with ``return_token_ids: true`` and ``logprobs: true``:
  ``response['prompt_token_ids']``, ``choices[0]['token_ids']``,
  ``choices[0]['logprobs']['content'][i]['logprob']``.
* vLLM ``/v1/completions``: ``choices[0]['prompt_token_ids']`` (or top level), ``choices[0]['token_ids']``,
  ``choices[0]['logprobs']['token_logprobs']``.
* SGLang ``/generate`` with ``return_logprob: true``: ``output_ids`` and
  ``meta_info['output_token_logprobs']`` (``[logprob, token_id, text]`` triples); the prompt ids are
  the request's ``input_ids`` (or ``meta_info['input_token_logprobs']``' ids).

Owners are rebuilt from the chat template: chat exchanges go through :class:`~agentrl.templates.ChatRecorder`
on the given ids (the opening messages render the prompt, each turn's sampled ids are policy, the
new messages of the next request are bridged by the template). Where the server's own prompt ids
for a turn differ from the recorded sequence (it re-tokenized history, or the template rewrote it),
the record keeps the server's ids as that turn's context (``turn_contexts``) and lists the turn in
``info['import']['context_drift']``. Completion exchanges (raw prompts) take the first prompt as
prompt-owned and each later prompt's extension as tool-owned.

A response without token ids is refused (:class:`~agentrl.checks.errors.MissingTokenIdsError`):
re-encoding its text is the drift agentrl exists to catch.
"""
from __future__ import annotations

import dataclasses

import torch

from ..checks import errors as E
from ..constraints import GRAMMAR_STARTS, request_constraint
from ..families import family_for
from ..io import read_json
from ..record import OWNER, SamplingSpec, StopReason, Trajectory
from ..templates import ChatRecorder
from .common import check_ids, check_reward, provenance_for_import

__all__ = ['parse_response', 'from_openai', 'spec_from_request', 'read_episodes', 'check_episodes', 'SERVER_LOGP_MODES',
           'server_logp_mode', 'grammar_start_of']


def parse_response(response: dict, request: dict | None = None, where: str = 'response') -> dict:
    """Token ids, log-probs and stop of one server response (vLLM or SGLang).

    Returns:
        ``{'prompt_ids': [int] | None, 'ids': [int], 'logp': [float] | None, 'finish': str | None,
        'kind': 'chat' | 'completion' | 'sglang'}``.

    Raises:
        agentrl.checks.errors.MissingTokenIdsError: no output token ids in the response.
        agentrl.checks.errors.LogProbLengthError: log-probs of another length than the ids.
        agentrl.checks.errors.TokenIdError: an id that is not an integer (:func:`~agentrl.interop.common.check_ids`).
    """
    request = request or {}
    if 'meta_info' in response or 'output_ids' in response:            # SGLang /generate
        ids = response.get('output_ids')
        meta = response.get('meta_info') or {}
        lp = meta.get('output_token_logprobs')
        logp = None if lp is None else [float(x[0]) for x in lp]
        prompt = request.get('input_ids')
        if prompt is None and meta.get('input_token_logprobs'):
            prompt = [int(x[1]) for x in meta['input_token_logprobs']]
        fin = meta.get('finish_reason')
        finish = fin.get('type') if isinstance(fin, dict) else fin
        kind = 'sglang'
    else:
        choices = response.get('choices') or [{}]
        c = choices[0]
        ids = c.get('token_ids')
        prompt = c.get('prompt_token_ids', response.get('prompt_token_ids'))
        lps = c.get('logprobs')
        kind = 'chat' if 'message' in c else 'completion'
        if lps is None:
            logp = None
        elif 'content' in lps:
            logp = None if lps['content'] is None else [float(x['logprob']) for x in lps['content']]
        else:
            logp = [float(x) for x in lps.get('token_logprobs') or []]
        finish = c.get('finish_reason')
    if not ids:
        raise E.MissingTokenIdsError(
            f'{where} has no output token ids; re-encoding its text could give other tokens than were sampled',
            field='token_ids', fix='ask the server for them (vLLM: "return_token_ids": true; SGLang /generate '
                                   'returns output_ids) and log the raw response')
    ids = check_ids(ids, 'token_ids', where)
    if logp is not None and len(logp) != len(ids):
        raise E.LogProbLengthError(f'{where} has {len(logp)} log-probs for {len(ids)} token ids', field='logprobs',
                                   fix='request one log-prob per generated token ("logprobs": true / 0)')
    return {'prompt_ids': None if prompt is None else check_ids(prompt, 'prompt_token_ids', where), 'ids': ids,
            'logp': logp,
            'finish': finish, 'kind': kind}


#: Request fields of the sampler (OpenAI / vLLM top level, or SGLang ``sampling_params``).
_SAMPLER_FIELDS = ('temperature', 'top_p', 'top_k', 'min_p', 'repetition_penalty', 'presence_penalty',
                   'frequency_penalty')


def sampling_sources(request: dict, spec: SamplingSpec | None = None, generation_config: dict | None = None) -> dict:
    """Where each sampler field of an imported episode comes from: ``{field: source}``.

    ``'request'`` (top level or ``sampling_params``, not null), else ``'spec'`` (``spec=`` /
    ``--temperature`` given), else ``'generation_config'`` (the model folder's file the server read
    without ``--generation-config vllm``), else ``'absent'`` (the server filled it from defaults
    the logs do not show). Stored as ``info['import']['sampling_sources']``.
    """
    sent = dict(request.get('sampling_params') or {}, **request)
    gen = generation_config or {}
    return {f: 'request' if sent.get(f) is not None else 'spec' if spec is not None
            else 'generation_config' if gen.get(f) is not None else 'absent' for f in _SAMPLER_FIELDS}


def _generation_config(generation_config) -> dict | None:
    """A generation-config dict, or the ``generation_config.json`` at a path (its sampler fields only)."""
    if generation_config is None or isinstance(generation_config, dict):
        return generation_config
    d = read_json(generation_config, fix='pass the model folder\'s generation_config.json')
    if not isinstance(d, dict):
        raise ValueError(f'{str(generation_config)!r}: is not a JSON object; pass a generation_config.json')
    return {k: d[k] for k in _SAMPLER_FIELDS if d.get(k) is not None}


def spec_from_request(request: dict, logp_mode: str = 'raw') -> SamplingSpec:
    """The sampler declared in a request body (OpenAI / vLLM top-level names, or SGLang ``sampling_params``).

    Top-level fields win over ``sampling_params``. ``top_k`` <= 0 is off. When a penalty
    (repetition, presence, frequency) is on, the spec holds all three with
    ``penalty_semantics='vllm'`` (vLLM's and SGLang's ``apply_penalties``: presence and frequency on
    the output tokens, repetition on prompt and output).

    ``logp_mode`` is not in the request: vLLM's default ``logprobs_mode`` is raw log-probs; pass
    ``'processed'`` for a server started with ``--logprobs-mode processed_logprobs``.

    Raises:
        ValueError: a value out of range (as :class:`~agentrl.record.SamplingSpec`).
    """
    p = dict(request.get('sampling_params') or {}, **{k: v for k, v in request.items() if k in _SAMPLER_FIELDS})
    p = {k: v for k, v in p.items() if v is not None}
    return _spec_of(p, logp_mode)


def _spec_of(p: dict, logp_mode: str) -> SamplingSpec:
    top_k = int(p.get('top_k') or 0)
    pen = dict(repetition_penalty=float(p.get('repetition_penalty', 1.0)),
               presence_penalty=float(p.get('presence_penalty', 0.0)),
               frequency_penalty=float(p.get('frequency_penalty', 0.0)))
    pen = dict(pen, penalty_semantics='vllm') if pen != {'repetition_penalty': 1.0, 'presence_penalty': 0.0,
                                                          'frequency_penalty': 0.0} else {}
    return SamplingSpec(temperature=float(p.get('temperature', 1.0)), top_k=max(top_k, 0),
                        top_p=float(p.get('top_p', 1.0)), min_p=float(p.get('min_p', 0.0)), logp_mode=logp_mode, **pen)


def _template_kwargs(ex, n: int) -> dict:
    """The episode's ``chat_template_kwargs`` (e.g. ``enable_thinking: false``), the same in every request."""
    first = ex[0]['request'].get('chat_template_kwargs') or {}
    for k, e in enumerate(ex[1:], 1):
        if (e['request'].get('chat_template_kwargs') or {}) != first:
            raise ValueError(f'episode {n} exchange {k}: chat_template_kwargs {e["request"].get("chat_template_kwargs")} '
                             f'differ from exchange 0\'s {first}; one episode is rendered with one template: '
                             'split it, or log the kwargs the server used')
    return dict(first)


def _chat_episode(ex, tokenizer, tools, history, options):
    req0 = ex[0]['request']
    rec = ChatRecorder(tokenizer, req0['messages'], tools=req0.get('tools') or tools, history=history, **options)
    server_ctx, drift = [], []
    for k, e in enumerate(ex):
        r = parse_response(e['response'], e['request'], f'exchange {k} response')
        if k > 0:
            prev = ex[k - 1]['request']['messages']
            msgs = e['request']['messages']
            new = [m for m in msgs[len(prev) + 1:]]
            rec.add_messages(new)
        server_ctx.append(r['prompt_ids'])
        if r['prompt_ids'] is not None and r['prompt_ids'] != rec.prompt_ids:
            drift.append(k)
        echoed = None
        if k + 1 < len(ex):
            nxt = ex[k + 1]['request']['messages']
            cur = e['request']['messages']
            if len(nxt) > len(cur) and nxt[len(cur)].get('role') == 'assistant':
                echoed = nxt[len(cur)]
        rec.add_turn(r['ids'], r['logp'], message=echoed)
        last = r
    return rec, server_ctx, drift, last


def _completion_episode(ex):
    """The episode as one sequence; ``cut`` lists the turns that ended with ``finish_reason`` "length"."""
    ids, owner, turn, logp, placeholder, cut = [], [], [], [], False, []
    for k, e in enumerate(ex):
        r = parse_response(e['response'], e['request'], f'exchange {k} response')
        p = r['prompt_ids']
        if p is None:
            raise E.MissingTokenIdsError(f'exchange {k} has no prompt token ids', field='prompt_token_ids',
                                         fix='log the prompt ids (vLLM returns prompt_token_ids with '
                                             'return_token_ids; for SGLang send input_ids)')
        if k == 0:
            ids, owner, turn, logp = list(p), [OWNER['prompt']] * len(p), [-1] * len(p), [0.0] * len(p)
        elif p[:len(ids)] == ids:
            ext = p[len(ids):]
            ids += ext
            owner += [OWNER['tool']] * len(ext)
            turn += [k - 1] * len(ext)
            logp += [0.0] * len(ext)
        else:
            raise ValueError(f'exchange {k}: the prompt does not extend the previous prompt + completion, so the '
                             'episode is not one sequence. Fix: import it with chat requests (messages), or '
                             'split it into one episode per exchange')
        ids += r['ids']
        owner += [OWNER['policy']] * len(r['ids'])
        turn += [k] * len(r['ids'])
        if r['logp'] is None:
            placeholder = True
        logp += r['logp'] if r['logp'] is not None else [0.0] * len(r['ids'])
        if r['finish'] == 'length':
            cut.append(k)
        last = r
    return ids, owner, turn, logp, placeholder, last, cut


def from_openai(episodes, tokenizer=None, *, spec: SamplingSpec | None = None, tools=None, history: str = 'sampled',
                logp_mode: str | None = None, source: str = 'vllm', model: str = '', generation_config=None,
                strict_sampling: bool = True, grammar_start: str | None = None,
                **template_options) -> list[Trajectory]:
    """Import episodes of OpenAI-compatible exchanges as records (one per episode).

    Args:
        episodes: iterable of ``{'exchanges': [{'request': {...}, 'response': {...}}, ...], 'reward': float,
            'info': dict, 'group_id': str, 'rollout_id': str}`` (reward, info and ids optional).
        tokenizer: the Hugging Face tokenizer the server used (needed for chat exchanges and fingerprints).
        spec: the sampler; None: read from the first request (:func:`spec_from_request`).
        tools: tool schemas, when the requests do not carry ``tools``.
        history: ChatRecorder history mode (``'sampled'``: each turn continues the sampled ids, as
            servers that keep token ids do).
        logp_mode: the mode of the server's log-probs, when ``spec`` is None (:func:`server_logp_mode`; None: the
            server's default, :data:`SERVER_LOGP_MODES`).
        source: provenance policy name (``'vllm'``, ``'sglang'``).
        model: model id (default: the request's ``model``).
        generation_config: the model folder's ``generation_config.json`` (path or dict) the server
            filled absent fields from (a server without ``--generation-config vllm``); with ``spec`` None
            its temperature, top_p, top_k, min_p, repetition_penalty fill fields the request leaves out.
        strict_sampling: True (the default, as ``agentrl import``): refuse an episode whose first request
            leaves a sampler field out that neither ``spec`` nor ``generation_config`` supplies (the server
            chose it; the record could not declare what ran). False: store the neutral value for such a
            field (temperature 1, no top-k/top-p/min-p, no penalties), marked ``'absent'`` in
            ``info['import']['sampling_sources']``, which says where each field came from.
        grammar_start: where the server applied a constrained request's grammar in each turn (one of
            :data:`~agentrl.constraints.GRAMMAR_STARTS`): ``'turn'`` from the first token, ``'reasoning'`` after
            the reasoning close mark (vLLM with a reasoning parser, SGLang's reasoner grammar); None: as the
            exchanges say (:func:`grammar_start_of`). The record's ``constraint.start_after`` says it
            (docs/grammar.md).
        **template_options: ChatTemplate options (``enable_thinking=False`` ...).

    Returns:
        list of :class:`~agentrl.record.Trajectory`; ``info['import']`` holds the source, the last
        finish reason and the turns whose server context differs from the record (``context_drift``).

    Raises:
        agentrl.checks.errors.MissingTokenIdsError: a response (or completion prompt) without token ids.
        agentrl.checks.errors.LogProbLengthError: log-probs and ids of different lengths.
        ValueError: an episode without exchanges, or chat exchanges without a tokenizer; with
            ``strict_sampling``, a sampler field that neither the request, ``spec`` nor ``generation_config``
            gives (``episode N exchange 0: request: has no top_p, ...``); a log-prob mode that cannot be known
            or declared (:func:`server_logp_mode`, and responses of another server than ``source``); a grammar
            start the exchanges do not say (:func:`grammar_start_of`).
    """
    out = []
    for n, ep in enumerate(episodes):
        ex = ep.get('exchanges') or []
        if not ex:
            raise ValueError(f'episode {n} has no exchanges; give [{{"request": ..., "response": ...}}, ...]')
        req0 = ex[0]['request']
        sp, sources = _episode_spec(n, req0, spec, _generation_config(generation_config), logp_mode, strict_sampling)
        if spec is None:
            _same_server(n, ex, source, logp_mode)
            sp = dataclasses.replace(sp, logp_mode=server_logp_mode(source, logp_mode, sp))
        kwargs = _template_kwargs(ex, n)
        if sp is not None and sp.constraint is None:      # tool_choice / response_format / structured outputs
            sp = _with_constraint(sp, req0, tokenizer)
            if sp.constraint is not None:
                after = grammar_start_of(n, ex, tokenizer, sp.constraint, grammar_start,
                                         dict(template_options, **kwargs))
                sp = dataclasses.replace(sp, constraint=dataclasses.replace(sp.constraint, start_after=after))
        meta = {'source': source, 'exchanges': len(ex), 'sampling_sources': sources}
        reward = check_reward(ep.get('reward', 0.0), 'reward', f'{source} episode {n}')
        if 'messages' in req0:
            if tokenizer is None:
                raise ValueError(f'episode {n}: chat exchanges need the tokenizer (--tokenizer) to rebuild owners '
                                 'from the chat template')
            rec, server_ctx, drift, last = _chat_episode(ex, tokenizer, tools, history, dict(template_options, **kwargs))
            if kwargs:
                meta['chat_template_kwargs'] = kwargs
            prov = provenance_for_import(source, spec=sp, group_id=ep.get('group_id', ''),
                                         rollout_id=ep.get('rollout_id', str(n)), tokenizer=tokenizer,
                                         model=model or req0.get('model', ''))
            meta.update(context_drift=drift, finish=last['finish'])
            info = dict(ep.get('info') or {}, stop=ep.get('info', {}).get('stop', _stop(last['finish'])),
                        **{'import': meta})
            traj = rec.finish(reward=reward, info=info, provenance=prov)
            if traj.provenance.logp_placeholder:
                traj.provenance.sampling = None
            if drift:
                starts = _turn_starts(traj)
                ctxs = traj.turn_contexts or [(s, traj.ids[:s]) for s in starts]
                traj.turn_contexts = [(s, torch.as_tensor(server_ctx[k], dtype=torch.long)) if k in drift else (s, c)
                                      for k, (s, c) in enumerate(ctxs)]
        else:
            ids, owner, turn, logp, placeholder, last, cut = _completion_episode(ex)
            prov = provenance_for_import(source, spec=sp, group_id=ep.get('group_id', ''),
                                         rollout_id=ep.get('rollout_id', str(n)), tokenizer=tokenizer,
                                         model=model or req0.get('model', ''), placeholder=placeholder)
            meta.update(context_drift=[], finish=last['finish'])
            info = dict(ep.get('info') or {}, **{'import': meta})
            info.setdefault('stop', _stop(last['finish']))
            if cut:     # what follows a turn cut at its budget was appended, not sampled (not trained)
                info.setdefault('template', {})['unterminated_turns'] = cut
            traj = Trajectory.from_tokens(ids, owner, turn, logp, reward, info, provenance=prov)
        out.append(traj)
    return out


def _with_constraint(spec: SamplingSpec, request: dict, tokenizer) -> SamplingSpec:
    """``spec`` with the grammar the request asked for (:func:`agentrl.constraints.request_constraint`), ending on
    the request's ``stop_token_ids`` and, unless ``ignore_eos``, the tokenizer's EOS (vLLM's stop ids)."""
    sent = dict(request.get('sampling_params') or {}, **request)          # SGLang /generate: in sampling_params
    stops = [int(i) for i in sent.get('stop_token_ids') or []]
    eos = getattr(tokenizer, 'eos_token_id', None)
    if eos is not None and not sent.get('ignore_eos'):
        stops.append(int(eos))
    c = request_constraint(request, stops)
    return spec if c is None else dataclasses.replace(spec, constraint=c)


#: The mode of each server's log-probs by default (docs/design.md#sampling): vLLM's ``--logprobs-mode raw_logprobs``;
#: SGLang's ``log_softmax(logits / T)`` after its penalties, never renormalised over top-k / top-p / min-p
#: (``scaled``; raw with ``SGLANG_RETURN_ORIGINAL_LOGPROB`` set).
SERVER_LOGP_MODES = {'vllm': 'raw', 'sglang': 'scaled'}

def server_logp_mode(source: str, declared: str | None, spec: SamplingSpec) -> str:
    """The ``logp_mode`` a record imported from ``source`` declares for log-probs the server returned.

    ``declared`` None takes the server's default (:data:`SERVER_LOGP_MODES`). ``scaled`` of a spec without
    truncation (or greedy) is the same number as ``processed`` and is declared ``processed``.

    Args:
        source: ``'vllm'``, ``'sglang'`` or another server's name. declared: the mode the user states
            (``--logp-mode``), or None. spec: the request's sampler.

    Returns:
        One of :data:`agentrl.record.LOGP_MODES`.

    Raises:
        ValueError: one line naming ``--logp-mode``: a server whose default is not known; ``scaled`` for vLLM (its
            ``processed_logprobs`` are renormalised after top-k / top-p); ``processed`` for SGLang with top-k /
            top-p / min-p (SGLang never renormalises); ``raw`` for SGLang with a penalty (its original log-probs are
            taken after its penalties, agentrl's raw before them).
    """
    mode = declared if declared is not None else SERVER_LOGP_MODES.get(source)
    if mode is None:
        raise ValueError(f'the log-prob mode of {source!r} responses is not known; pass --logp-mode processed, raw '
                         'or scaled (logp_mode=), the mode the server returned')
    if source == 'vllm' and mode == 'scaled':
        raise ValueError('--logp-mode scaled: vLLM has no such mode (--logprobs-mode processed_logprobs are '
                         'renormalised over top-k / top-p: processed); pass --logp-mode raw or processed')
    if source == 'sglang' and spec.temperature > 0:
        if mode == 'processed' and spec.truncated:
            raise ValueError('--logp-mode processed: SGLang never renormalises its log-probs over top-k / top-p / '
                             'min-p (log_softmax(logits / T) by default: scaled; SGLANG_RETURN_ORIGINAL_LOGPROB '
                             'set: raw); pass --logp-mode scaled or raw')
        if mode == 'raw' and spec.penalized:
            raise ValueError('--logp-mode raw: SGLang takes its original log-probs (SGLANG_RETURN_ORIGINAL_LOGPROB) '
                             "after its penalties, agentrl's raw mode before them, so the record cannot declare "
                             'them; import episodes sampled without penalties, or with the default (scaled) log-probs')
    if mode == 'scaled' and (spec.temperature <= 0 or not spec.truncated):
        return 'processed'
    return mode


def _same_server(n: int, ex, source: str, declared: str | None) -> None:
    """Refuse (naming ``--logp-mode``) responses of another server than ``source`` when the mode is its default."""
    if declared is not None:
        return
    for k, e in enumerate(ex):
        shape = parse_response(e['response'], e['request'], f'exchange {k} response')['kind']
        if shape == 'sglang' != source:
            raise ValueError(f'episode {n} exchange {k}: response is an SGLang /generate response but --from is '
                             f'{source!r}, so the mode of its log-probs is not known; pass --from sglang, or '
                             '--logp-mode processed, raw or scaled (logp_mode=)')


def _reasoning_declared(ex) -> bool | None:
    """What the exchanges say of a two-phase grammar: True (SGLang ``require_reasoning`` / ``separate_reasoning``, or
    a reply whose reasoning the server separated), False (``require_reasoning: false``), None (nothing)."""
    for e in ex:
        q = e['request']
        if q.get('require_reasoning') is False:
            return False
        if q.get('require_reasoning') or q.get('separate_reasoning'):
            return True
        for c in e['response'].get('choices') or []:
            msg = c.get('message') or {}
            if msg.get('reasoning') is not None or msg.get('reasoning_content') is not None:
                return True
    return None


def grammar_start_of(n: int, ex, tokenizer, constraint, grammar_start: str | None, template_kwargs: dict) -> tuple:
    """The ``start_after`` of episode ``n``'s constraint: ``()`` (from each turn's first token) or the ids of the
    family's reasoning close mark (the grammar starts after it), docs/grammar.md.

    ``grammar_start`` None reads the exchanges: an SGLang request with ``require_reasoning`` or ``separate_reasoning``,
    or a reply whose reasoning the server separated (``reasoning`` / ``reasoning_content``: it ran a reasoning
    parser), is ``'reasoning'``; otherwise ``'turn'``. With thinking off (``chat_template_kwargs``
    ``enable_thinking`` / ``thinking`` false) the reasoning has ended before the turn, so the grammar starts at the
    first token either way (vLLM's and SGLang's reasoner grammars).

    Args:
        n: the episode's index. ex: its exchanges. tokenizer: the server's tokenizer (the close mark's ids).
        constraint: the request's :class:`~agentrl.constraints.Constraint`. grammar_start: one of
            :data:`~agentrl.constraints.GRAMMAR_STARTS` or None. template_kwargs: the chat-template options the
            server rendered with.

    Returns:
        tuple of ids (``Constraint.start_after``).

    Raises:
        ValueError: ``'reasoning'`` without a tokenizer or for a template with no reasoning close mark; the
            exchanges say nothing and a turn closes a reasoning block (naming ``--grammar-start``).
    """
    if grammar_start is not None and grammar_start not in GRAMMAR_STARTS:
        raise ValueError(f'grammar_start must be one of {GRAMMAR_STARTS}, got {grammar_start!r}')
    said = _reasoning_declared(ex)
    mode = grammar_start or {True: 'reasoning', False: 'turn'}.get(said)
    if template_kwargs.get('enable_thinking') is False or template_kwargs.get('thinking') is False:
        return ()
    if mode == 'turn':
        return ()
    if tokenizer is None:
        if mode is None:
            return ()
        raise ValueError(f'episode {n}: a grammar after the reasoning needs the tokenizer (--tokenizer) for the '
                         'reasoning close mark')
    close = family_for(tokenizer).think_close
    mark = tuple(tokenizer.encode(close, add_special_tokens=False)) if close else ()
    if mode is None:
        for k, e in enumerate(ex):
            if mark and dataclasses.replace(constraint, start_after=mark).grammar_start(
                    parse_response(e['response'], e['request'], f'exchange {k} response')['ids']) is not None:
                raise ValueError(f'episode {n} exchange {k}: the turn closes a reasoning block ({close!r}) under a '
                                 f'{constraint.kind} constraint, and the exchanges do not say whether the server '
                                 'applied the grammar after the reasoning (a reasoning parser) or from the first '
                                 'token; pass --grammar-start reasoning or turn (grammar_start=)')
        return ()
    if not mark:
        raise ValueError(f'episode {n}: --grammar-start reasoning, but the chat template has no reasoning close '
                         'mark; pass --grammar-start turn')
    return mark


def _episode_spec(n: int, req0: dict, spec, gen, logp_mode: str | None, strict: bool):
    """``(spec, sources)`` of episode ``n`` (see :func:`from_openai`); ValueError naming absent fields when strict."""
    sources = sampling_sources(req0, spec, gen)
    absent = [f for f, s in sources.items() if s == 'absent']
    if strict and absent:
        raise ValueError(f'episode {n} exchange 0: request: has no {", ".join(absent)}; the server filled them from '
                         'its defaults, so the record cannot declare what ran. Fix: send every sampling field, or '
                         'pass the sampler (--temperature/--top-p/... or spec=) or the generation_config.json the '
                         'server read (--generation-config)')
    if spec is not None:
        return spec, sources
    sent = dict(req0.get('sampling_params') or {}, **{k: v for k, v in req0.items() if k in _SAMPLER_FIELDS})
    p = dict({k: v for k, v in (gen or {}).items() if k in _SAMPLER_FIELDS},
             **{k: v for k, v in sent.items() if v is not None})
    return _spec_of(p, logp_mode or 'raw'), sources


def _stop(finish) -> str:
    """``info['stop']`` of an OpenAI ``finish_reason``: ``length`` -> truncated; ``stop``/``tool_calls``/None -> submitted."""
    if finish == 'length':
        return StopReason.TRUNCATED
    return StopReason.SUBMITTED if finish in ('stop', 'tool_calls', None) else str(finish)


def _turn_starts(traj) -> list:
    pol = (traj.owner == OWNER['policy']).tolist()
    return [j for j, p in enumerate(pol) if p and (j == 0 or not pol[j - 1])]


def read_episodes(path) -> list:
    """Episodes from a JSON file (a list) or a JSONL file (one episode per line).

    Raises:
        ValueError: the file is not UTF-8 JSON/JSONL (names the file and line).
    """
    return read_json(path, lines='auto', fix='pass a JSON list of episodes or a JSONL file, one episode per line')



def check_episodes(episodes, name: str = 'episodes', fix: str = '') -> None:
    """Refuse episodes not of the shape :func:`from_openai` reads, naming the episode, exchange and field.

    Args:
        episodes: the decoded file (should be a list of ``{'exchanges': [{'request': {...}, 'response':
            {...}}, ...]}`` dicts).
        name: the file, as printed (``"'eps.json'"``).
        fix: what to do, appended (default: the episode shape).

    Raises:
        ValueError: one line, e.g. ``'eps.json' episode 0 exchange 1: request: is missing; FIX`` or
            ``'eps.json' episode 0: is a int, not {"exchanges": [...]}; FIX``.
    """
    fix = fix or ('log each episode as {"exchanges": [{"request": <request body>, "response": <server response>}, '
                  '...]}')
    if not isinstance(episodes, list):
        raise ValueError(f'{name}: is a JSON {type(episodes).__name__}, not a list of episodes; {fix}')
    for n, ep in enumerate(episodes):
        if not isinstance(ep, dict):
            raise ValueError(f'{name} episode {n}: is a {type(ep).__name__}, not {{"exchanges": [...]}}; {fix}')
        ex = ep.get('exchanges')
        if not ex:
            raise ValueError(f'{name} episode {n}: exchanges: is missing or empty; {fix}')
        if not isinstance(ex, list):
            raise ValueError(f'{name} episode {n}: exchanges: is a {type(ex).__name__}, not a list of '
                             f'{{"request": ..., "response": ...}}; {fix}')
        for k, e in enumerate(ex):
            for key in ('request', 'response'):
                v = e.get(key) if isinstance(e, dict) else None
                if not isinstance(v, dict):
                    what = 'is missing' if v is None else f'is a {type(v).__name__}, not an object'
                    raise ValueError(f'{name} episode {n} exchange {k}: {key}: {what}; log each exchange as '
                                     f'{{"request": <request body>, "response": <server response>}}')
