"""L2: token-in/token-out recording of chat episodes through a real chat template.

:class:`ChatRecorder` keeps the ids the policy sampled, never re-encodes them, and appends
everything else as a **bridge** (:mod:`agentrl.templates.bridge`: the ids the template writes
between the end of a sampled turn and the next generation prompt; owners per docs/design.md#ownership).
"""
from __future__ import annotations

import json

import torch

from ..record import OWNER, Provenance, TokenLog, Trajectory
from .bridge import (Bridge, bridge_shape, cached_bridge, probe_message, probe_stability,  # noqa: F401
                     probe_turn_text, template_bridge, turn_kind)
from .chat import as_template, tokenizer_fingerprint
from .labels import label_checked
from .messages import check_messages, common_prefix
from .vision import expand_images, image_spans, own_images, vision_facts

__all__ = ['Bridge', 'ChatRecorder', 'template_bridge', 'HISTORY_MODES']

#: ``'template'``: the context of each turn is what the template renders for the conversation so
#: far (sampled ids reused wherever the template leaves them unchanged); ``'sampled'``: the
#: context is always the recorded sequence itself (the template's history rewriting is skipped).
HISTORY_MODES = ('template', 'sampled')
#: Rounds (assistant turn + its observations) of recent history rendered to derive a bridge.
_WINDOW_ROUNDS = 1
#: Distinct opening conversations whose labelled ids a template keeps (:meth:`ChatRecorder._opening_labels`).
_OPENINGS_CACHED = 256


class ChatRecorder:
    """Record a chat episode token-in/token-out: sampled ids as policy, bridges from the template.

    Start from the opening messages, then alternate :meth:`add_turn` (the ids the engine
    sampled, with their log-probs) and :meth:`add_messages` (tool results, user messages);
    feed :attr:`prompt_ids` to the engine before each turn; :meth:`finish` returns the record.

    Args:
        tokenizer: a Hugging Face tokenizer or a :class:`ChatTemplate`.
        messages: the opening conversation (system, user ...); rendered with the generation
            prompt. Assistant messages in it are prompt-owned (they were not sampled here).
        tools: tool schemas for ``tools=`` (MCP or OpenAI style); only with a tokenizer.
        history: one of :data:`HISTORY_MODES`. ``'template'`` (default) follows the template:
            where it rewrites history (e.g. Qwen3 drops earlier reasoning once a new user message
            arrives) the next context is its rendering and the record gets per-turn contexts.
            ``'sampled'`` continues the recorded sequence (one forward pass scores every turn; the
            model then sees history the template would not show), except where the template writes
            another end in place of a sampled stop (gpt-oss ``<|end|>`` for ``<|return|>``): the next
            context has the template's end (:attr:`Bridge.rewrite`) and the record gets per-turn contexts.
        **options: :class:`ChatTemplate` options such as ``enable_thinking=False``,
            ``stop_tokens``, ``chat_template``, ``content_text`` (``'plain'``: control-token text
            in tool, user, system and opening messages is encoded as ordinary text; ``'refuse'``:
            :class:`~agentrl.templates.ChatTemplate` raises ``ControlTextError``); only with a tokenizer.

    Attributes:
        template: the :class:`ChatTemplate`.
        prompt_ids: ``[L]`` ids to feed the engine for the next turn (a list copy).
        bridges: the :class:`Bridge` appended after each turn.

    Raises:
        ValueError: bad options or messages (names the field); ``tools=`` on a template that
            ignores tools (DeepSeek-V3, Llama 3.0): put the tool descriptions in the system message.

    Cost: O(total tokens). A bridge is rendered from the opening, the first round and the last
    round only, and its shape (template text with a slot per content) is reused while the
    messages' roles and non-content fields repeat (checked once with awkward content to be
    inserted verbatim; ``cache_bridges=False`` renders every bridge). With
    ``history='template'`` the full conversation is re-rendered only after message kinds that a
    two-round probe found to rewrite history. These assume the template depends on history
    through its structure, not its length or content; :meth:`finish` renders the whole
    conversation once and reports in ``info['template']`` whether the record matches it.

    Example:
        >>> rec = ChatRecorder(tok, [{'role': 'user', 'content': 'Fix clamp.'}], tools=tools)
        >>> text = rec.add_turn(sampled_ids, sampled_logp)     # engine output incl. <|im_end|>
        >>> next_prompt = rec.add_messages([{'role': 'tool', 'content': observation}])
        >>> traj = rec.finish(reward=1.0)

    Source: book chapter 5.4 (token-in/token-out) and 5.8 ("score turns against the context
    they were sampled in").
    """

    def __init__(self, tokenizer, messages, *, tools=None, history: str = 'template', cache_bridges: bool = True,
                 **options):
        if history not in HISTORY_MODES:
            raise ValueError(f'history={history!r}; use one of {HISTORY_MODES}')
        self.template = as_template(tokenizer, tools=tools, **options)
        self.history = history
        self.cache_bridges = bool(cache_bridges)
        opening, self._opening_images = expand_images(self.template, messages)
        self._opening = check_messages(opening)
        self._done_images: list = []               # images of messages added before the last turn
        self._pending_images: list = []            # images of the messages since the last turn
        self._messages = list(self._opening)       # conversation as messages (turns decoded)
        self._turn_index: list[int] = []           # index in _messages of each assistant turn
        self._log = TokenLog()                     # the record's tokens (the one writer)
        self._texts: list[str] = []                # text pieces of the record, in order
        self.bridges: list[Bridge] = []
        self._contexts: list = []                  # per turn: (start, None | list ctx ids)
        self._pending: list[dict] = []             # messages since the last turn
        self._bridge_mark = None                   # (len ids, len texts) before the pending bridge
        self._unterminated: list[int] = []
        self._closed_by_template: list[int] = []   # turns stopped at a non-end-of-turn stop id
        self._placeholder = False
        self._n_vocab = self._vocab_size()
        self._start_opening()

    # ------------------------------------------------------------------ per-template caches
    # What depends only on the template (and the opening messages) is computed once per template and kept in
    # its cache, so a recorder costs no tokenizer-wide call (``len(tokenizer)``: tens of ms on some
    # transformers versions) and a repeated opening (a group's episodes, a gateway's branches and records)
    # is labelled once.
    def _vocab_size(self) -> int:
        """``len(tokenizer)`` (ids are valid below it), computed once per template."""
        cache = self.template._cache
        if 'n_vocab' not in cache:
            cache['n_vocab'] = len(self.template.tokenizer)
        return cache['n_vocab']

    def _opening_labels(self) -> tuple:
        """``(ids, owners, text)`` of the opening rendered with the generation prompt, cached per template and
        opening (the last :data:`_OPENINGS_CACHED` distinct openings)."""
        try:
            key = json.dumps(self._opening, sort_keys=True)
        except (TypeError, ValueError):
            key = None
        cache = self.template._cache.setdefault('openings', {})
        hit = cache.get(key) if key is not None else None
        if hit is None:
            lab = label_checked(self.template, self._opening, self._opening_images, add_generation_prompt=True)
            pol, prm, tmpl = OWNER['policy'], OWNER['prompt'], OWNER['template']
            ctl = self.template.control_ids     # an opening assistant turn was not sampled here: its control
            owners = tuple((tmpl if i in ctl else prm) if o == pol else o   # tokens are the template's, its
                           for i, o in zip(lab.ids, lab.owner))             # text the prompt's
            hit = (tuple(lab.ids), owners, lab.text)
            if key is not None:
                if len(cache) >= _OPENINGS_CACHED:
                    cache.pop(next(iter(cache)))
                cache[key] = hit
        return hit

    # ------------------------------------------------------------------ state
    def _start_opening(self):
        ids, owners, text = self._opening_labels()
        self._log = TokenLog()
        self._log.append(list(ids), list(owners), -1)
        self._texts = [text]
        self._ctx = list(ids)                      # context for the next turn
        self._ctx_pieces = [(text, len(ids))]
        self._ctx_is_prefix = True

    @property
    def n_turns(self) -> int:
        """Number of sampled turns so far."""
        return len(self._turn_index)

    @property
    def prompt_ids(self) -> list:
        """``[L]`` ids the engine must continue for the next turn."""
        return list(self._log.ids) if self._ctx_is_prefix else list(self._ctx)

    @property
    def images(self) -> list:
        """Every image so far (:class:`~agentrl.templates.vision.PendingImage`), in the order of their placeholders:
        the images of :attr:`prompt_ids` (what the engine's processor gets with them)."""
        return self._opening_images + self._done_images + self._pending_images

    @property
    def image_data(self) -> dict:
        """``{digest: bytes}`` of :attr:`images`, as received."""
        return {img.digest: img.data for img in self.images}

    @property
    def messages(self) -> list:
        """The conversation so far as messages (sampled turns as decoded ``content``; list-of-parts content as its
        text, an image as its expanded image text, which a template renders as is but
        :func:`~agentrl.templates.labels.label_owners` refuses: label the messages you sent instead)."""
        return [dict(m) for m in self._messages]

    # ------------------------------------------------------------------ appending
    def add_turn(self, ids, logp=None, message: dict | None = None) -> str:
        """Append one sampled policy turn, ids exactly as the engine produced them.

        Args:
            ids: ``[n]`` sampled token ids, including the stop id the engine stopped at; a turn without
                one was cut off (docs/design.md#stops, e.g. Qwen3's ``<|endoftext|>``).
            logp: ``[n]`` float sampling log-probs (nats) of ``ids``; None records zeros and
                marks the record's provenance ``logp_placeholder``.
            message: the turn as a parsed assistant message (e.g. with ``tool_calls``), used
                wherever history is re-rendered (bridges, template-mode contexts, the final check);
                default ``{'role': 'assistant', 'content': decoded text}``.

        Returns:
            The decoded text of the turn without its end-of-turn token (for the environment's parser).

        Raises:
            ValueError: empty ``ids``, ``logp`` of another length, an id outside the vocabulary, or
                two turns with no message in between (add the observation first).
        """
        ids = ids.tolist() if hasattr(ids, 'tolist') else [int(i) for i in ids]
        if not ids:
            raise ValueError('add_turn: ids is empty; pass the sampled ids including the stop token')
        if self._turn_index and not self._pending:
            raise ValueError('add_turn: two turns in a row; call add_messages with the observation of the '
                             'previous turn first (or pass both samples as one turn)')
        n_vocab = self._n_vocab
        bad = [i for i in ids if not 0 <= i < n_vocab]
        if bad:
            raise ValueError(f'add_turn: ids {bad[:5]} are outside the vocabulary [0, {n_vocab}); '
                             'were they sampled with another tokenizer?')
        if logp is None:
            logp = [0.0] * len(ids)
            self._placeholder = True
        else:
            logp = logp.tolist() if hasattr(logp, 'tolist') else [float(x) for x in logp]
            if len(logp) != len(ids):
                raise ValueError(f'add_turn: logp has {len(logp)} entries but ids has {len(ids)}: '
                                 'pass one sampling log-prob per sampled id')
        k = len(self._turn_index)
        start = len(self._log)
        use_prefix = self._ctx_is_prefix
        self._contexts.append((start, None if use_prefix else list(self._ctx)))
        self._pending = []
        self._done_images += self._pending_images
        self._pending_images = []
        self._bridge_mark = None
        decoded = text = self.template.decode(ids)
        stop = self.template.stop_text(ids[-1])
        if stop is None:
            self._unterminated.append(k)
        content = text[:len(text) - len(stop)] if stop and text.endswith(stop) else text
        if stop is not None and not self.template.is_end_of_turn(ids[-1]):
            self._closed_by_template.append(k)    # kept (sampled); the template still writes its end-of-turn
            text = content                        # the stop id is the engine's, not rendered text
        self._log.append(ids, 'policy', k, logp)
        self._turn_text_at = len(self._texts)
        self._texts.append(text)
        self._turn_index.append(len(self._messages))
        if message is not None:
            msg = check_messages([dict(message, role=message.get('role', 'assistant'))], 'add_turn message')[0]
        else:
            msg = {'role': 'assistant', 'content': content}
        self._messages.append(msg)
        self._turn_piece = (text, ids)
        self._turn_texts = (decoded, content)       # with its stop, without: the bridge tells which is rendered
        return content

    def add_messages(self, messages) -> list:
        """Append tool results and/or user messages after the last turn, as the template bridges them.

        Calling it again before the next turn re-derives one bridge for all messages since the turn.

        Args:
            messages: message dicts (roles tool/user/system); a single dict is accepted.

        Returns:
            ``[L]`` the prompt ids for the next turn (also :attr:`prompt_ids`).

        Raises:
            ValueError: an assistant message (sampled turns go through :meth:`add_turn`), a bad
                message (a non-text content part), or a message the template drops.
            ControlTextError: control-token text in a message with ``content_text='refuse'``.
        """
        if isinstance(messages, dict):
            messages = [messages]
        expanded, images = expand_images(self.template, messages, 'add_messages')
        new = check_messages(expanded, 'add_messages')
        for i, m in enumerate(new):
            if m['role'] == 'assistant':
                raise ValueError(f'add_messages[{i}] is an assistant message: sampled turns must be added '
                                 'as ids with add_turn (token-in/token-out)')
        if not self._turn_index:  # still before the first turn: extend the opening
            self._opening += new
            self._opening_images = self._opening_images + images
            self._messages = list(self._opening)
            self._start_opening()
            return self.prompt_ids
        pending = self._pending + new
        turn_ids = self._turn_piece[1]
        stop = self.template.stop_text(turn_ids[-1])
        # derive the bridge first, so that an error leaves the recorder unchanged
        bridge = self._bridge(self._window(), pending, self.template.is_end_of_turn(turn_ids[-1]), stop)
        if self._bridge_mark is not None:  # replace the bridge of the earlier messages since the turn
            n_ids, n_texts = self._bridge_mark
            self._log.truncate(n_ids)
            del self._texts[n_texts:]
            del self._messages[len(self._messages) - len(self._pending):]
            self.bridges.pop()
            ctx, n_ctx, pieces, n_pieces, self._ctx_is_prefix = self._ctx_saved
            self._ctx, self._ctx_pieces = ctx, pieces   # contexts only grow in place or are replaced
            del ctx[n_ctx:], pieces[n_pieces:]
        else:
            self._ctx_saved = (self._ctx, len(self._ctx), self._ctx_pieces, len(self._ctx_pieces),
                               self._ctx_is_prefix)
        self._pending = pending
        self._pending_images = self._pending_images + images
        k = len(self._turn_index) - 1
        if stop is not None and self.template.end_of_turn_id is None:
            self._stop_is_header(k, stop, bridge.stop == stop)
        self._bridge_mark = (len(self._log), len(self._texts))
        owner = own_images(bridge.ids, bridge.owner, vision_facts(self.template)) if self._pending_images else bridge.owner
        self._log.append(bridge.ids, owner, k)
        self._texts.append(bridge.text)
        self._messages += self._pending
        self.bridges.append(bridge)
        if self.history == 'template':
            self._advance_context(bridge)
        elif bridge.rewrite or not self._ctx_is_prefix:
            self._continue_sampled(bridge)
        return self.prompt_ids

    def _bridge(self, history: list, new: list, terminated: bool, stop: str | None = None) -> Bridge:
        """The bridge after the last turn (:func:`~agentrl.templates.bridge.cached_bridge` unless ``cache_bridges`` is off)."""
        turn = self._messages[self._turn_index[-1]]
        if not self.cache_bridges:
            return template_bridge(self.template, history, new, terminated, turn=turn, sampled_stop=stop)
        return cached_bridge(self.template, history, turn, new, terminated, sampled_stop=stop)

    def _stop_is_header(self, k: int, stop: str, written: bool) -> None:
        """Turn ``k`` (the last) stopped at ``stop`` where the template writes no end-of-turn (GLM).

        ``written``: the template writes that same token next (the next message's role token), so the
        sampled id stands for it and the bridge starts after it. Otherwise the template writes another
        token there (a tool result's header after a turn that stopped at ``eos``): the sampled id is kept
        (policy) but is not rendered text, and the bridge starts with the template's own token, as
        for a stop that is not the end-of-turn (docs/design.md#stops).
        """
        text = self._turn_texts[0] if written else self._turn_texts[1]
        self._texts[self._turn_text_at] = text
        self._turn_piece = (text, self._turn_piece[1])
        closed = k in self._closed_by_template
        if written and closed:
            self._closed_by_template.remove(k)
        elif not written and not closed:
            self._closed_by_template.append(k)

    # ------------------------------------------------------------------ template history
    def _window(self) -> list:
        """Opening + first round + last rounds before the current turn (bounded size)."""
        cur = self._turn_index[-1]
        starts = self._turn_index[:-1]
        if len(starts) <= _WINDOW_ROUNDS + 1:
            return self._messages[:cur]
        first = self._messages[len(self._opening):starts[1]]
        return self._opening + first + self._messages[starts[-_WINDOW_ROUNDS]:cur]

    def _continue_sampled(self, bridge: Bridge) -> None:
        """``history='sampled'``: the next context is the last turn's context, its ids and the bridge, with the
        sampled stop replaced by what the template writes in history (``bridge.rewrite``, gpt-oss ``<|end|>``
        for ``<|return|>``): a server renders that, never both (docs/design.md#stops)."""
        start, ctx = self._contexts[-1]
        turn_ids = self._turn_piece[1]
        before = list(self._log.ids[:start]) if ctx is None else list(ctx)
        tail = turn_ids[:-1] + self.template.encode(bridge.rewrite) if bridge.rewrite else list(turn_ids)
        self._ctx = before + tail + list(bridge.ids)
        self._ctx_is_prefix = False

    def _advance_context(self, bridge: Bridge) -> None:
        turn_text, turn_ids = self._turn_piece
        pattern = tuple(m['role'] for m in self._pending)
        if not bridge.rewrite and self._stable(pattern, turn_kind(self.template, self._messages[self._turn_index[-1]])):
            self._ctx += turn_ids + bridge.ids
            self._ctx_pieces += [(turn_text, len(turn_ids)), (bridge.text, len(bridge.ids))]
            return
        full = self.template.render(self._messages, True)
        pieces = self._ctx_pieces + [(turn_text, len(turn_ids)), (bridge.text, len(bridge.ids))]
        flat = self._ctx + turn_ids + bridge.ids
        pos = n_ids = 0
        kept = []
        for text, n in pieces:
            if not full.startswith(text, pos):
                break
            kept.append((text, n))
            pos += len(text)
            n_ids += n
        rest = full[pos:]
        plain = [m.get('content') for m in self._messages if m['role'] != 'assistant']
        rest_ids = self.template.encode_plain(rest, plain) if rest else []
        self._ctx = flat[:n_ids] + rest_ids
        self._ctx_pieces = kept + ([(rest, len(rest_ids))] if rest else [])
        self._ctx_is_prefix = self._ctx_is_prefix and not rest and n_ids == len(flat)

    def _stable(self, pattern: tuple, kind: tuple) -> bool:
        """Whether appending messages with these roles after a turn of this :func:`~agentrl.templates.bridge.turn_kind`
        leaves the template's history unchanged (probed once per kind and pattern: Qwen3 keeps a tool-call turn's
        think block only when its reasoning is non-empty)."""
        key = ('stable', pattern, kind, tuple(m['role'] for m in self._opening))
        cache = self.template._cache
        if key not in cache:
            cache[key] = probe_stability(self.template, self._opening, pattern, turn=probe_message(kind))
        return cache[key]

    # ------------------------------------------------------------------ finishing
    def finish(self, reward: float = 0.0, info: dict | None = None, provenance: Provenance | None = None,
               verify: bool = True) -> Trajectory:
        """Freeze the episode into a :class:`~agentrl.record.Trajectory` (via ``Trajectory.from_tokens``).

        Args:
            reward: episode reward.
            info: the environment's final info (copied); ``info['template']`` is added.
            provenance: filled with the template and tokenizer fingerprints when empty.
            verify: render the whole conversation once and report whether the recorded text is
                the template's rendering (``info['template']['render_matches']``).

        Returns:
            Trajectory with ``ids [T]``, ``owner [T]``, ``turn [T]`` (-1 for the opening, k for
            turn k and the bridge after it), ``action_mask [T-1]`` and ``sample_logp [T-1]``
            aligned to ``ids[1:]``, and ``turn_contexts`` = ``[(start_k, context_ids [L_k])]``
            for every turn when any turn was sampled after a context that is not a prefix of
            ``ids`` (None otherwise).

        A last turn that stopped at a stop id other than the template's end-of-turn is closed here
        (docs/design.md#stops).
        ``info['template']`` reports ``unterminated_turns`` (cut off, no stop id),
        ``closed_by_template`` (stopped at another stop id), ``render_matches`` and
        ``chat_tokens``: the end-of-turn, stop and control ids and the ``content_text`` choice
        (:meth:`ChatTemplate.chat_tokens`), which the validator checks the record against (it is
        stored with the record, as ``info`` is); ``template_kwargs``, the options the template rendered
        with (``enable_thinking``, ``reasoning_effort`` ...), when it has any.

        Raises:
            ValueError: no turn was recorded.
        """
        if not self._turn_index:
            raise ValueError('finish: no turn recorded; call add_turn with the sampled ids first')
        info = dict(info or {})
        check = {'history': self.history, 'n_turns': self.n_turns,
                 'prefix_stable': all(c is None for _, c in self._contexts),
                 'unterminated_turns': list(self._unterminated),
                 'closed_by_template': list(self._closed_by_template),
                 'chat_tokens': self.template.chat_tokens()}
        if self.template.template_kwargs:           # what re-rendering the record needs (enable_thinking ...)
            check['template_kwargs'] = dict(self.template.template_kwargs)
        n_before, texts = len(self._log), list(self._texts)
        if (self._bridge_mark is None and self._closed_by_template
                and self._closed_by_template[-1] == self.n_turns - 1):
            self._log.append([self.template.end_of_turn_id], 'template', self.n_turns - 1)
            texts.append(self.template.end_of_turn_text)
        if self._bridge_mark is None and self.template.end_of_turn_id is None:
            stop = self.template.stop_text(self._turn_piece[1][-1])
            if stop and texts[-1].endswith(stop):   # the next header (GLM): no message follows it to render
                texts[-1] = texts[-1][:-len(stop)]
        if verify:
            recorded = ''.join(texts)
            full = self.template.render(self._messages, self._messages[-1]['role'] != 'assistant')
            check['render_matches'] = full.startswith(recorded)
            if not check['render_matches']:
                p = common_prefix(full, recorded)
                check['first_mismatch'] = {'char': p, 'recorded': recorded[p:p + 40], 'template': full[p:p + 40]}
        info['template'] = check
        if self.images:
            spans = image_spans(self._log.ids, self._log.owner, self.images, vision_facts(self.template))
            info['images'] = [sp.to_dict() for sp in spans]
        prov = provenance if provenance is not None else Provenance(policy='hf')
        if not prov.template:
            prov.template = self.template.fingerprint
        if not prov.tokenizer:
            prov.tokenizer = tokenizer_fingerprint(self.template.tokenizer)
        if self._placeholder:
            prov.logp_placeholder = True
        ids_t = torch.as_tensor(self._log.ids, dtype=torch.long)
        contexts = None
        if not check['prefix_stable']:
            contexts = [(s, ids_t[:s] if c is None else torch.as_tensor(c, dtype=torch.long))
                        for s, c in self._contexts]
        try:
            return self._log.freeze(reward, info, provenance=prov, turn_contexts=contexts)
        finally:
            self._log.truncate(n_before)      # finish may be called again
