"""L0: the grammar constraint a sampler runs under, and its allowed-token masks (xgrammar).

A :class:`Constraint` is a field of :class:`~agentrl.record.SamplingSpec` (``spec.constraint``):
its kind, its exact grammar text, the backend and version that compiled it and the stop ids the
grammar ends on. It is stored, digested and exported with the spec (``SamplingSpec.to_dict``);
a spec without one is unconstrained and keeps its bytes.

The mask is applied to the logits before every other sampler step (``-inf`` outside the
grammar's allowed tokens, then penalties, temperature, truncation), as vLLM's structured-output
path applies xgrammar's bitmask to the logits before its sampler; the stored log-prob (raw or
processed) is then over the allowed tokens. :class:`Grammar` compiles a constraint for one
tokenizer and vocabulary; :meth:`Grammar.next_bitmask` gives the masks of rows being sampled,
:meth:`Grammar.turn_bitmask` the masks of a recorded turn (the replay), :func:`mask_logits` applies one.

Source: docs/grammar.md; vLLM 0.32 ``v1/structured_output/backend_xgrammar.py`` (JSON schemas
compiled with ``any_whitespace=True``, the request's stop ids as the matcher's stop tokens) and
``tool_parsers/structural_tag_registry.py`` (the hermes tool-call tags).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ._lazy import lazy_module

torch = lazy_module('torch')

__all__ = ['CONSTRAINT_KINDS', 'GRAMMAR_BACKENDS', 'GRAMMAR_STARTS', 'Constraint', 'ConstraintError',
           'GrammarRejection', 'tool_call_constraint', 'json_schema_constraint', 'response_format_constraint', 'backend_version',
           'request_constraint', 'Grammar', 'unpack_bitmask', 'apply_allowed', 'mask_logits', 'support_sizes', 'forced_rows', 'mask_forced']

#: ``json_schema``: a JSON schema (text = the schema); ``regex``; ``grammar``: GBNF/EBNF (xgrammar's);
#: ``tool_call``: hermes ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks (text = the
#: xgrammar structural tag built from ``tools`` and ``tool_choice``).
CONSTRAINT_KINDS = ('json_schema', 'regex', 'grammar', 'tool_call')
#: Backends whose masks agentrl can rebuild.
GRAMMAR_BACKENDS = ('xgrammar',)
#: Where a server applies a constrained request's grammar in a turn: ``turn`` (from its first token) or
#: ``reasoning`` (after the reasoning close mark: :attr:`Constraint.start_after`).
GRAMMAR_STARTS = ('turn', 'reasoning')


class ConstraintError(ValueError):
    """A constraint that cannot be built or rebuilt here (bad kind, unknown backend or version, a text
    the backend does not compile, xgrammar not installed)."""


class GrammarRejection(ValueError):
    """The grammar rejects a recorded token. Attributes: ``position`` (index into the sequence),
    ``token`` (the id)."""

    def __init__(self, position: int, token: int):
        self.position, self.token = int(position), int(token)
        super().__init__(f'the grammar rejects token {self.token} at position {self.position}')


def backend_version(backend: str = 'xgrammar') -> str:
    """The installed version of ``backend`` ('' when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(backend)
    except PackageNotFoundError:
        return ''


@dataclass(frozen=True)
class Constraint:
    """The grammar in force over every policy turn (each turn starts the grammar afresh, at its first token or
    after its reasoning, ``start_after``).

    Attributes:
        kind: one of :data:`CONSTRAINT_KINDS`.
        text: the exact grammar text compiled (JSON schema, regex, grammar, or structural-tag JSON).
        backend: one of :data:`GRAMMAR_BACKENDS`. version: the backend version that sampled.
        stop_ids: the end-of-turn ids the grammar may end on (sorted ints).
        tool_choice: ``tool_call`` only: ``'required'`` or the forced tool's name.
        tools: ``tool_call`` only: the tool schemas as JSON text.
        start_after: where the grammar starts in each turn. ``()`` (the default): at the turn's first sampled
            token. Otherwise the ids of the reasoning close mark (Qwen3: ``(151668,)``, ``</think>``): the
            turn's tokens up to and including the first complete occurrence of these ids are sampled
            unconstrained, the grammar starts at the token after it, and a turn that never closes its
            reasoning is unconstrained throughout (:meth:`grammar_start`). This is the two-phase structured
            output of vLLM with a reasoning parser and of SGLang's reasoner grammar (docs/grammar.md).

    Raises:
        ValueError: a kind or backend outside the lists, an empty text, ``tool_choice`` on another kind,
            a negative id in ``start_after``.
    """
    kind: str
    text: str
    backend: str = 'xgrammar'
    version: str = ''
    stop_ids: tuple = field(default=())
    tool_choice: str = ''
    tools: str = ''
    start_after: tuple = field(default=())

    def __post_init__(self):
        if self.kind not in CONSTRAINT_KINDS:
            raise ValueError(f'Constraint.kind must be one of {CONSTRAINT_KINDS}, got {self.kind!r}')
        if not isinstance(self.text, str) or not self.text:
            raise ValueError('Constraint.text must be the non-empty grammar text')
        if not self.backend:
            raise ValueError(f'Constraint.backend must name the grammar library (one of {GRAMMAR_BACKENDS})')
        if (self.tool_choice or self.tools) and self.kind != 'tool_call':
            raise ValueError(f'Constraint.tool_choice / tools belong to kind tool_call, not {self.kind!r}')
        object.__setattr__(self, 'stop_ids', tuple(sorted({int(i) for i in self.stop_ids})))
        after = tuple(int(i) for i in self.start_after)
        if any(i < 0 for i in after):
            raise ValueError(f'Constraint.start_after must be token ids (>= 0), got {list(after)}')
        object.__setattr__(self, 'start_after', after)

    def grammar_start(self, turn_ids) -> int | None:
        """Where the grammar starts in a turn: the index into ``turn_ids`` (the turn's sampled ids so far) of
        its first constrained token; 0 without ``start_after``; None while the turn has not closed its
        reasoning (every token so far, and the next one, unconstrained)."""
        mark = self.start_after
        if not mark:
            return 0
        ids, n = [int(i) for i in turn_ids], len(mark)
        for p in range(len(ids) - n + 1):
            if ids[p] == mark[0] and tuple(ids[p:p + n]) == mark:
                return p + n
        return None

    def to_dict(self) -> dict:
        """JSON-serialisable form (``tool_choice`` / ``tools`` only for ``tool_call``; ``start_after`` only when set,
        so a constraint from the turn's first token keeps the bytes and digest it had before the field existed)."""
        d = {'kind': self.kind, 'text': self.text, 'backend': self.backend, 'version': self.version,
             'stop_ids': list(self.stop_ids)}
        if self.kind == 'tool_call':
            d.update(tool_choice=self.tool_choice, tools=self.tools)
        if self.start_after:
            d['start_after'] = list(self.start_after)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> 'Constraint':
        """Inverse of :meth:`to_dict`. Raises ValueError on an unknown key (naming it)."""
        known = ('kind', 'text', 'backend', 'version', 'stop_ids', 'tool_choice', 'tools', 'start_after')
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f'Constraint: unknown key(s) {unknown}; known: {list(known)}')
        return cls(**d)


def _tool(t: dict) -> tuple:
    """``(name, parameters schema)`` of an OpenAI (``{'type': 'function', 'function': ...}``), plain or
    MCP (``inputSchema``) tool schema."""
    f = t.get('function', t)
    name = f.get('name')
    if not name:
        raise ConstraintError(f'tool schema without a name: {json.dumps(t)[:80]}; pass OpenAI or MCP tool schemas')
    params = f.get('parameters', f.get('inputSchema'))
    return name, (params if params is not None else True)


def tool_call_constraint(tools, tool_choice: str = 'required', stop_ids=()) -> Constraint:
    """The ``tool_call`` constraint of ``tool_choice`` over ``tools``: one or more hermes tool calls.

    ``'required'``: one or more ``<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>`` blocks
    (or the same without the newlines), ARGS valid under the tool's parameter schema; a tool name:
    exactly one call of that tool. The same structural tag vLLM 0.32 builds for ``tool_choice`` with
    ``--tool-call-parser hermes``.

    Args:
        tools: OpenAI, plain or MCP tool schemas (non-empty). tool_choice: ``'required'`` or a name.
        stop_ids: the end-of-turn ids.

    Returns:
        :class:`Constraint` of kind ``tool_call``, version the installed xgrammar's.

    Raises:
        ConstraintError: no tools, an unnamed tool, or ``tool_choice`` naming no tool
            (``'auto'`` / ``'none'`` constrain nothing: pass no constraint).
    """
    tools = list(tools or [])
    named = [_tool(t) for t in tools]
    if not named:
        raise ConstraintError(f'tool_choice {tool_choice!r} needs at least one tool schema')
    if tool_choice != 'required':
        named = [(n, p) for n, p in named if n == tool_choice]
        if not named:
            raise ConstraintError(f'tool_choice {tool_choice!r} names no tool of {[_tool(t)[0] for t in tools]}; '
                                  "pass 'required' or one of those names")
    tags = [{'type': 'tag', 'begin': begin + name + '", "arguments": ',
             'content': {'type': 'json_schema', 'json_schema': params}, 'end': end}
            for name, params in named
            for begin, end in (('<tool_call>\n{"name": "', '}\n</tool_call>'), ('<tool_call>{"name": "', '}</tool_call>'))]
    fmt = {'type': 'tags_with_separator', 'tags': tags, 'separator': '', 'at_least_one': True,
           'stop_after_first': tool_choice != 'required'}
    return Constraint('tool_call', json.dumps({'type': 'structural_tag', 'format': fmt}), 'xgrammar',
                      backend_version(), tuple(stop_ids), tool_choice, json.dumps(tools))


def json_schema_constraint(schema, stop_ids=()) -> Constraint:
    """A ``json_schema`` constraint (``schema``: a dict, or its JSON text kept as given; key order is the
    order the grammar writes properties in)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return Constraint('json_schema', text, 'xgrammar', backend_version(), tuple(stop_ids))


def response_format_constraint(response_format: dict, stop_ids=()) -> Constraint | None:
    """The constraint of an OpenAI ``response_format``: ``json_schema`` (its ``json_schema.schema``),
    ``json_object`` (any object); ``text`` gives None.

    Raises:
        ConstraintError: another type, or a ``json_schema`` without its schema.
    """
    kind = response_format.get('type')
    if kind in (None, 'text'):
        return None
    if kind == 'json_object':
        return json_schema_constraint({'type': 'object'}, stop_ids)
    if kind == 'json_schema':
        js = response_format.get('json_schema') or {}
        schema = js.get('schema', js.get('json_schema'))
        if schema is None:
            raise ConstraintError("response_format json_schema has no 'schema'; pass {'type': 'json_schema', "
                                  "'json_schema': {'name': ..., 'schema': {...}}}")
        return json_schema_constraint(schema, stop_ids)
    raise ConstraintError(f"response_format type {kind!r} is not supported; use 'json_schema', 'json_object' or 'text'")


# ---------------------------------------------------------------------------------------------
# compiled grammars and masks

_INFO: dict = {}          # (id(tokenizer), vocab_size) -> (tokenizer, TokenizerInfo, GrammarCompiler)
_BITS = None


def _xgrammar(c: Constraint):
    if c.backend not in GRAMMAR_BACKENDS:
        raise ConstraintError(f'backend {c.backend!r} is not one agentrl can rebuild (known: {GRAMMAR_BACKENDS})')
    have = backend_version(c.backend)
    if not have:
        raise ConstraintError('xgrammar is not installed; pip install "agentrl[grammar]" (xgrammar==0.2.8)')
    if c.version and c.version != have:
        raise ConstraintError(f'the constraint was compiled by xgrammar {c.version} but {have} is installed; '
                              f'install xgrammar=={c.version} to rebuild its masks exactly')
    import xgrammar
    return xgrammar


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[n, W]`` int32 xgrammar bitmask -> ``[n, vocab_size]`` bool (True: allowed; bit ``i % 32`` of word ``i // 32``)."""
    global _BITS
    if _BITS is None:
        _BITS = torch.arange(32, dtype=torch.int32)
    return ((bitmask.unsqueeze(-1) >> _BITS) & 1).bool().flatten(-2)[..., :vocab_size]


def apply_allowed(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[n, V]`` with ``-inf`` where ``allowed`` ``[n, V]`` bool is False (a new tensor)."""
    return logits.masked_fill(~allowed.to(logits.device), float('-inf'))


def mask_logits(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[n, V]`` with ``-inf`` outside ``bitmask`` ``[n, W]`` int32, **in place** for float32 / float16 /
    bfloat16 (xgrammar's kernel, about 5x faster than unpacking), else a new tensor; returns the masked logits."""
    if logits.dtype in (torch.float32, torch.float16, torch.bfloat16):
        import xgrammar
        xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=logits.shape[-1])
        return logits
    return apply_allowed(logits, unpack_bitmask(bitmask, logits.shape[-1]))


def support_sizes(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[n]`` int64: allowed tokens per row of a ``[n, W]`` int32 bitmask (ids below ``vocab_size``)."""
    x = bitmask.long() & 0xFFFFFFFF
    if vocab_size % 32 and x.shape[-1] * 32 > vocab_size:       # bits past the vocabulary never count
        x[..., vocab_size // 32] &= (1 << (vocab_size % 32)) - 1
        x = x[..., :vocab_size // 32 + 1]
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    return ((x * 0x01010101) & 0xFFFFFFFF).__rshift__(24).sum(-1)


class Grammar:
    """A :class:`Constraint` compiled by its backend for one tokenizer and vocabulary size.

    Args:
        constraint: the constraint. tokenizer: the Hugging Face tokenizer the ids belong to.
        vocab_size: the model's logits width ``V`` (may exceed the tokenizer's size; the extra ids are
            never allowed).

    Attributes:
        constraint, vocab_size; ``forced``: single-token supports seen by :meth:`next_bitmask`.

    Raises:
        ConstraintError: unknown backend, another backend version installed, or a text that does not
            compile (the backend's message).
    """

    def __init__(self, constraint: Constraint, tokenizer, vocab_size: int):
        xgr = self._xgr = _xgrammar(constraint)
        self.constraint, self.vocab_size = constraint, int(vocab_size)
        key = (id(tokenizer), self.vocab_size)
        if key not in _INFO:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
            _INFO[key] = (tokenizer, info, xgr.GrammarCompiler(info, max_threads=1))
        compiler = _INFO[key][2]
        c = constraint
        try:
            if c.kind == 'json_schema':
                self.compiled = compiler.compile_json_schema(c.text, any_whitespace=True)
            elif c.kind == 'regex':
                self.compiled = compiler.compile_regex(c.text)
            elif c.kind == 'grammar':
                self.compiled = compiler.compile_grammar(c.text)
            else:
                self.compiled = compiler.compile_structural_tag(c.text)
        except Exception as e:       # the backend's own error types (RuntimeError, ValueError, InvalidJSONError)
            raise ConstraintError(f'{c.backend} does not compile the {c.kind} constraint: '
                                  f'{" ".join(str(e).split())[:300]}') from None
        self._live: dict = {}
        self.forced = 0

    def matcher(self):
        """A fresh matcher at the start of a turn."""
        stops = list(self.constraint.stop_ids) or None
        return self._xgr.GrammarMatcher(self.compiled, override_stop_tokens=stops)

    def _bitmask(self, n: int) -> torch.Tensor:
        return self._xgr.allocate_token_bitmask(n, self.vocab_size)

    def next_bitmask(self, turns) -> torch.Tensor:
        """The allowed next tokens of rows being sampled.

        Args:
            turns: n id lists, each the turn's ids sampled so far (``[]`` at the turn's start).

        Returns:
            ``[n, W]`` int32 xgrammar bitmask (:func:`mask_logits`, :func:`unpack_bitmask`). A row whose turn
            has not reached the grammar's start (:meth:`Constraint.grammar_start`: still inside its reasoning)
            allows every token. Matchers are kept between calls (keyed by the turn's constrained ids), so a
            step advances each row by its newest token; :attr:`forced` counts the rows whose support is one token.

        Raises:
            GrammarRejection: a row's ids include a token the grammar rejects (``position``: index in its turn).
        """
        bm = self._bitmask(len(turns))
        live, keep = self._live, {}
        for r, ids in enumerate(turns):
            start = self.constraint.grammar_start(ids)
            if start is None:                  # inside the reasoning: the row stays all-allowed
                continue
            key = tuple(ids[start:])
            m = live.pop(key[:-1], None) if key else None
            if m is not None:
                _accept(m, key[-1], start + len(key) - 1)
            else:
                m = self.matcher()
                for p, t in enumerate(key):
                    _accept(m, t, start + p)
            m.fill_next_token_bitmask(bm, r)
            keep[key] = m
        self._live = keep               # rows that ended this step leave with their matchers
        self.forced += int((support_sizes(bm, self.vocab_size) == 1).sum())
        return bm

    def next_allowed(self, turns) -> torch.Tensor:
        """:meth:`next_bitmask` unpacked: ``[n, V]`` bool."""
        return unpack_bitmask(self.next_bitmask(turns), self.vocab_size)

    def turn_bitmask(self, ids, start: int, rows) -> torch.Tensor:
        """Allowed tokens at prediction rows of one recorded turn that starts at ``ids[start]``.

        Args:
            ids: ``[L]`` the sequence. start: the position of the turn's first sampled token.
            rows: ``[n]`` increasing prediction rows ``>= start - 1`` (row j predicts ``ids[j+1]``).

        Returns:
            ``[n, W]`` int32 bitmask; the rows that predict a token before the grammar's start
            (:meth:`Constraint.grammar_start` over the turn's ids) allow every token.

        Raises:
            GrammarRejection: the grammar rejects ``ids[p]`` for some ``p`` from the grammar's start to
                ``rows[-1]`` (``position``: p in the sequence).
        """
        rows = [int(r) for r in rows]
        ids = [int(i) for i in ids[:rows[-1] + 2]] if rows else []
        bm = self._bitmask(len(rows))
        g = self.constraint.grammar_start(ids[start:])
        if g is None:
            return bm                              # the turn never closed its reasoning: unconstrained
        g += start
        m = self.matcher()
        p = g
        for i, r in enumerate(rows):
            if r < g - 1:                          # predicts a token before the grammar's start
                continue
            while p <= r:                          # feed the turn's ids up to the predicted one
                _accept(m, ids[p], p)
                p += 1
            m.fill_next_token_bitmask(bm, i)
        return bm

    def turn_allowed(self, ids, start: int, rows) -> torch.Tensor:
        """:meth:`turn_bitmask` unpacked: ``[n, V]`` bool."""
        return unpack_bitmask(self.turn_bitmask(ids, start, rows), self.vocab_size)


def _accept(m, token: int, position: int) -> None:
    if m.is_terminated() or not m.accept_token(int(token)):
        raise GrammarRejection(position, token)


# ---------------------------------------------------------------------------------------------
# forced tokens of a record


def forced_rows(record) -> torch.Tensor:
    """``[T-1]`` bool: the trained rows a record's declared grammar forced (its support held one token).

    A forced token's stored log-prob is exactly 0.0 under the mask (either log-prob mode: the mask comes
    first), and it carries no policy gradient. A record without a declared constraint has none.

    Args:
        record: a :class:`~agentrl.record.Trajectory` (``action_mask``, ``sample_logp``, ``provenance``).

    Returns:
        ``[T-1]`` bool tensor (all False without a constraint or log-probs).
    """
    mask = torch.as_tensor(record.action_mask) > 0
    prov = record.provenance
    spec = None if prov is None else prov.sampling
    if spec is None or spec.constraint is None or record.sample_logp is None or prov.logp_placeholder:
        return torch.zeros_like(mask)
    return mask & (torch.as_tensor(record.sample_logp) == 0)


def mask_forced(record):
    """A copy of ``record`` whose ``action_mask`` leaves out its :func:`forced_rows` (``--mask-forced``);
    the record itself when it has none."""
    from dataclasses import replace
    rows = forced_rows(record)
    if not bool(rows.any()):
        return record
    return replace(record, action_mask=torch.as_tensor(record.action_mask).masked_fill(rows, 0))


def request_constraint(request: dict, stop_ids=()) -> Constraint | None:
    """The constraint an OpenAI-compatible request asked the server for, or None (unconstrained).

    Read in vLLM 0.32's order of precedence: ``structured_outputs`` (``json``, ``regex``, ``grammar``,
    ``json_object``, ``structural_tag``; older servers' ``guided_json`` / ``guided_regex`` / ``guided_grammar``;
    SGLang ``/generate``'s ``sampling_params`` ``json_schema`` / ``regex`` / ``ebnf`` / ``structural_tag``),
    then ``tool_choice`` (``'required'`` or ``{'type': 'function', 'function': {'name': ...}}``, with ``tools``: the
    hermes structural tag, :func:`tool_call_constraint`), then ``response_format``. ``'auto'`` / ``'none'`` constrain
    nothing. The version recorded is the installed xgrammar's (the server's must be the same, docs/grammar.md).
    The constraint starts at the turn's first token; where the server applied it only after the reasoning, the
    importer sets ``start_after`` (:func:`agentrl.interop.from_openai`, ``grammar_start``).

    Args:
        request: the request body. stop_ids: the ids the server's matcher stops on (vLLM: the request's
            ``stop_token_ids`` and, unless ``ignore_eos``, the EOS id).

    Returns:
        :class:`Constraint` or None.

    Raises:
        ConstraintError: a ``choice`` list (not replayable here), a bad ``response_format``, a tool name not in ``tools``.
    """
    so = dict(request.get('structured_outputs') or {})
    for old, new in (('guided_json', 'json'), ('guided_regex', 'regex'), ('guided_grammar', 'grammar')):
        if request.get(old) is not None:
            so.setdefault(new, request[old])
    sglang = request.get('sampling_params') or {}
    for old, new in (('json_schema', 'json'), ('regex', 'regex'), ('ebnf', 'grammar'),
                     ('structural_tag', 'structural_tag')):
        if sglang.get(old) is not None:
            so.setdefault(new, sglang[old])
    so = {k: v for k, v in so.items() if v is not None and v is not False and k in
          ('json', 'regex', 'grammar', 'json_object', 'structural_tag', 'choice')}
    stop_ids = tuple(stop_ids)
    if 'choice' in so:
        raise ConstraintError("structured_outputs 'choice' is not supported; send the choices as a regex")
    if 'json' in so:
        return json_schema_constraint(so['json'], stop_ids)
    if 'json_object' in so:
        return json_schema_constraint({'type': 'object'}, stop_ids)
    for key, kind in (('regex', 'regex'), ('grammar', 'grammar'), ('structural_tag', 'tool_call')):
        if key in so:
            text = so[key] if isinstance(so[key], str) else json.dumps(so[key])
            return Constraint(kind, text, 'xgrammar', backend_version(), stop_ids)
    choice = request.get('tool_choice')
    if isinstance(choice, dict):
        choice = (choice.get('function') or {}).get('name') or choice.get('name')
    if choice not in (None, 'auto', 'none') and request.get('tools'):
        return tool_call_constraint(request['tools'], choice, stop_ids)
    if request.get('response_format'):
        return response_format_constraint(request['response_format'], stop_ids)
    return None
