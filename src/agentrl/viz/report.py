"""The run report: one self-contained HTML page summarising a folder of rollouts.

Per policy: reward, stop reasons, truncation rate, episode length and action-token
distributions, context length after each turn (book chapter 5.8: log it from the start), a mask
check, and the first episode's ownership strip. Charts are hand-made SVG; the page fetches
nothing.

Records of agentrl's own policies (the BugFix gym) speak the gym's words (``solved``, stops
``submitted``/``budget``/``truncated``). Any other record (``agentrl import``, ``agentrl serve``) is
described as ``agentrl check`` describes it: its source's stop reason (``finish_reason stop``,
``finish_reason length``, ``finish_reason tool_calls``; ``(not recorded)`` when it stored none), a
truncation rate that counts turns cut at ``max_tokens`` (``info['template']['unterminated_turns']``),
no "solved" column, and "no sampling log-probs" for a record stored without them.
"""
from __future__ import annotations

from collections import Counter
from html import escape

import torch

from .._version import __version__
from ..checks.calls import records_calls_line
from ..constraints import forced_rows
from ..gym.policies import POLICY_KINDS
from ..record import OWNER, Trajectory
from ..stats import context_lengths, is_truncated, policy_summary, source_stop_reason
from . import plots
from .html import legend_fragment, page, strip_fragment
from .strip import DEFAULT_FOLD, build_strip, decoder_for

__all__ = ['group_by_policy', 'report_html']

#: The policies of ``agentrl rollout`` (``agentrl.jobs.plan.POLICIES``): their records speak the gym's words.
_GYM_POLICIES = (*POLICY_KINDS, 'model')


def _policy(t: Trajectory) -> str:
    return (t.provenance.policy if t.provenance is not None and t.provenance.policy else 'unknown')


def group_by_policy(trajs: list, order: list | None = None) -> dict:
    """Policy name -> its trajectories, in ``order`` first, then in order of first appearance."""
    groups: dict = {}
    for t in trajs:
        groups.setdefault(_policy(t), []).append(t)
    names = [n for n in (order or []) if n in groups] + [n for n in groups if n not in (order or [])]
    return {n: groups[n] for n in names}


def _stop_reason(t: Trajectory) -> str:
    """The stop reason of an imported or gateway record, in its source's words (as ``agentrl check``):
    ``'finish_reason X'`` for the server's last ``finish_reason`` (``info['import']['finish']``), else
    ``info['stop']`` as the trainer's file named it, else ``'(not recorded)'``."""
    info = t.info or {}
    source = source_stop_reason(info)
    if source is not None:
        return source
    stop = info.get('stop')
    return '(not recorded)' if stop is None else str(stop)


def _cut_at_budget(t: Trajectory) -> bool:
    """Whether a record was truncated: :func:`agentrl.stats.is_truncated`, or a turn cut at ``max_tokens``
    without an end-of-turn token (``info['template']['unterminated_turns']``; the rule of ``agentrl check``)."""
    template = (t.info or {}).get('template')
    return is_truncated(t) or (isinstance(template, dict) and bool(template.get('unterminated_turns')))


def _source_words(stats: dict, trajs: list) -> None:
    """Replace the gym's stops and truncation rate of a non-gym policy's summary by its source's words."""
    stats['stops'] = dict(sorted(Counter(_stop_reason(t) for t in trajs).items()))
    stats['truncation_rate'] = sum(_cut_at_budget(t) for t in trajs) / len(trajs)


def _strip_words(meta: dict, t: Trajectory) -> None:
    """The first episode's facts in its source's words: its stop reason, and no "scripted" log-probs."""
    meta['stop'] = _stop_reason(t)
    if 'logp' in meta:
        meta['logp'] = 'none (no sampling log-probs)'


def _mask_ok(t: Trajectory) -> bool:
    return t.owner is not None and bool(torch.equal(t.action_mask.bool(), t.owner[1:] == OWNER['policy']))


def _table(groups: dict, stats: dict, gym: set) -> str:
    cols = ['policy', 'episodes', 'mean reward', 'solved', 'stops', 'truncation', 'length mean', 'length max',
            'action tokens', 'mask = policy', 'context after each turn (1st ep.)']
    if not gym:                   # imported or gateway records only: no task to solve, stop reasons of the source
        cols[3:5] = ['stop reasons']
    forced = {n: sum(int(forced_rows(t).sum()) for t in ts) for n, ts in groups.items()}
    grammar = any(t.provenance is not None and t.provenance.sampling is not None
                  and t.provenance.sampling.constraint is not None for ts in groups.values() for t in ts)
    if grammar:                    # grammar-constrained records: the tokens their grammar forced (docs/grammar.md)
        cols.insert(len(cols) - 2, 'forced tokens')
    rows = ['<table class="stats"><tr>' + ''.join(f'<th>{c}</th>' for c in cols) + '</tr>']
    for name, trajs in groups.items():
        s = stats[name]
        solved = sum(t.reward > 0 for t in trajs) / len(trajs)
        ok = sum(_mask_ok(t) for t in trajs)
        stops = ', '.join(f'{k} {v}' for k, v in s['stops'].items())
        cells = [name, s['episodes'], f"{s['mean_reward']:.3f}", f'{solved:.0%}' if name in gym else '\u2014', stops,
                 f"{s['truncation_rate']:.0%}", f"{s['length_mean']:.1f}", s['length_max'],
                 f"{s['action_tokens_mean']:.1f}", f'{ok}/{len(trajs)}',
                 f"{s['prompt_length']} \u2192 {s['first_context_lengths']}"]
        if not gym:
            del cells[3]
        if grammar:
            cells.insert(len(cols) - 3, forced[name])
        rows.append('<tr>' + ''.join(f'<td>{escape(str(c))}</td>' for c in cells) + '</tr>')
    return ''.join(rows) + '</table>'


def _context_series(groups: dict, colours: dict):
    """Mean context length at the prompt and after each turn, per policy."""
    per = {}
    n_turns = 0
    for name, trajs in groups.items():
        sums, counts = Counter(), Counter()
        for t in trajs:
            if t.turn is None:
                continue
            sums['p'] += int((t.turn == -1).sum())
            counts['p'] += 1
            for k, c in enumerate(context_lengths(t)):
                sums[k] += c
                counts[k] += 1
                n_turns = max(n_turns, k + 1)
        per[name] = (sums, counts)
    xl = ['p'] + list(range(n_turns))
    series = [(name, [sums[x] / counts[x] if counts[x] else None for x in xl], colours[name])
              for name, (sums, counts) in per.items()]
    return series, xl


def _plot(title: str, svg: str, note: str = '') -> str:
    return (f'<div class="plot"><h3>{escape(title)}</h3>{svg}'
            + (f'<div class="meta" style="font-size:12px">{escape(note)}</div>' if note else '') + '</div>')


def _facts(trajs: list, groups: dict, summary: dict) -> list:
    """The heading's facts: counts, the run's options, the import's source, the tokenizer, the tool-call
    statuses (HTML fragments)."""
    opts = summary.get('options') or {}
    facts = [f'<b>{len(trajs)}</b> episodes', f'<b>{len(groups)}</b> policies']
    for key, label in (('tasks', 'tasks'), ('seconds', 's rollout time')):
        if key in summary:
            facts.append(f'<b>{escape(str(summary[key]))}</b> {label}')
    for key in ('split', 'repeats', 'seed', 'temperature', 'max_turns', 'reward_tests', 'checkpoint'):
        if opts.get(key) not in (None, ''):
            facts.append(f'{key} <b>{escape(str(opts[key]))}</b>')
    if summary.get('imported_from'):
        facts.append(f'imported from <b>{escape(str(summary["imported_from"]))}</b> '
                     f'({escape(str(summary.get("source") or "unknown source"))})')
    if summary.get('tokenizer'):
        facts.append(f'tokenizer <b>{escape(str(summary["tokenizer"]))}</b>')
    calls = records_calls_line(trajs)
    if calls:
        facts.append(f'tool calls <b>{escape(calls)}</b>')
    return facts


def report_html(trajs: list, summary: dict | None = None, run_dir: str = '', decoder=None,
                fold: int = DEFAULT_FOLD, notice: str = '', gym_policies=None) -> str:
    """Render the report page of one run.

    Args:
        trajs: the run's records (at least one), e.g. ``store.read_trajectories(RUN/trajectories.parquet)``.
        summary: the run's ``summary.json`` (options, timing), or None.
        run_dir: shown in the heading; its ``images/`` give the strip's image thumbnails.
        decoder: token text for the first episode's strip (default :func:`~agentrl.viz.decoder_for`).
        fold: fold threshold of the strip.
        notice: a line shown under the heading, e.g. that the run is incomplete ('' for none).
        gym_policies: the policy names whose records come from the BugFix gym and keep its words (None:
            ``agentrl rollout``'s: the scripted policies and ``model``); every other policy (an import, a
            gateway run) is described in its source's words (see the module docstring).

    Returns:
        A complete HTML document (string).

    Raises:
        ValueError: ``trajs`` is empty.
    """
    if not trajs:
        raise ValueError('the run has no trajectories; run `agentrl rollout --out RUN_DIR` first')
    summary = summary or {}
    groups = group_by_policy(trajs, list((summary.get('policies') or {}).keys()))
    colours = {n: plots.PALETTE[k % len(plots.PALETTE)] for k, n in enumerate(groups)}
    stats = {n: policy_summary(ts) for n, ts in groups.items()}
    gym = {n for n in groups if n in (_GYM_POLICIES if gym_policies is None else gym_policies)}
    for n in set(groups) - gym:
        _source_words(stats[n], groups[n])

    reward = plots.hbars([(n, stats[n]['mean_reward'], colours[n]) for n in groups], 'mean reward per policy',
                         xmax=max(1.0, max(s['mean_reward'] for s in stats.values())), fmt=lambda v: f'{v:.3f}')
    stop_keys = sorted({k for s in stats.values() for k in s['stops']})
    stops = plots.stacked_bars([(n, stats[n]['stops']) for n in groups], stop_keys, 'stop reasons per policy')
    trunc = plots.hbars([(n, stats[n]['truncation_rate'], colours[n]) for n in groups], 'truncation rate',
                        xmax=1.0, fmt=lambda v: f'{v:.0%}')
    lengths = plots.histograms([(n, [len(t) for t in ts], colours[n]) for n, ts in groups.items()],
                               'episode length distribution', 'episode length T (tokens)')
    actions = plots.histograms([(n, [int(t.action_mask.sum()) for t in ts], colours[n]) for n, ts in groups.items()],
                               'action tokens per episode', 'action tokens (mask sum)')
    series, xl = _context_series(groups, colours)
    context = plots.lines(series, xl, 'context length per turn', 'context length (tokens)')

    first = trajs[0]
    strip = build_strip(first, decoder or decoder_for(first), fold=fold, images=run_dir or None)
    if _policy(first) not in gym:
        _strip_words(strip.meta, first)
    facts = _facts(trajs, groups, summary)
    title = f'agentrl report: {run_dir}' if run_dir else 'agentrl report'
    body = [f'<h1>{escape(title)}</h1>' + (f'<p class="notice">{escape(notice)}</p>' if notice else '')
            + '<p class="meta">' + ' &middot; '.join(facts) + '</p>',
            '<h2>Per policy</h2>', _table(groups, stats, gym),
            '<h2>Outcomes</h2><div class="plots">',
            _plot('Mean reward', reward), _plot('Stop reasons (share of episodes)', stops),
            _plot('Truncation rate', trunc), '</div>',
            '<h2>Lengths</h2><div class="plots">',
            _plot('Episode length', lengths), _plot('Action tokens per episode', actions),
            _plot('Context length after each turn (mean over episodes that reached it)', context,
                  'Log context length per turn from the start (book chapter 5.8): it grows with every '
                  'observation and sets the cost of each policy call.'),
            '</div>',
            f'<h2>First episode: {escape(strip.title)}</h2>',
            '<p class="meta">' + ' &middot; '.join(f'{escape(str(k))} <b>{escape(f"{v:.3f}" if isinstance(v, float) else str(v))}</b>'
                                                    for k, v in strip.meta.items())
            + f' &middot; text <b>{escape(strip.decoded)}</b></p>',
            legend_fragment(), strip_fragment(strip, episode=0),
            f'<footer>agentrl {escape(__version__)} &middot; self-contained report: no network, no external '
            'assets. Hover a token cell for its details.</footer>']
    return page(title, '\n'.join(body))
