"""L5: a finished session's branch leaves as records, stored like ``agentrl rollout`` stores them.

Each branch with at least one delivered turn becomes one :class:`~agentrl.record.Trajectory`
(its recorder's :meth:`~agentrl.templates.ChatRecorder.finish`); trailing turns whose response
the client never received are left out (the branch is replayed without them). Records go to
``RUN/trajectories/part-*.parquet`` through :class:`agentrl.store.ShardWriter` (a resend after a
restart is stored once), so ``agentrl check RUN`` reads them.

Source: docs/gateway.md#records; docs/design.md#integrity.
"""
from __future__ import annotations

import dataclasses
import json
import re

from ..constraints import Constraint
from ..families import family_for
from ..families.record_calls import record_calls, tool_names
from ..record import OWNER, Provenance
from ..templates import ChatRecorder

__all__ = ['session_records', 'run_metrics', 'session_stats', 'train_shared_once', 'primary_root', 'Identities',
           'record_identity']


def _finish_reason(call: dict):
    """The ``finish_reason`` the gateway answered a call with (``stop``, ``length``, ``tool_calls``), or None."""
    try:
        return call['response']['choices'][0]['finish_reason']
    except (KeyError, IndexError, TypeError):
        return None


def _recorder(branch):
    """The branch's recorder without trailing undelivered turns, or None when no turn was delivered."""
    last = max((k for k, (kind, x) in enumerate(branch.steps) if kind == 'turn' and x.delivered), default=None)
    if last is None:
        return None
    if last == len(branch.steps) - 1:
        return branch.recorder
    rec = ChatRecorder(branch.template, branch.opening, history='sampled')
    for kind, x in branch.steps[:last + 1]:
        if kind == 'turn':
            rec.add_turn(x.ids, x.logp, message=x.record_message())
        else:
            rec.add_messages(x)
    return rec


def _tool_names(tools_key: str):
    """The function names of a branch's tools (its ``tools_key``: the request's ``tools`` as JSON), or None."""
    try:
        return tool_names(json.loads(tools_key))
    except (TypeError, ValueError):
        return None


def record_identity(identity: dict, sid: str) -> tuple:
    """``(group_id, rollout_id)`` a session's records are stored under: its identity's, default the session id."""
    return identity.get('group_id') or sid, identity.get('rollout_id') or sid


def _leaf(rollout: str, k: int) -> str:
    """The rollout id of branch leaf ``k`` > 0 of a session with several leaves."""
    return f'{rollout}/b{k}'


_LEAF = re.compile(r'(.*)/b([1-9][0-9]*)')


class Identities:
    """The record identities of every session of a run (open, finished or stored), so a new one clashes with none.

    A session stored under ``(group, rollout)`` (:func:`record_identity`) writes the rows ``rollout``
    and, when it forks, ``rollout/bK`` (K >= 1; :func:`session_records`). Two sessions of a group
    clash when one's rollout id is the other's, or the other's plus ``/bK``: their rows could share
    an identity, which the store refuses (docs/design.md#integrity).
    """

    def __init__(self):
        self._roots: dict = {}          # (group, rollout) -> session id
        self._leafy: dict = {}          # (group, rollout without its /bK) -> [rollout ids ending in /bK]

    def add(self, group: str, rollout: str, sid: str) -> None:
        """Note a session's identity."""
        self._roots[(group, rollout)] = sid
        m = _LEAF.fullmatch(rollout)
        if m:
            self._leafy.setdefault((group, m.group(1)), []).append(rollout)

    def clash(self, group: str, rollout: str) -> str | None:
        """None, or one line naming the clash of ``(group, rollout)`` with a known session and the fix."""
        fix = 'give each session its own rollout_id, not another session\'s plus "/bK" (its fork leaves)'
        if (group, rollout) in self._roots:
            return f'another session already records group_id={group!r} rollout_id={rollout!r}; {fix}'
        m = _LEAF.fullmatch(rollout)
        if m and (group, m.group(1)) in self._roots:
            return (f'rollout_id={rollout!r} is the id of fork leaf {m.group(2)} of another session in '
                    f'group_id={group!r} (rollout_id={m.group(1)!r}); {fix}')
        for other in self._leafy.get((group, rollout), ()):
            return (f'another session in group_id={group!r} has rollout_id={other!r}, the id this session\'s fork '
                    f'leaf {_LEAF.fullmatch(other).group(2)} would get; {fix}')
        return None


def session_records(session, model_name: str, *, policy: str = 'hf', spec_of=None, family=None) -> list:
    """One record per branch leaf with a delivered turn, in branch order.

    ``policy`` is ``Provenance.policy`` (the upstream's); ``spec_of(spec)`` gives the declared
    sampler (e.g. the vLLM upstream's probed log-prob mode; default the session's spec).

    Identity: ``group_id`` and ``rollout_id`` from the session's identity (default the session
    id); with several leaves, the primary root branch (:func:`primary_root`) keeps ``rollout_id`` and every
    other branch ``k`` gets ``rollout_id + '/b' + k``. ``info`` holds the
    harness's info plus ``gateway``: session, branch, leaves, its fork (or None), ``root`` (the index of the
    root branch it descends from) and ``side`` (True when that root is not the primary one: a side call such
    as a title request, docs/gateway.md#branches), the calls and
    seeds of its turns, the echo variants noted on them, ``aborted``, ``task`` (and ``servers`` when an
    engine server sampled them); ``turn_calls``: every call block of each turn with its status and
    token span in the record's ids (:func:`agentrl.families.record_calls.record_calls`; ``family`` is the
    gateway's, default :func:`agentrl.families.family_for` of the branch's template; a call outside the
    branch's tools is ``unknown_tool``; blocks are parsed whatever the request's ``tool_choice``, except in a
    branch offered no tools: its turns are plain text, ``[]`` each). A branch whose turns sampled under a
    forced ``tool_choice`` declares that grammar (``provenance.sampling.constraint``).

    Raises:
        ValueError: as :meth:`~agentrl.templates.ChatRecorder.finish`.
    """
    ident = session.identity
    group, rollout = record_identity(ident, session.sid)
    leaves = [(b, _recorder(b)) for b in session.branches]
    leaves = [(b, r) for b, r in leaves if r is not None]
    primary = primary_root(session)
    out = []
    for b, rec in leaves:
        turns = [t for t in b.turns if t.delivered]
        seeds = [session.calls[t.call].get('seed') for t in turns]
        info = dict(session.info)
        root = getattr(b, 'root', 0)
        info['gateway'] = {'session': session.sid, 'branch': b.index, 'leaves': len(leaves), 'fork': b.fork,
                           'root': root, 'side': root != primary,
                           'calls': [t.call for t in turns], 'seeds': seeds,
                           'policy_versions': [session.calls[t.call].get('version') for t in turns],
                           'variants': [dict(v, turn=t.call) for t in turns for v in t.variants],
                           'truncated_turns': [k for k, t in enumerate(turns) if t.truncated],
                           'finish_reasons': [_finish_reason(session.calls[t.call]) for t in turns],
                           'aborted': session.aborted, 'task': ident.get('task')}
        servers = [session.calls[t.call].get('server') for t in turns]
        if any(x is not None for x in servers):
            info['gateway']['servers'] = servers
        dialects = [session.calls[t.call].get('dialect', 'chat') for t in turns]
        if any(d != 'chat' for d in dialects):          # chat-only records stay as they were
            info['gateway']['dialects'] = dialects
        spec = spec_of(session.spec) if spec_of is not None and session.spec is not None else session.spec
        grammar = session.calls[turns[0].call].get('constraint') if turns else None
        if grammar is not None and spec is not None:      # one grammar per branch (Gateway.call_constraint)
            spec = dataclasses.replace(spec, constraint=Constraint.from_dict(grammar))
        plain = (b.index == primary and b.fork is None) or len(leaves) == 1
        prov = Provenance(policy=policy, sampling=spec, model=model_name, group_id=str(group),
                          rollout_id=str(rollout) if plain else _leaf(rollout, b.index),
                          seed=seeds[0] if seeds else None)
        traj = rec.finish(reward=0.0 if session.aborted else float(session.reward), info=info, provenance=prov)
        fam = family if family is not None else family_for(b.template)
        calls = record_calls(traj, fam, b.template, _tool_names(b.tools_key))
        traj.info['turn_calls'] = calls if _tool_names(b.tools_key) else [[] for _ in calls]
        out.append(traj)
    return out


def primary_root(session) -> int:
    """The index of a session's primary root branch: of the branches no fork made (each a conversation of its own,
    :meth:`~agentrl.gateway.sessions.Session.plan`), the one whose tree sampled the most calls, then one offered
    tools, then the first; the others are side calls (a title or summary request). 0 for a session without
    branches."""
    roots = [b for b in session.branches if b.fork is None]
    if not roots:
        return 0
    count: dict = {}
    for c in session.calls:
        b = session.branches[c['branch']] if c.get('branch') is not None and c['branch'] < len(session.branches) \
            else None
        if b is not None:
            r = getattr(b, 'root', 0)
            count[r] = count.get(r, 0) + 1
    return max(roots, key=lambda b: (count.get(b.index, 0), _tool_names(b.tools_key) is not None, -b.index)).index


def session_stats(session, records: int = 0) -> dict:
    """What the run summary keeps of one session (journalled with its ``committed`` event, so a
    committed session leaves memory and is never replayed).

    Returns:
        ``state``, ``calls``, ``undelivered`` (calls never delivered), ``sampled`` (tokens of every
        call), ``trained`` (sampled tokens some leaf trains, each counted once; 0 unless committed),
        ``forks`` (count per category), ``aborted``, ``records``.
    """
    trained = 0
    if session.state == 'committed':
        seen = set()
        for b in session.branches:
            for t in b.turns:
                if t.delivered and id(t) not in seen:
                    seen.add(id(t))
                    trained += len(t.ids)
    forks: dict = {}
    for f in session.forks:
        forks[f['category']] = forks.get(f['category'], 0) + 1
    return {'state': session.state, 'calls': len(session.calls),
            'undelivered': sum(not c['delivered'] for c in session.calls), 'sampled': session.out_tokens,
            'trained': trained, 'forks': forks, 'aborted': bool(session.aborted), 'records': int(records)}


def run_metrics(sessions, records_by_session: dict, closed=()) -> dict:
    """Per-run numbers for ``summary.json``.

    Args:
        sessions: the sessions in memory. records_by_session: session id -> records stored.
        closed: :func:`session_stats` of committed sessions no longer in memory.

    Returns:
        ``sessions``, ``committed``, ``aborted``, ``calls``, ``undelivered_calls``, ``records``,
        ``rows_per_episode`` (records / committed sessions), ``sampled_tokens`` (every call),
        ``trainable_fraction_of_sampled`` (sampled tokens of committed sessions that some stored
        record trains, each counted once), ``forks`` (count per category).
    """
    stats = [session_stats(s, records_by_session.get(s.sid, 0)) for s in sessions] + list(closed)
    committed = [x for x in stats if x['state'] == 'committed']
    forks: dict = {}
    for x in stats:
        for k, n in x['forks'].items():
            forks[k] = forks.get(k, 0) + n
    n_rec = sum(x['records'] for x in committed)
    sampled_committed = sum(x['sampled'] for x in committed)
    trained_once = sum(x['trained'] for x in committed)
    return {'sessions': len(stats), 'committed': len(committed), 'aborted': sum(x['aborted'] for x in committed),
            'calls': sum(x['calls'] for x in stats), 'undelivered_calls': sum(x['undelivered'] for x in stats),
            'records': n_rec, 'rows_per_episode': round(n_rec / len(committed), 6) if committed else None,
            'sampled_tokens': sum(x['sampled'] for x in stats),
            'trainable_fraction_of_sampled': round(trained_once / sampled_committed, 6) if sampled_committed else None,
            'forks': forks}


def _untrained(call, policy) -> bool:
    """Whether a stored call's token span (``info['turn_calls']``) covers a token no longer policy-owned."""
    tokens = call.get('tokens') if isinstance(call, dict) else None
    if not isinstance(tokens, list) or len(tokens) != 2:
        return False
    return not bool(policy[tokens[0]:tokens[1]].all())


def train_shared_once(records) -> list:
    """Train each sampled token of a gateway session once: a fork's replayed parent turns become context.

    A fork that replays its parent's first turns (``info.gateway.fork.shared_sampled_tokens`` = n > 0)
    holds those n sampled tokens too. When the parent branch's record is among ``records`` (same
    ``info.gateway.session``), the fork row's first n policy-owned tokens are relabelled as context
    (``template`` for control ids, per the record's ``info.template.chat_tokens``, else ``prompt``), so
    ``action_mask`` (``owner[1:] == policy``) is 0 there and the acceptance rules still hold;
    ``info.gateway.shared_untrained`` = n, and the relabelled turns' stored calls (``info.turn_calls``) are
    dropped from the fork row (the parent row holds them). By induction over a chain of forks every sampled token is
    in the loss of exactly one row. Records of other runs, roots, and forks whose parent row is
    absent are returned as they are. ``agentrl export`` applies it to every target (each takes a
    per-token mask).

    Args:
        records: :class:`~agentrl.record.Trajectory` records (any order).

    Returns:
        A list in the same order; changed records are new objects (the inputs are not modified).

    Raises:
        ValueError: a fork row whose first n policy tokens are not its parent row's first n (names
            the rollout and the fix).

    Source: docs/gateway.md#records (shared prefixes scored once).
    """
    import copy
    import dataclasses

    import torch

    from ..checks.template_rules import chat_tokens
    records = list(records)
    rows = {}
    for i, r in enumerate(records):
        g = (r.info or {}).get('gateway') if isinstance(r.info, dict) else None
        if isinstance(g, dict) and g.get('session') is not None:
            rows[(g['session'], g.get('branch'))] = i
    out = list(records)
    for i, r in enumerate(records):
        g = (r.info or {}).get('gateway') if isinstance(r.info, dict) else None
        fork = g.get('fork') if isinstance(g, dict) else None
        n = int((fork or {}).get('shared_sampled_tokens') or 0)
        parent = rows.get((g.get('session'), (fork or {}).get('parent'))) if n else None
        if parent is None:
            continue
        owner, ids = torch.as_tensor(r.owner).long().clone(), torch.as_tensor(r.ids).long()
        pos = (owner == OWNER['policy']).nonzero().flatten()[:n]
        p = records[parent]
        ppos = (torch.as_tensor(p.owner).long() == OWNER['policy']).nonzero().flatten()[:n]
        if len(pos) < n or len(ppos) < n or not torch.equal(ids[pos], torch.as_tensor(p.ids).long()[ppos]):
            pv = r.provenance
            raise ValueError(f'record {i} (rollout {getattr(pv, "rollout_id", None)!r}): its first {n} sampled '
                             f'tokens are not those of its parent branch {fork["parent"]}; the records were edited '
                             'after the gateway stored them: export the run as stored')
        ct = chat_tokens(r) or {'control': []}
        ctl = torch.zeros(len(pos), dtype=torch.bool)
        for lo, hi in ct['control']:
            ctl |= (ids[pos] >= lo) & (ids[pos] < hi)
        owner[pos] = torch.where(ctl, OWNER['template'], OWNER['prompt'])
        info = copy.deepcopy(r.info)
        info['gateway']['shared_untrained'] = n
        if isinstance(info.get('turn_calls'), list):     # calls of the relabelled turns are the parent row's
            pol = owner == OWNER['policy']
            info['turn_calls'] = [[c for c in per if not _untrained(c, pol)] if isinstance(per, list) else per
                                  for per in info['turn_calls']]
        out[i] = dataclasses.replace(r, owner=owner, action_mask=(owner[1:] == OWNER['policy']).float(), info=info)
    return out
