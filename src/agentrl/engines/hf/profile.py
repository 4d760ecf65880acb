"""L4: the HF engine's per-turn time split (``run_chat_episodes(..., profile={})``): collect, merge, print."""
from __future__ import annotations

__all__ = ['PROFILE_KEYS', 'Profile', 'merge_profiles', 'format_profile']

#: Per-turn time split keys of :func:`~agentrl.engines.hf.run_chat_episodes` ``profile`` (seconds ``_s``, counts otherwise).
PROFILE_KEYS = ('prefill_tokens', 'prefill_s', 'rebuilt_tokens', 'decode_tokens', 'decode_s', 'sample_s',
                'template_s', 'gym_s')


class Profile:
    """Per-turn accumulators of the time split (see :data:`PROFILE_KEYS`)."""

    def __init__(self):
        self.turns: list[dict] = []
        self.decode_steps = 0

    def add(self, turn: int, key: str, value) -> None:
        while len(self.turns) <= turn:
            self.turns.append(dict.fromkeys(PROFILE_KEYS, 0))
        self.turns[turn][key] += value

    def result(self, path: str, wall_s: float, records: list, forward_calls: int) -> dict:
        totals = {k: sum(t[k] for t in self.turns) for k in PROFILE_KEYS}
        totals['forward_s'] = totals['prefill_s'] + totals['decode_s']
        totals['other_s'] = wall_s - totals['forward_s'] - totals['sample_s'] - totals['template_s'] - totals['gym_s']
        totals['decode_steps'] = self.decode_steps
        totals['forward_calls'] = forward_calls
        totals['record_tokens'] = sum(len(t.ids) for t in records)
        rnd = lambda d: {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()}  # noqa: E731
        return {'engine': 'hf', 'path': path, 'episodes': len(records), 'wall_s': round(wall_s, 6),
                'totals': rnd(totals), 'turns': [dict(turn=k, **rnd(t)) for k, t in enumerate(self.turns)]}


def merge_profiles(profiles: list) -> dict:
    """One profile from the profiles of several :func:`~agentrl.engines.hf.run_chat_episodes` calls (chunks of a run).

    Counts and seconds add up per turn index and in the totals; ``wall_s`` and ``episodes`` add
    up; ``chunks`` says how many were merged.

    Raises:
        ValueError: an empty list, or profiles of different paths (cross-turn cache vs per turn).
    """
    if not profiles:
        raise ValueError('merge_profiles: no profiles; pass the dicts run_chat_episodes filled')
    paths = {p['path'] for p in profiles}
    if len(paths) != 1:
        raise ValueError(f'merge_profiles: profiles of different paths {sorted(paths)}; merge one path at a time')
    turns: list[dict] = []
    for p in profiles:
        for t in p['turns']:
            while len(turns) <= t['turn']:
                turns.append(dict(turn=len(turns), **dict.fromkeys(PROFILE_KEYS, 0)))
            for k in PROFILE_KEYS:
                turns[t['turn']][k] += t[k]
    totals = {k: sum(p['totals'][k] for p in profiles) for k in profiles[0]['totals']}
    rnd = lambda d: {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()}  # noqa: E731
    return {'engine': 'hf', 'path': paths.pop(), 'episodes': sum(p['episodes'] for p in profiles),
            'wall_s': round(sum(p['wall_s'] for p in profiles), 6), 'chunks': len(profiles), 'totals': rnd(totals),
            'turns': [rnd(t) for t in turns]}


def format_profile(profile: dict) -> str:
    """The time split of :func:`~agentrl.engines.hf.run_chat_episodes` as a plain-text table (one row per turn, then totals).

    Args:
        profile: the dict filled by ``run_chat_episodes(..., profile={})``.

    Returns:
        Lines: turn, prefill tokens / s, rebuilt tokens, decode tokens / s, sampling, template, gym
        (seconds), then the totals, forward time and its share of the wall time.
    """
    head = f'{"turn":>5} {"prefill tok":>11} {"prefill s":>9} {"rebuilt":>7} {"decode tok":>10} {"decode s":>8} ' \
           f'{"sample s":>8} {"template s":>10} {"gym s":>7}'
    row = lambda name, t: (f'{name:>5} {t["prefill_tokens"]:>11,} {t["prefill_s"]:>9.3f} {t["rebuilt_tokens"]:>7,} '  # noqa: E731
                           f'{t["decode_tokens"]:>10,} {t["decode_s"]:>8.3f} {t["sample_s"]:>8.3f} '
                           f'{t["template_s"]:>10.3f} {t["gym_s"]:>7.3f}')
    tot = profile['totals']
    lines = [f'hf engine profile ({profile["path"]}): {profile["episodes"]} episodes, {tot["record_tokens"]:,} '
             f'record tokens, wall {profile["wall_s"]:.3f} s', head]
    lines += [row(str(t['turn']), t) for t in profile['turns']]
    lines.append(row('all', tot))
    share = tot['forward_s'] / profile['wall_s'] if profile['wall_s'] > 0 else 0.0
    lines.append(f'forward {tot["forward_s"]:.3f} s ({share:.0%} of wall) in {tot["forward_calls"]:,} calls, '
                 f'{tot["decode_steps"]:,} decode steps; other {tot["other_s"]:.3f} s')
    return '\n'.join(lines)
