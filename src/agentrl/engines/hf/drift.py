"""L4: the retokenization-drift experiment of chapter 5.4, and the drift rate of a rollout file.

Sample continuations, decode each to text, encode the text again, and compare ids: where they
differ, a trainer that re-encodes text would score tokens the model never sampled. The records
themselves are never changed (token-in/token-out keeps the sampled ids); this only measures.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...families import family_for
from ...record import SamplingSpec
from ...templates import ChatTemplate, audit_drift
from ...templates.audit import _first_diff
from ...templates.chat import as_template
from ...sampling import episode_seed
from .sampler import HFSampler

__all__ = ['DRIFT_PROMPT', 'DriftSample', 'DriftExperiment', 'drift_experiment', 'DriftRate', 'drift_rate']

#: The chapter's prompt for the drift experiment. Source: book chapter 5.4.
DRIFT_PROMPT = 'Write a python function clamp(x, lo, hi).'


@dataclass
class DriftSample:
    """One sampled continuation and its decode/re-encode round trip.

    Attributes:
        index: sample number. ids: the sampled ids. reencoded: ids of ``encode(decode(ids))``.
        drifted: ``reencoded != ids``.
        at: first differing position (None when not drifted).
        sampled_tokens, reencoded_tokens: the two tokens from ``at`` on each side (token strings).

    Source: book chapter 5.4.
    """
    index: int
    ids: list
    reencoded: list
    drifted: bool
    at: int | None = None
    sampled_tokens: list = field(default_factory=list)
    reencoded_tokens: list = field(default_factory=list)

    def line(self) -> str:
        """The chapter's one-line form, e.g. ``drift at token 74: sampled ['-', 'hi'] -> re-encoded ['-h', 'i']``."""
        return (f'sample {self.index}: drift at token {self.at}: sampled {self.sampled_tokens} '
                f'-> re-encoded {self.reencoded_tokens}')


@dataclass
class DriftExperiment:
    """Result of :func:`drift_experiment`.

    Attributes:
        samples: one :class:`DriftSample` per continuation.
        spec: the sampler. prompt_len: prompt tokens. tokens: the token budget per sample.

    Source: book chapter 5.4 (one of eight 128-token Qwen3-0.6B samples drifted).
    """
    samples: list
    spec: SamplingSpec
    prompt_len: int
    tokens: int

    @property
    def n_drifted(self) -> int:
        """Number of samples whose round trip changes the ids."""
        return sum(s.drifted for s in self.samples)

    @property
    def n_tokens(self) -> int:
        """Sampled tokens in total."""
        return sum(len(s.ids) for s in self.samples)

    def format(self) -> str:
        """Human-readable report: one line per drifting sample and a summary line."""
        lines = [s.line() for s in self.samples if s.drifted]
        lines.append(f'{self.n_drifted} of {len(self.samples)} samples drift ({self.n_tokens} sampled tokens, '
                     f'temperature {self.spec.temperature}, top_k {self.spec.top_k}, top_p {self.spec.top_p})')
        return '\n'.join(lines)


def drift_experiment(model, tokenizer, *, samples: int = 8, tokens: int = 128, spec: SamplingSpec | None = None,
                     prompt: str = DRIFT_PROMPT, seed: int = 0, stop_at_end_of_turn: bool = True,
                     batch_size: int = 32) -> DriftExperiment:
    """Sample continuations of a chat prompt, decode, re-encode, and report which drift.

    The prompt is the template's rendering of one user message with the generation prompt,
    encoded once. Each sample ``i`` draws with ``torch.Generator().manual_seed(seed * 2**20 + i)``.

    Args:
        model: a transformers causal LM. tokenizer: its Hugging Face tokenizer.
        samples: number of continuations. tokens: token budget of each.
        spec: the sampler (default temperature 1.0 and no truncation, as in the chapter).
        prompt: the user message.
        seed: run seed.
        stop_at_end_of_turn: stop a sample at the family's stop ids (kept), as ``generate``
            stops at ``eos``; False samples exactly ``tokens`` tokens.
        batch_size: samples per sampler call.

    Returns:
        :class:`DriftExperiment`.

    Raises:
        ImportError: without the ``hf`` extra. ValueError: ``samples`` or ``tokens`` < 1.

    Example:
        On Qwen3-0.6B the chapter found 1 of 8 128-token samples drifting:
        ``drift at token 74: sampled ['-', 'hi'] -> re-encoded ['-h', 'i']``.

    Source: book chapter 5.4 (the retokenization drift experiment).
    """
    if samples < 1 or tokens < 1:
        raise ValueError(f'drift_experiment: samples and tokens must be >= 1, got {samples}, {tokens}')
    spec = spec if spec is not None else SamplingSpec()
    template = ChatTemplate(tokenizer)
    prompt_ids = template.encode(template.render([{'role': 'user', 'content': prompt}], True))
    stop = family_for(template).stop_ids(template) if stop_at_end_of_turn else ()
    sampler = HFSampler(model, stop, spec, max_new_tokens=tokens,
                        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else None)
    out = []
    for start in range(0, samples, batch_size):
        idx = list(range(start, min(samples, start + batch_size)))
        gens = [torch.Generator().manual_seed(episode_seed(seed, f'{seed}/drift', f'{seed}/drift/{i}')) for i in idx]
        for i, t in zip(idx, sampler.sample([prompt_ids] * len(idx), gens)):
            again = template.encode(template.decode(t.ids))
            s = DriftSample(index=i, ids=list(t.ids), reencoded=again, drifted=again != t.ids)
            if s.drifted:
                s.at = _first_diff(t.ids, again)
                s.sampled_tokens = template.tokens(t.ids[s.at:s.at + 2])
                s.reencoded_tokens = template.tokens(again[s.at:s.at + 2])
            out.append(s)
    return DriftExperiment(samples=out, spec=spec, prompt_len=len(prompt_ids), tokens=tokens)


@dataclass
class DriftRate:
    """Drift of the policy spans of a set of records.

    Attributes:
        records: records read. spans: policy spans (one per sampled turn).
        policy_tokens: sampled tokens in all spans.
        drifting_spans: spans whose decode/re-encode differs from the sampled ids.
        affected_tokens: policy tokens from each drifting span's first difference to its end
            (what a re-encoding trainer would score wrongly).
        examples: up to ``max_examples`` ``(record index, SpanDrift)`` pairs.

    Source: book chapter 5.4.
    """
    records: int
    spans: int
    policy_tokens: int
    drifting_spans: int
    affected_tokens: int
    examples: list = field(default_factory=list)

    @property
    def per_1000(self) -> float:
        """Drifting spans per 1,000 policy tokens (NaN with no policy tokens)."""
        return 1000.0 * self.drifting_spans / self.policy_tokens if self.policy_tokens else float('nan')

    @property
    def affected_per_1000(self) -> float:
        """Affected tokens per 1,000 policy tokens."""
        return 1000.0 * self.affected_tokens / self.policy_tokens if self.policy_tokens else float('nan')

    def format(self) -> str:
        """Human-readable report."""
        lines = [f'{self.records} records, {self.spans} policy spans, {self.policy_tokens} policy tokens',
                 f'drifting spans: {self.drifting_spans} ({self.per_1000:.2f} per 1,000 policy tokens); '
                 f'affected tokens: {self.affected_tokens} ({self.affected_per_1000:.1f} per 1,000)']
        for r, d in self.examples:
            lines.append(f'  record {r} turn {d.turn}: drift at token {d.at}: sampled {d.sampled} '
                         f'-> re-encoded {d.other}')
        return '\n'.join(lines)


def drift_rate(records, tokenizer, *, max_examples: int = 10) -> DriftRate:
    """Decode and re-encode every policy span of a set of records; count drift per 1,000 policy tokens.

    Args:
        records: :class:`~agentrl.record.Trajectory` records with ``owner`` and ``turn`` (e.g.
            read back with :func:`agentrl.read_trajectories`), sampled with ``tokenizer``.
        tokenizer: the Hugging Face tokenizer (or :class:`~agentrl.templates.ChatTemplate`).
        max_examples: drifting spans kept as examples.

    Returns:
        :class:`DriftRate`.

    Raises:
        ValueError: a record without owners (build records with ``ChatRecorder``).

    Source: book chapter 5.4 ("drift is rare per token, but an RL batch contains millions of tokens").
    """
    template = as_template(tokenizer)
    n_rec = spans = pol = drifting = affected = 0
    examples = []
    for n_rec, rec in enumerate(records, start=1):
        rep = audit_drift(template, rec)
        spans += rep.n_spans
        pol += int(rec.action_mask.sum())
        for d in rep.drifts:
            drifting += 1
            affected += (d.end - d.start) - d.at
            if len(examples) < max_examples:
                examples.append((n_rec - 1, d))
    return DriftRate(records=n_rec, spans=spans, policy_tokens=pol, drifting_spans=drifting,
                     affected_tokens=affected, examples=examples)
