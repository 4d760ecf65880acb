"""Shared by the gateway tests: an ``HFEngine`` whose next turns can be forced (teacher-forced, real log-probs)."""
import dataclasses

from agentrl.engines.hf.engine import HFEngine


class ForcingHF(HFEngine):
    """HFEngine whose next turns can be forced: the given text's ids, scored by the real model.

    ``force`` is a list of texts; each ``sample`` call pops the first one (when the list is empty it
    samples as usual). The forced ids go through the same ``HFSampler`` (``teacher=``), so the turn's
    log-probs are the model's and the records replay with ratio 1; streamed token by token, as a
    sampled turn is.
    """

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.force = []

    def sample(self, request, teacher=None):
        if not self.force:
            return super().sample(request)
        ids = self.tokenizer(self.force.pop(0), add_special_tokens=False)['input_ids']
        return super().sample(dataclasses.replace(request, max_new_tokens=len(ids)), teacher=ids)


def new_session(http, server, **ident) -> dict:
    """``POST /sessions`` with the identity fields: the JSON answer (``token``, ``base_url``, ``session``)."""
    r = http.post(server.url + '/sessions', json=ident)
    assert r.status_code == 201, r.text
    return r.json()


def finish(http, server, sess, reward: float = 1.0, info: dict | None = None) -> dict:
    """``POST /sessions/TOKEN/finish``: the committed session's description."""
    r = http.post(f'{server.url}/sessions/{sess["token"]}/finish', json={'reward': reward, 'info': info or {}})
    assert r.status_code == 200, r.text
    return r.json()


def records_of(run_dir, sid: str) -> list:
    """The stored records of one session (``info.gateway.session``) in ``run_dir/trajectories``."""
    from agentrl import store
    return [t for t in store.read_trajectories(run_dir / 'trajectories') if t.info['gateway']['session'] == sid]


def policy_turns(t) -> list:
    """The runs of trained ids of a record (the mask is over ``ids[1:]``)."""
    ids, mask = t.ids.tolist(), t.action_mask.tolist()
    turns, cur = [], []
    for j, m in enumerate(mask):
        if m:
            cur.append(ids[j + 1])
        elif cur:
            turns, cur = turns + [cur], []
    return turns + ([cur] if cur else [])
