"""L5: the gateway's state, its state thread and its engine threads: sessions, calls, the journal, restart.

:class:`Gateway` owns everything. Every change of state (planning a call, journalling and
applying its sample, committing, finishing) is serial: the HTTP app (:mod:`agentrl.gateway.app`)
runs the short ones on its event loop while the state thread (:attr:`Gateway.pool`) is idle and the
long ones (finishing, reaping) on that thread. The engine calls run in :attr:`Gateway.engine_pool`
(``upstream.concurrency`` threads), so sessions sample concurrently. The app serves one call of a
session at a time: a marked retry of a call still sampling waits for it and finds it committed, so
it is replayed.

Run folder::

    RUN/.lock             held while a gateway serves RUN
    RUN/run.json          what serves it (kind 'gateway', model, and the fingerprint a restart must match)
    RUN/serve.json        the bound address (host, port, base URL, pid), rewritten at each start
    RUN/journal.jsonl     every session, call, finish and commit (fsync'd; the state is its fold)
    RUN/trajectories/     one record per branch leaf of each finished session (ShardWriter shards)
    RUN/summary.json      run metrics (:func:`agentrl.gateway.records.run_metrics`), rewritten per commit

Source: docs/gateway.md.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..constraints import ConstraintError
from ..engines.contract import EngineDied, EngineError, TurnRequest, TurnResult
from ..families import family_for
from ..io import atomic_write
from ..templates import ChatTemplate, tokenizer_fingerprint
from .journal import JOURNAL_VERSION, Journal, read_journal
from .limits import Limits
from .parse import finish_reason, parse_reply
from .protocol import ChatRequest, GatewayError, template_options
from .records import Identities, record_identity, run_metrics, session_records, session_stats
from .sessions import Session

__all__ = ['Gateway', 'Pending', 'session_id']

_IDENTITY = ('group_id', 'rollout_id', 'task')
_UNSET = object()
#: Templates (and their conformance reports) kept per tool list and request template options, the most
#: recently used; the start-up (tool-less) one is always kept (docs/design.md#bounds).
MAX_TEMPLATES = 64


@dataclass
class Pending:
    """A call between :meth:`Gateway.prepare` and :meth:`Gateway.complete`: its plan, template, turn
    budget, seed, policy version (taken at dispatch) and dispatch time
    ``t0``; or ``replay`` = ``(response, index, True)`` for a marked retry of an earlier call; ``constraint``: the
    call grammar of a forced ``tool_choice`` (:meth:`Gateway.call_constraint`) or None; ``images``: the call's
    images ``digest -> bytes`` (:meth:`Gateway.take_images`), stored once it is journalled."""
    session: Session
    req: ChatRequest
    digest: str
    retry: int
    plan: object = None
    template: object = None
    budget: int = 0
    seed: int | None = None
    version: str = '0'
    t0: float = 0.0
    replay: tuple | None = None
    think: bool = False
    constraint: object = None
    images: dict | None = None


def session_id(token: str) -> str:
    """The id a token's session is stored under: 32 hex of sha256(token) (the token is never written)."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


class Gateway:
    """Sessions in front of one :class:`~agentrl.engines.contract.Engine`, journalled in ``out``.

    Args:
        upstream: the engine. out: the run folder (created; an existing journal is replayed).
        limits: per-session :class:`~agentrl.gateway.limits.Limits`.
        session_timeout: seconds a session may stay idle before it is committed as aborted.
        template_options: :class:`~agentrl.templates.ChatTemplate` options (``enable_thinking``,
            ``chat_template`` ...). A request's ``chat_template_kwargs`` and ``reasoning_effort``
            (:func:`~agentrl.gateway.protocol.template_options`) add to them; one that would change
            one of them, or change what the session's first call rendered under, is refused.
        conformance: run :func:`~agentrl.gateway.conformance.conformance` (with the family) on every
            template before it serves (at start for the tool-less one, at first use for each tool
            list and set of request template options).
        family: the model family's name (:func:`agentrl.families.family_names`); None picks it from
            the tokenizer (:func:`agentrl.families.family_for`). Attribute ``family``: the family.

    Raises:
        ValueError: a damaged journal (names the line); ``out`` holds a run of another kind; an
            unknown ``family``.
        ConformanceError: the template's bridges disagree with its full render (names the token), or
            it writes tool calls the family does not parse (names the format).
    """

    def __init__(self, upstream, out, *, limits: Limits | None = None, session_timeout: float = 600.0,
                 template_options: dict | None = None, conformance: bool = True, family: str | None = None):
        self.upstream, self.out = upstream, Path(out)
        self.template_options, self.conformance = dict(template_options or {}), bool(conformance)
        self.conformance_report: dict = {}
        self.policy_version = '0'
        self.limits = limits or Limits()
        self.session_timeout = float(session_timeout)
        self.sessions: dict[str, Session] = {}
        self.records: dict[str, int] = {}
        self.closed: dict[str, dict] = {}      # committed sessions, out of memory: sid -> describe() and stats
        self.identities = Identities()
        started_with = dict(self.template_options)
        self._templates: dict = {}
        self._reads: dict = {}                 # template option name -> whether the template's source reads it
        self._writer = None
        self._family_name = family
        self.family = self._family_stops(family)
        probe = [{'role': 'user', 'content': 'Probe question.'}]
        tool = [{'type': 'function', 'function': {'name': 'probe_tool', 'description': 'A probe.',
                                                  'parameters': {'type': 'object', 'properties': {}}}}]
        base = self.template(None)                                   # the start-up conformance gate
        #: whether the template renders tool schemas; one that ignores them takes none (the tools are described
        #: in a system message), so its calls are parsed without ``tools`` in the request
        self.renders_tools = base.render(probe, True, tools=tool) != base.render(probe, True, tools=None)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix='agentrl-gateway')
        self.engine_pool = ThreadPoolExecutor(max_workers=max(1, int(getattr(upstream, 'concurrency', 1))),
                                              thread_name_prefix='agentrl-engine')
        self.out.mkdir(parents=True, exist_ok=True)
        run = self.out / 'run.json'
        if run.is_file():
            kind = json.loads(run.read_text()).get('kind')
            if kind != 'gateway':
                what = f'a run of kind {kind!r}' if kind else 'an agentrl rollout run (run.json has no kind)'
                raise ValueError(f'--out {str(self.out)!r} holds {what}, not a gateway run; choose a new --out')
        _check_run(run, self._fingerprint(started_with))
        events = read_journal(self.out / 'journal.jsonl')
        self.journal = Journal(self.out / 'journal.jsonl')
        self._restore(events)

    # ------------------------------------------------------------------ helpers
    def writer(self):
        if self._writer is None:
            from ..store import ShardWriter
            self._writer = ShardWriter(self.out / 'trajectories')
        return self._writer

    def _fingerprint(self, options: dict) -> dict:
        """What a restart on ``out`` must serve with: model, tokenizer and template digests, family, options."""
        source = self.template(None).source or ''
        opts = {k: v for k, v in options.items() if k != 'chat_template'}      # the template digest covers it
        return {'model': self.upstream.model_name, 'tokenizer': tokenizer_fingerprint(self.upstream.tokenizer),
                'template': hashlib.sha256(source.encode()).hexdigest()[:16], 'family': self.family.name,
                'options': json.loads(json.dumps(opts, sort_keys=True, default=str))}

    def _log(self, event: dict, sync: bool = True) -> None:
        """Journal one event, whole or not at all (:meth:`Journal.append`; ``sync`` as there).

        Raises:
            GatewayError: 503 naming the journal and the OS error (ENOSPC, EFBIG ...); nothing was written.
        """
        try:
            self.journal.append(event, sync)
        except OSError as e:
            raise GatewayError(503, f'the journal {self.journal.path} could not be written ({type(e).__name__}: '
                                    f'{e.strerror or e}); nothing of this request was kept: free space on that disk '
                                    'and send it again', type='server_error', code='journal_unwritable') from None

    def keep_images(self, session: Session, images: dict) -> None:
        """Store a call's images (``digest -> bytes``) in ``RUN/images`` now, and remember them for the commit.

        Stored when received, so a record committed after a restart (whose session images are not journalled)
        still finds them (docs/design.md#images). Raises ValueError: a key that is not its bytes' digest, or
        bytes neither PNG nor JPEG (:func:`agentrl.images.store_images`).
        """
        from ..images import store_images
        store_images(self.out, images)
        session.images.update(images)

    def _family_stops(self, name: str | None):
        """The model family; its stop ids that the bare template lacks (gpt-oss ``<|call|>``) join
        ``template_options['stop_tokens']``, so every template records such a stop as a stop (docs/design.md#stops).

        Raises:
            ValueError: bad template options (as :class:`ChatTemplate`), an unknown family ``name``.
        """
        bare = ChatTemplate(self.upstream.tokenizer, **self.template_options)
        family = family_for(bare, name=name)
        extra = [bare.decode([i]) for i in sorted(family.stop_ids(bare) - bare.stop_ids)]
        if extra:
            self.template_options['stop_tokens'] = list(self.template_options.get('stop_tokens') or ()) + extra
        return family

    def template(self, tools, options: dict | None = None) -> ChatTemplate:
        """The chat template with these tools and request template options (the last :data:`MAX_TEMPLATES` used
        are kept, each with its ``conformance_report``; the tool-less one always).

        Raises:
            GatewayError: 400 when the template cannot take the tools or options, or fails the
                conformance gate with them. ConformanceError: the tool-less template fails the gate.
            ValueError: an unknown family name.
        """
        options = options or {}
        key = json.dumps(tools, sort_keys=True) + (' ' + json.dumps(options, sort_keys=True) if options else '')
        if key not in self._templates:
            param = 'tools' if tools is not None or not options else 'chat_template_kwargs'
            try:
                t = ChatTemplate(self.upstream.tokenizer, tools=tools, **{**self.template_options, **options})
            except ValueError as e:
                raise GatewayError(400, f'{param}: {e}', param=param) from None
            if self.conformance:
                from .conformance import ConformanceError, conformance
                try:
                    self.conformance_report[key] = conformance(t, family=self.family)
                except ConformanceError as e:
                    if tools is None and not options:
                        raise
                    raise GatewayError(400, f'{param}: {e}', param=param) from None
        else:
            t = self._templates.pop(key)                 # put back last: the most recently used
        self._templates[key] = t
        while len(self._templates) > MAX_TEMPLATES:
            old = next(k for k in self._templates if k != 'null')
            del self._templates[old]
            self.conformance_report.pop(old, None)
        return t

    def request_options(self, req: ChatRequest, session: Session | None = None) -> dict:
        """The template options ``req`` renders under (:func:`~agentrl.gateway.protocol.template_options`).

        Raises:
            GatewayError: 400 naming ``chat_template_kwargs.NAME`` or ``reasoning_effort`` when the value
                would change an option the gateway serves with (``template_options``) or one the
                session's first call rendered under.
        """
        opts = template_options(req, self._template_reads(set(req.chat_template_kwargs) |
                                                          {'enable_thinking', 'reasoning_effort'}))

        def field(k):
            if k in req.chat_template_kwargs:
                return f'chat_template_kwargs.{k}'
            return 'reasoning.enabled' if k == 'enable_thinking' and req.reasoning_enabled is not None \
                else 'reasoning_effort'
        for k, v in opts.items():
            if k in self.template_options and self.template_options[k] != v:
                raise GatewayError(400, f'{field(k)}: {k}={json.dumps(v)} cannot be honoured: this gateway serves '
                                        f'the template with {k}={json.dumps(self.template_options[k])}; remove it',
                                   param=field(k))
        if session is not None and session.template_kwargs is not None and session.template_kwargs != opts:
            old = session.template_kwargs
            k = next(k for k in sorted(set(old) | set(opts)) if (k in old, old.get(k)) != (k in opts, opts.get(k)))
            new = f'{k}={json.dumps(opts[k])}' if k in opts else f'{k} unset'
            was = f'{k}={json.dumps(old[k])}' if k in old else f'{k} unset'
            raise GatewayError(400, f'{field(k)}: {new} differs from this session\'s first call ({was}): one '
                                    'session renders under one set of '
                                    'template options; open a new session for another', param=field(k))
        return opts

    def _template_reads(self, names: set) -> set:
        """The ``names`` the served template's source reads (a word search of it), cached per name: every call
        asks about the same few names (at most 256 kept)."""
        out = set()
        for k in names:
            hit = self._reads.get(k)
            if hit is None:
                hit = re.search(rf'(?<![\w.]){re.escape(k)}\b', self.template(None).source or '') is not None
                if len(self._reads) < 256:
                    self._reads[k] = hit
            if hit:
                out.add(k)
        return out

    def session(self, token: str) -> Session:
        """The session of a capability token.

        Raises:
            GatewayError: 404 for an unknown token (nothing is written); 409 ``session_closed`` for a
                committed one (it left memory: :meth:`describe` still reports it).
        """
        sid = session_id(token) if isinstance(token, str) else None
        s = self.sessions.get(sid)
        if s is None and sid in self.closed:
            raise GatewayError(409, f'the session is committed ({self.closed[sid]["stats"]["records"]} records '
                                    'stored); open a new one', code='session_closed')
        if s is None:
            raise GatewayError(404, 'no such session: the token is unknown (create one with POST /sessions)',
                               type='not_found_error', code='session_not_found')
        return s

    # ------------------------------------------------------------------ sessions
    def open_session(self, identity: dict) -> tuple:
        """Create a session: ``(token, Session)``; the event is journalled first.

        Raises:
            GatewayError: 400 for identity fields other than group_id / rollout_id / task or not
                strings; 409 ``identity_conflict`` when its records' (group_id, rollout_id) (default: the
                session id) would clash with another session's, open, finished or stored, its own or
                one of its fork leaves' ``ROLLOUT/bK`` (:class:`~agentrl.gateway.records.Identities`);
                503 when the journal cannot be written.
        """
        if not isinstance(identity, dict):
            raise GatewayError(400, 'the session body must be a JSON object {"group_id", "rollout_id", "task"}')
        extra = sorted(set(identity) - set(_IDENTITY))
        if extra:
            raise GatewayError(400, f'unknown session field {extra[0]!r}; use {list(_IDENTITY)}', param=extra[0])
        for k, v in identity.items():
            if v is not None and not isinstance(v, str):
                raise GatewayError(400, f'{k} must be a string, got {type(v).__name__}', param=k)
        ident = {k: identity.get(k) for k in _IDENTITY}
        token = secrets.token_urlsafe(32)
        sid = session_id(token)
        clash = self.identities.clash(*record_identity(ident, sid))
        if clash is not None:
            raise GatewayError(409, clash, code='identity_conflict')
        now = time.time()
        self._log({'ev': 'session', 'sid': sid, 'identity': ident, 't': now, 'v': JOURNAL_VERSION})
        self.identities.add(*record_identity(ident, sid), sid)
        s = self.sessions[sid] = Session(sid, ident, now)
        return token, s

    # ------------------------------------------------------------------ calls
    def chat(self, session: Session, req: ChatRequest, digest: str, retry: int) -> tuple:
        """Serve one call in this thread: ``(response dict, call index, replayed)``.

        :meth:`prepare` (state), :meth:`sample` (engine), :meth:`complete` (state) in a row; the
        HTTP app runs the three as changes of state (see :mod:`agentrl.gateway.app`), an engine thread and
        again a change of state, so sessions sample concurrently while every change of state stays serial.

        Raises:
            GatewayError: as :meth:`prepare`, :meth:`sample` and :meth:`complete`.
        """
        p = self.prepare(session, req, digest, retry)
        if p.replay is not None:
            self.delivered(session, p.replay[1])
            return p.replay
        try:
            sample = self.sample(p)
        except BaseException:
            self.drop(p)
            raise
        out = self.complete(p, sample)
        self.delivered(session, out[1])             # returned to the caller: handed over
        return out

    def prepare(self, session: Session, req: ChatRequest, digest: str, retry: int) -> 'Pending':
        """Plan one call (a change of state): the branch it extends or forks, its prompt, budget and seed.

        A marked retry (``retry > 0``) whose body digest matches an earlier call of the session
        gets that call's response again (``Pending.replay``); anything else is planned to sample.
        The policy version is taken here (at dispatch).

        Raises:
            GatewayError: 409 for a finished session; 429 for a spent limit; 400 for sampling
                fields that differ from the session's first call, messages the template cannot
                render, a prompt with no room left in the context, or a forced ``tool_choice`` that
                cannot be honoured (:meth:`call_constraint`).
        """
        if retry > 0:
            for c in reversed(session.calls):
                if c['digest'] == digest:
                    return Pending(session, req, digest, retry, replay=(c['response'], c['index'], True))
        if session.state != 'open':
            raise GatewayError(409, f'the session is {session.state}; open a new one', code='session_closed')
        self.limits.check_call(len(session.calls), session.out_tokens, time.time() - session.created)
        if session.spec is not None and session.spec != req.spec:
            a, b = session.spec.to_dict(), req.spec.to_dict()     # fields at their defaults are left out of either
            name = next(k for k in [*a, *b] if a.get(k) != b.get(k))
            old, new = getattr(session.spec, name), getattr(req.spec, name)
            raise GatewayError(400, f'{name}={new} differs from this session\'s first call ({old}): one '
                                    'session samples under one sampler; open a new session for another', param=name)
        template = self.template(req.tools, self.request_options(req, session))
        images = self.take_images(session, req, template)
        try:
            plan = session.plan(req.messages, json.dumps(req.tools, sort_keys=True), template, self.family)
        except ValueError as e:
            raise GatewayError(400, f'messages: {e}', param='messages') from None
        p = Pending(session, req, digest, retry, plan=plan, template=template, version=self.policy_version,
                    t0=time.time(), think=self.family.prompt_opens_reasoning(template, plan.prompt_ids),
                    images=images)
        try:
            p.constraint = self.call_constraint(req, template, plan, session.calls)
            self.limits.check_prompt(len(plan.prompt_ids))
            room = self.upstream.max_context - len(plan.prompt_ids)
            p.budget = min(x for x in (req.max_tokens or self.upstream.max_new_tokens, room,
                                       self.limits.output_budget(session.out_tokens)) if x is not None)
            if p.budget < 1:
                raise GatewayError(400, f'the prompt is {len(plan.prompt_ids)} tokens; no room for a turn within the '
                                        f'context of {self.upstream.max_context}', code='context_length_exceeded')
        except BaseException:
            self.drop(p)
            raise
        p.seed = req.seed if req.seed is not None else \
            int(hashlib.sha256(f'{session.sid}/{len(session.calls)}'.encode()).hexdigest()[:15], 16)
        return p

    def take_images(self, session: Session, req: ChatRequest, template) -> dict:
        """The images of a request's ``image_url`` parts, ``digest -> bytes``, each part rewritten in one form.

        Each part's URL becomes ``data:image/png;base64,...`` (or ``image/jpeg``) of its bytes as decoded, so an
        echo of the same image in another spelling matches its branch (same digest, same expansion).
        ``req.messages`` is updated in place (what is planned and journalled).

        Raises:
            GatewayError: 400 naming the part for a template without an image processor (a text-only model), an
                ``http(s)`` or malformed URL (:func:`agentrl.images.decode_image_url`); 413 / 400 over the image
                limits (:meth:`~agentrl.gateway.limits.Limits.check_images`).

        Source: docs/gateway.md#images; docs/design.md#images.
        """
        import base64

        from ..images import IMAGE_TYPES, decode_image_url, image_digest, image_format
        found, sizes = {}, []
        for i, m in enumerate(req.messages):
            c = m.get('content')
            if not isinstance(c, list) or not any(p.get('type') == 'image_url' for p in c):
                continue
            parts = list(c)
            for j, part in enumerate(parts):
                if part.get('type') != 'image_url':
                    continue
                where = f'messages[{i}].content[{j}]'
                if not getattr(template, 'vision', None):
                    raise GatewayError(400, f'{where} is an image_url part and this model has no image processor; '
                                            'serve a vision-language model (its folder holds '
                                            'preprocessor_config.json), or send text', param=where)
                try:
                    data, ext = decode_image_url(part['image_url']['url'], where)
                    ext = image_format(data)
                except ValueError as e:
                    raise GatewayError(400, str(e), param=where) from None
                sizes.append((where, len(data)))
                found[image_digest(data)] = data
                mime = next(k for k, v in IMAGE_TYPES.items() if v == ext)
                parts[j] = {'type': 'image_url', 'image_url': {
                    'url': f'data:{mime};base64,' + base64.b64encode(data).decode('ascii')}}
            req.messages[i] = dict(m, content=parts)
        if sizes:
            self.limits.check_images(sizes, len(set(found) - set(session.images)), len(session.images))
        return found

    def call_constraint(self, req: ChatRequest, template, plan, calls=()):
        """The grammar a forced ``tool_choice`` samples under, or None (``auto`` / ``none``).

        The family writes it (:meth:`agentrl.families.Family.call_grammar`, ending on the family's stop ids);
        it starts after the reasoning close mark (``Constraint.start_after``) when the template reasons and
        the prompt has not closed the reasoning already (thinking off), as vLLM with a reasoning parser
        applies it (docs/grammar.md). Every turn of a branch samples under one grammar, since its record
        declares one (``provenance.sampling.constraint``, replayed by ``agentrl check --model``).

        Args:
            req: the request. template: the chat template it renders with. plan: its
                :class:`~agentrl.gateway.sessions.Plan` (prompt ids and branch). calls: the session's calls
                (``Session.calls``: each one's ``constraint`` dict or None).

        Returns:
            :class:`~agentrl.constraints.Constraint` or None.

        Raises:
            GatewayError: 400 naming ``tool_choice`` for a family with no call grammar, xgrammar not
                installed, a vLLM engine with a grammar after the reasoning (its servers run no reasoning
                parser), or a branch whose earlier turns sampled under another grammar.
        """
        forced = req.forced
        shown = json.dumps(req.tool_choice)
        if forced is not None:
            try:
                c = self.family.for_tools(req.tools).call_grammar(req.tools, forced,
                                                                  sorted(self.family.stop_ids(template)))
            except (NotImplementedError, ConstraintError) as e:
                raise GatewayError(400, f'tool_choice={shown} cannot be honoured: {e}; use "auto"',
                                   param='tool_choice') from None
            if not c.version:
                raise GatewayError(400, f'tool_choice={shown} samples under a grammar and xgrammar is not installed; '
                                        'pip install "agentrl[grammar]", or use "auto"', param='tool_choice')
            after = _reasoning_mark(self.family, template, plan.prompt_ids)
            if after and getattr(self.upstream, 'policy', 'hf') == 'vllm':
                raise GatewayError(400, f'tool_choice={shown}: the turn reasons before its call, and the vllm '
                                        "engine's servers apply a grammar from the first token; send "
                                        'chat_template_kwargs {"enable_thinking": false}, or serve with --engine hf',
                                   param='tool_choice')
            c = dataclasses.replace(c, start_after=after)
        mine = None if forced is None else c.to_dict()
        for t in plan.branch.turns:
            theirs = calls[t.call].get('constraint') if t.call < len(calls) else None
            if theirs != mine:
                was = 'no grammar (tool_choice "auto" or "none")' if theirs is None else \
                    f'tool_choice {json.dumps(theirs["tool_choice"])}'
                raise GatewayError(400, f'tool_choice={shown}: this conversation\'s earlier turns were sampled under '
                                        f'{was}, and its record declares one grammar for every turn; keep tool_choice '
                                        'the same within a conversation, or open a new session', param='tool_choice')
        return None if forced is None else c

    def count_prompt(self, session: Session, req: ChatRequest) -> int:
        """The prompt length, in tokens, that a call of ``req`` would be planned with now (a change of state that
        changes nothing: the plan is undone; a dialect's token count).

        Raises:
            GatewayError: 400 as :meth:`prepare` for options or messages the template cannot take.
        """
        template = self.template(req.tools, self.request_options(req, session))
        self.take_images(session, req, template)
        try:
            plan = session.plan(req.messages, json.dumps(req.tools, sort_keys=True), template, self.family)
        except ValueError as e:
            raise GatewayError(400, f'messages: {e}', param='messages') from None
        session.abandon(plan)
        return len(plan.prompt_ids)

    def sample(self, p: 'Pending', on_token=None):
        """Sample a prepared call (an engine thread; touches no state).

        ``on_token(ids so far)`` is passed to an upstream that ``streams`` (else never called).

        Raises:
            GatewayError: 502 when the engine refuses the request or fails (names the engine's
                message); 503 when its server stopped answering.
        """
        streams = on_token is not None and getattr(self.upstream, 'streams', False)
        spec = p.req.spec if p.constraint is None else dataclasses.replace(p.req.spec, constraint=p.constraint)
        request = TurnRequest(p.plan.prompt_ids, spec, p.budget, p.seed, self.family.stop_ids(p.template),
                              on_token=on_token if streams else None, key=p.session.sid,
                              images=p.plan.branch.recorder.images or None)
        try:
            return self.upstream.sample(request)
        except EngineDied as e:
            raise GatewayError(503, f'the engine server stopped answering: {e}', type='server_error',
                               code='upstream_unavailable') from None
        except EngineError as e:
            raise GatewayError(502, f'the engine refused the call: {e}', type='server_error',
                               code='upstream_error') from None

    def parses_calls(self, req: ChatRequest) -> bool:
        """Whether a reply's call blocks become ``tool_calls``: the request offers ``tools`` (and ``tool_choice``
        is not none), or it offers none to a template that ignores tool schemas (the calls are the protocol
        then; docs/gateway.md#request-fields)."""
        return req.parses_calls or (req.tools is None and req.tool_choice != 'none' and not self.renders_tools)

    def drop(self, p: 'Pending') -> None:
        """Undo a prepared call whose sampling failed (a change of state)."""
        if p.plan is not None:
            p.session.abandon(p.plan)

    def complete(self, p: 'Pending', sample) -> tuple:
        """Journal and apply a sampled call (a change of state): ``(response dict, call index, False)``.

        The call is undelivered until :meth:`delivered` (every byte of its response handed to the
        connection) or a later call of its branch echoes it (docs/design.md#integrity).

        Raises:
            GatewayError: 409 when the session was finished while the call sampled; 503 when the journal
                cannot be written. Either way nothing is kept (no line, no branch change, no plan).
        """
        session, req, template = p.session, p.req, p.template
        if session.state != 'open':
            self.drop(p)
            raise GatewayError(409, f'the session was {session.state} while this call was sampled; open a new one',
                               code='session_closed')
        index = len(session.calls)
        ids, logp, stopped, hit = _cut_at_stop(template, sample.ids, sample.logp, req.stop)
        text = template.decode(ids)
        if stopped is not None:
            text = stopped
        elif ids and ids[-1] in self.family.stop_ids(template):     # the family's stops (Llama's <|eom_id|>)
            text = template.decode(ids[:-1])
        message = parse_reply(text, self.family.for_tools(req.tools), id_seed=f'{session.sid}/{index}',
                              tools=self.parses_calls(req), think_open=p.think)
        sample.ids, sample.logp = ids, logp
        truncated = sample.truncated and stopped is None
        response = self._response(session, index, req, p.plan.prompt_ids, sample, message,
                                  finish_reason(message, truncated), template)
        if hit is not None:                  # vLLM's choice field: the stop string that cut the turn
            response['choices'][0]['stop_reason'] = hit
        ev = {'ev': 'call', 'sid': session.sid, 'index': index, 'digest': p.digest, 'retry': p.retry,
              'req': _recorded(req, session.last_messages), 'ids': ids, 'logp': logp, 'truncated': truncated,
              'seed': sample.seed,
              'message': message, 'response': response, 'version': p.version, 'max_tokens': p.budget,
              't0': p.t0, 't': time.time()}
        if sample.server is not None:
            ev['server'] = sample.server
        constraint = None if p.constraint is None else p.constraint.to_dict()
        if constraint is not None:
            ev['constraint'] = constraint
        try:
            self._log(ev)
        except GatewayError:
            self.drop(p)                  # no line, no branch change, no plan: a resend continues as if never sent
            raise
        self._apply(session, p.plan, sample, message, truncated, p.digest, response, req, p.version, constraint)
        if p.images:
            self.keep_images(session, p.images)     # RUN/images now: a restart's commit finds them
        session.mark_undelivered(index)   # trained once :meth:`delivered` (or a later call echoing it)
        return response, index, False

    def _apply(self, session, plan, sample, message, truncated, digest, response, req, version,
               constraint=None) -> None:
        s = TurnResult(ids=sample.ids, logp=sample.logp, truncated=truncated, seed=sample.seed, server=sample.server)
        if session.spec is None:
            session.spec = req.spec
            session.template_kwargs = self.request_options(req)
        session.last_messages = req.messages
        session.commit(plan, s, message, {'index': len(session.calls), 'digest': digest, 'seed': sample.seed,
                                          'response': response, 'version': version, 'server': sample.server,
                                          'dialect': req.dialect, 'constraint': constraint})
        session.last_seen = time.time()

    def _response(self, session, index, req, prompt, sample, message, reason, template) -> dict:
        choice = {'index': 0, 'message': message, 'logprobs': None, 'finish_reason': reason}
        if req.logprobs:
            choice['logprobs'] = {'content': [
                {'token': (p := template.decode([i])), 'logprob': lp, 'bytes': list(p.encode()), 'top_logprobs': []}
                for i, lp in zip(sample.ids, sample.logp)]}
        out = {'id': f'chatcmpl-{session.sid[:12]}-{index}', 'object': 'chat.completion', 'created': int(time.time()),
               'model': self.upstream.model_name, 'choices': [choice],
               'usage': {'prompt_tokens': len(prompt), 'completion_tokens': len(sample.ids),
                         'total_tokens': len(prompt) + len(sample.ids)}}
        if req.return_token_ids:
            choice['token_ids'] = list(sample.ids)
            out['prompt_token_ids'] = list(prompt)
        return out

    def set_policy_version(self, version: str) -> None:
        """Stamp ``version`` on every call dispatched from now on (journalled; a change of state).

        Raises:
            GatewayError: 503 when the journal cannot be written (the version is unchanged).
        """
        self._log({'ev': 'policy', 'version': version, 't': time.time()})
        self.policy_version = version

    def delivered(self, session: Session, index: int) -> None:
        """Journal that every byte of call ``index``'s response was handed to the connection (a change of
        state); from then on its turn is trained. A call already delivered, or one the journal cannot
        take, is left as it is (unmarked: undelivered, in memory as after a restart)."""
        if session.state == 'committed' or session.calls[index].get('delivered'):
            return
        try:
            self._log({'ev': 'delivered', 'sid': session.sid, 'index': index}, sync=False)   # lost: undelivered
        except GatewayError:
            return
        session.mark_delivered(index)

    def undelivered(self, session: Session, index: int) -> None:
        """Journal that call ``index``'s response never reached the client (a change of state; a journal that
        cannot take it changes nothing: an unmarked call is undelivered anyway)."""
        try:
            self._log({'ev': 'undelivered', 'sid': session.sid, 'index': index}, sync=False)
        except GatewayError:
            pass
        session.mark_undelivered(index)

    # ------------------------------------------------------------------ finishing
    def finish(self, session: Session, reward: float, info: dict, aborted: bool = False) -> dict:
        """Commit a session's records (on the state thread): journal ``finish``, store, journal ``committed``.

        A session left ``finished`` by a commit that failed (its records could not be stored, here or
        at a restart) takes the finish again: the new reward and info are journalled and stored.
        Once committed the session leaves memory (:attr:`closed` keeps its description and stats).

        Raises:
            GatewayError: 409 when the session is already committed; 503 when the journal cannot be
                written or the records cannot be stored (names the error; the finish can be retried).
        """
        if session.state == 'committed':
            raise GatewayError(409, f'the session is already {session.state}', code='session_closed')
        self._log({'ev': 'finish', 'sid': session.sid, 'reward': reward, 'info': info, 'aborted': aborted})
        session.state, session.reward, session.info, session.aborted = 'finished', float(reward), dict(info), aborted
        try:
            return self._commit(session)
        except GatewayError:
            raise
        except Exception as e:  # noqa: BLE001 - the store's error, named; the session stays finished for a retry
            raise GatewayError(503, f'the records of session {session.sid} could not be stored ({type(e).__name__}: '
                                    f'{e}); the session stays finished: fix that and send the finish again',
                               type='server_error', code='store_failed') from None

    def _commit(self, session: Session) -> dict:
        recs = session_records(session, self.upstream.model_name, policy=getattr(self.upstream, 'policy', 'hf'),
                               spec_of=getattr(self.upstream, 'record_spec', None), family=self.family)
        if recs:
            self.writer().write(recs, images=session.images or None)   # RUN/images before the shard naming them
        session.state = 'committed'
        closed = {'describe': dict(session.describe(), records=len(recs)),
                  'stats': session_stats(session, len(recs))}
        try:
            self._log({'ev': 'committed', 'sid': session.sid, 'records': len(recs), **closed})
        except GatewayError:
            session.state = 'finished'      # stored (a resend of the same records is skipped); commit again later
            raise
        self._close(session, closed)
        self.write_summary()
        return closed['describe']

    def _close(self, session: Session, closed: dict) -> None:
        """A committed session leaves memory; what the summary, ``GET /sessions`` and the identity check need stays."""
        self.sessions.pop(session.sid, None)
        self.records[session.sid] = closed['stats']['records']
        self.closed[session.sid] = closed

    def describe(self, token: str) -> dict:
        """``GET /sessions/{token}``: the session's state, a committed one's as it was committed.

        Raises:
            GatewayError: 404 for an unknown token.
        """
        sid = session_id(token) if isinstance(token, str) else None
        if sid in self.closed:
            return self.closed[sid]['describe']
        return self.session(token).describe()

    def reap(self, now: float | None = None) -> int:
        """Commit, as aborted, every open session idle longer than the timeout (on the state thread)."""
        now = time.time() if now is None else now
        n = 0
        for s in list(self.sessions.values()):
            if s.state == 'open' and s.in_flight == 0 and now - s.last_seen > self.session_timeout:
                try:
                    self.finish(s, 0.0, {'aborted': 'session_timeout'}, aborted=True)
                except GatewayError:        # journal or store failing: it stays as it was left, for a retry
                    continue
                n += 1
        return n

    def write_summary(self) -> dict:
        """Rewrite ``RUN/summary.json`` with :func:`~agentrl.gateway.records.run_metrics`."""
        m = run_metrics(list(self.sessions.values()), self.records, [c['stats'] for c in self.closed.values()])
        summary = {'kind': 'gateway', 'model': self.upstream.model_name,
                   'policy': getattr(self.upstream, 'policy', 'hf'), 'trajectories': 'trajectories', **m}
        if getattr(self.upstream, 'logp_mode', None):
            summary['logp_mode'] = self.upstream.logp_mode
        atomic_write(self.out / 'summary.json', json.dumps(summary, indent=2) + '\n')
        return summary

    # ------------------------------------------------------------------ restart
    def _restore(self, events: list) -> None:
        """Fold the journal: sessions, their calls (re-planned, with the journalled samples), deliveries, ends.

        A session whose ``committed`` line holds its description and stats is not replayed: only its
        identity (for :meth:`open_session`'s check) and what the summary needs are kept
        (:attr:`closed`), so a restart costs the open sessions, not the run's history. In a session
        of format 2 (``v``, :data:`~agentrl.gateway.journal.JOURNAL_VERSION`) a call with no
        ``delivered`` line after it is undelivered (killed before its response left); in an older
        one a call is delivered unless marked ``undelivered``.
        """
        done = {ev['sid']: ev for ev in events if ev['ev'] == 'committed' and 'stats' in ev and 'describe' in ev}
        marks_delivery = set()
        for ev in events:
            kind, sid = ev['ev'], ev.get('sid')
            if kind == 'session':
                self.identities.add(*record_identity(ev['identity'], sid), sid)
                if sid not in done:
                    self.sessions[sid] = Session(sid, ev['identity'], ev['t'])
                    if isinstance(ev.get('v'), int) and ev['v'] >= 2:
                        marks_delivery.add(sid)
                continue
            if kind == 'policy':
                self.policy_version = ev['version']
                continue
            s = self.sessions.get(sid)
            if s is None:
                continue
            if kind == 'call':
                req = ChatRequest.from_recorded(_full(ev['req'], s.last_messages))
                plan = s.plan(req.messages, json.dumps(req.tools, sort_keys=True),
                              self.template(req.tools, self.request_options(req, s)), self.family)
                sample = TurnResult(ids=ev['ids'], logp=ev['logp'], truncated=ev['truncated'], seed=ev.get('seed'),
                                    server=ev.get('server'))
                self._apply(s, plan, sample, ev['message'], ev['truncated'], ev['digest'], ev['response'], req,
                            ev.get('version', '0'), ev.get('constraint'))
                if sid in marks_delivery:
                    s.mark_undelivered(ev['index'])
                s.last_seen = ev['t']
            elif kind == 'delivered':
                s.mark_delivered(ev['index'])
            elif kind == 'undelivered':
                s.mark_undelivered(ev['index'])
            elif kind == 'finish':
                s.state, s.reward, s.info, s.aborted = 'finished', float(ev['reward']), dict(ev['info']), ev['aborted']
            elif kind == 'committed':
                s.state = 'committed'
                self.records[s.sid] = ev['records']
        for sid, ev in done.items():
            self.closed[sid] = {'describe': ev['describe'], 'stats': ev['stats']}
            self.records[sid] = ev['records']
        for s in list(self.sessions.values()):
            if s.state == 'committed':          # an older journal's committed session: folded once, then closed
                n = self.records.get(s.sid, 0)
                self._close(s, {'describe': dict(s.describe(), records=n), 'stats': session_stats(s, n)})
            elif s.state == 'finished':          # killed between finish and commit: store again (resends skip)
                try:
                    self._commit(s)
                except Exception as e:  # noqa: BLE001 - one bad session must not keep the others from serving
                    import warnings
                    warnings.warn(f'session {s.sid}: its records could not be stored again ({type(e).__name__}: '
                                  f'{e}); it stays finished and uncommitted (a finish sent again stores it)')
            elif s.state == 'open':
                s.last_seen = max(s.last_seen, time.time())     # the restart is not idleness


def _reasoning_mark(family, template, prompt_ids) -> tuple:
    """The ids of the family's reasoning close mark when a turn after ``prompt_ids`` may reason first (the template
    knows the reasoning block and the prompt does not end in a closed one), else ``()``."""
    if family.think_close is None or family.think_open is None or family.think_open not in (template.source or ''):
        return ()
    if template.decode(list(prompt_ids[-8:])).rstrip().endswith(family.think_close):
        return ()
    return tuple(template.encode(family.think_close))


def _check_run(path: Path, fingerprint: dict) -> None:
    """Write ``RUN/run.json`` at a first start; at a restart refuse a model, tokenizer, template, family
    or template option other than the run was started with (a run.json without a fingerprint, from an
    older gateway, is accepted and gets this one).

    Raises:
        ValueError: one line naming the field, both values and the fix (a new ``--out``).
    """
    run = json.loads(path.read_text()) if path.is_file() else {'kind': 'gateway'}
    old = run.get('fingerprint')
    if old is None and run.get('model') not in (None, fingerprint['model']):
        old = {'model': run['model']}
    if old is not None:
        for field in ('model', 'tokenizer', 'template', 'family', 'options'):
            a, b = old.get(field), fingerprint[field]
            if field not in old or a == b:
                continue
            if field == 'options' and isinstance(a, dict):
                k = next(k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
                field, a, b = f'options.{k}', a.get(k, _UNSET), b.get(k, _UNSET)
            a, b = ('unset' if v is _UNSET else json.dumps(v) for v in (a, b))
            raise ValueError(f'--out {str(path.parent)!r} was started with {field}={a} and this start has {field}={b}; '
                             'restart with what it was started with, or serve into a new --out')
    if run.get('fingerprint') != fingerprint:
        atomic_write(path, json.dumps(dict(run, model=fingerprint['model'], fingerprint=fingerprint), indent=2) + '\n')


def _recorded(req: ChatRequest, last: list) -> dict:
    """The journal's form of a request: the messages after the ``prefix`` it shares with the session's
    previous call (a harness resends its whole history; journalling only the new part keeps a
    call's line O(1) in the conversation's length)."""
    msgs = req.messages
    k = min(len(last), len(msgs))
    while k and last[:k] != msgs[:k]:               # one C-level comparison in the common case
        k //= 2
    return dict(req.recorded(), messages=msgs[k:], prefix=k)


def _full(rec: dict, last: list) -> dict:
    """The inverse of :func:`_recorded` (a line without ``prefix`` holds every message)."""
    if 'prefix' not in rec:
        return rec
    return dict({k: v for k, v in rec.items() if k != 'prefix'}, messages=last[:rec['prefix']] + rec['messages'])


def _cut_at_stop(template, ids, logp, stops) -> tuple:
    """``(ids, logp, text before the stop string or None, the stop string or None)``: cut after the token
    completing the first stop string."""
    if not stops:
        return list(ids), list(logp), None, None
    full = template.decode(ids)
    hits = [(full.find(s), s) for s in stops if full.find(s) >= 0]
    if not hits:
        return list(ids), list(logp), None, None
    pos, s = min(hits)
    end = pos + len(s)
    k = next(k for k in range(1, len(ids) + 1) if len(template.decode(ids[:k])) >= end)
    return list(ids[:k]), list(logp[:k]), full[:pos], s
