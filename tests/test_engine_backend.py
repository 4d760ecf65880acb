"""A new server backend is one registry entry and its module: `agentrl rollout` reaches it unchanged.

The test registers ``fake-sglang`` at test time: a :class:`~agentrl.engines.factory.Backend` with
``servers=True`` whose rollout kit (docs/design.md#engines) lives in this file. Its "servers" sample
in this process with the HF engine's own ``TurnBatch`` (``RowBatch``) over ``agentrl
make-test-model``'s tiny Qwen3, so its records must be ``--engine hf``'s recorded ones
(``tests/golden/engines/rollout_hf.json``) token for token, with the backend's own policy. No file of
the package knows the name: the flags, the job, the runner, the resume and the summary follow the
entry's facts.
"""
import contextlib
import dataclasses
import json

import pytest

from _engine_fixtures import GOLDEN, agentrl, canonical, stored_rows
from _tokenizers import tokenizer_path
from agentrl.engines.contract import EngineDied
from agentrl.engines.factory import BACKENDS, ENGINES, Backend
from agentrl.record import Provenance

NAME = 'fake-sglang'


class FakeDied(EngineDied):
    """The kit's dead-server error: ``(url, detail, message)`` as the job rebuilds it."""

    def __init__(self, url, detail, message=None):
        super().__init__(message or f'{NAME} server {url} died ({detail}); fix: restart it')
        self.url, self.detail, self.finished = url, detail, {}


@dataclasses.dataclass
class FakeEndpoint:
    url: str
    model_dir: str


class FakeKit:
    """A rollout kit whose servers are the tiny model in this process; ``calls`` logs what the job asked."""

    ServerDied = FakeDied
    calls: list = []
    model_dir = None            # the folder every fake server serves
    die_after = None            # episodes that end before a fake server dies (None: it never does)

    @classmethod
    def check_local(cls, model, python=None):
        cls.calls.append(('check_local', python))

    @classmethod
    @contextlib.contextmanager
    def start(cls, model, *, cpus=None, python=None, name=None):
        cls.calls.append(('start', cpus, name))
        yield FakeEndpoint(f'fake://{name}', str(model))

    @classmethod
    def connect(cls, urls):
        cls.calls.append(('connect', list(urls)))
        return [FakeEndpoint(u, cls.model_dir) for u in urls]

    @classmethod
    def probe(cls, endpoints, prompt_ids):
        cls.calls.append(('probe', len(endpoints)))
        return 'processed'

    @staticmethod
    def record_spec(spec, logp_mode):
        return dataclasses.replace(spec, logp_mode=logp_mode)

    @classmethod
    def episodes(cls, endpoints, recorders, respond, *, seeds, spec, max_new_tokens, max_turns, model_name,
                 concurrency, on_done, responses, logp_mode):
        from agentrl.engines.driver import drive_episodes
        from agentrl.engines.hf import HFSampler, load_model, pad_token_id
        from agentrl.engines.hf.batch import RowBatch
        cls.calls.append(('episodes', len(recorders), logp_mode))
        template = recorders[0].template
        model, _ = load_model(endpoints[0].model_dir, device='cpu')
        sampler = HFSampler(model, template.stop_ids, spec, max_new_tokens=max_new_tokens,
                            pad_id=pad_token_id(template.tokenizer, model), tokenizer=template.tokenizer)
        declared = cls.record_spec(spec, logp_mode)
        finished = {}

        def done(i, rec):
            finished[i] = rec
            on_done(i, rec)
            if cls.die_after is not None and len(finished) == cls.die_after:
                err = FakeDied(endpoints[0].url, 'connection reset')
                err.finished = dict(finished)
                raise err
        return drive_episodes(RowBatch(sampler, len(recorders)), recorders, respond, seeds=seeds, spec=spec,
                              max_turns=max_turns, max_new_tokens=max_new_tokens,
                              max_context=model.config.max_position_embeddings,
                              provenance=lambda i: Provenance(policy=NAME, sampling=declared, model=model_name,
                                                              seed=seeds[i]),
                              on_done=done)


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    """The model of ``rollout_hf.json``: ``agentrl make-test-model`` (seed 0, Qwen3's tokenizer) named ``tiny-qwen3``."""
    pytest.importorskip('transformers')
    out = tmp_path_factory.mktemp('backend-model') / 'tiny-qwen3'
    agentrl('make-test-model', out, '--tokenizer', tokenizer_path('qwen3'), '--seed', '0')
    return out


@pytest.fixture
def fake_backend(monkeypatch, model_dir):
    monkeypatch.setitem(BACKENDS, NAME, Backend(NAME, policy=NAME, servers=True, rollout=lambda: FakeKit))
    monkeypatch.setattr(FakeKit, 'calls', [])
    monkeypatch.setattr(FakeKit, 'model_dir', str(model_dir))
    monkeypatch.setattr(FakeKit, 'die_after', None)
    return FakeKit


def _golden_rows():
    return json.loads((GOLDEN / 'rollout_hf.json').read_text())['records']


def _argv(model_dir, out, *extra):
    return ['rollout', '--engine', NAME, '--model', str(model_dir), '--split', 'heldout', '--repeats', '1',
            '--max-new-tokens', '6', '--max-turns', '2', '--seed', '1', '--out', str(out), *extra]


def test_a_registered_server_backend_runs_the_rollout_job_with_the_hf_engines_tokens(fake_backend, model_dir,
                                                                                      tmp_path, capsys):
    from agentrl.cli.main import main
    assert NAME in ENGINES and ENGINES[-1] == NAME
    assert main(_argv(model_dir, tmp_path / 'run', '--server', 'fake://a', '--server', 'fake://b')) == 0
    assert fake_backend.calls == [('connect', ['fake://a', 'fake://b']), ('probe', 2),
                                  ('connect', ['fake://a', 'fake://b']), ('episodes', 6, 'processed')]
    rows = canonical(stored_rows(tmp_path / 'run' / 'trajectories'), {})
    golden = _golden_rows()
    assert len(rows) == len(golden) == 6
    for row, want in zip(rows, golden):
        assert row['policy'] == NAME and want['policy'] == 'hf'
        same = {k: v for k, v in row.items() if k not in ('policy', 'digest')}
        assert same == {k: v for k, v in want.items() if k not in ('policy', 'digest')}


def test_a_registered_server_backend_starts_its_local_server_and_gets_its_flags(fake_backend, model_dir, tmp_path,
                                                                                capsys):
    from agentrl.cli.main import main
    out = tmp_path / 'run'
    assert main(_argv(model_dir, out, '--vllm-python', '/nowhere/python', '--vllm-cpus', '0-1')) == 0
    assert fake_backend.calls == [('check_local', '/nowhere/python')] * 2 + [  # the command line's check, the job's
        ('start', '0-1', 'tiny-qwen3'), ('connect', ['fake://tiny-qwen3']), ('probe', 1),
        ('connect', ['fake://tiny-qwen3']), ('episodes', 6, 'processed')]
    assert len(stored_rows(out / 'trajectories')) == 6
    # flags of facts it lacks are refused, naming the engines that take them
    assert main(_argv(model_dir, tmp_path / 'other', '--server', 'fake://a', '--profile')) == 2
    assert capsys.readouterr().err.endswith(f'agentrl: error: --profile applies to --engine hf, not --engine {NAME}; '
                                            'drop --profile or choose --engine hf\n')


def test_a_dead_fake_server_keeps_the_finished_episodes_and_names_the_resume(fake_backend, model_dir, tmp_path):
    from agentrl.jobs import rollout as jr
    from agentrl.jobs.plan import RolloutOptions
    fake_backend.die_after = 2
    opts = RolloutOptions(engine=NAME, model=str(model_dir), server=['fake://a'], split='heldout', repeats=1,
                          max_new_tokens=6, max_turns=2, seed=1, chunk_size=6, out=str(tmp_path / 'run'))
    with pytest.raises(FakeDied) as e:
        jr.rollout_job(opts, progress=False)
    assert str(e.value) == (f'{NAME} server fake://a died (connection reset); 2 of 6 episodes are stored in '
                            f"'{tmp_path / 'run'}'; fix: restart the server (see its log), then finish the run with: "
                            f"agentrl rollout --resume {tmp_path / 'run'} --model {model_dir} --server fake://a")
    assert len(stored_rows(tmp_path / 'run' / 'trajectories')) == 2
    # the resume checks the stored records against the backend's facts (policy, declared spec, fingerprints)
    fake_backend.die_after = None
    jr.rollout_job(dataclasses.replace(RolloutOptions(resume=str(tmp_path / 'run')), model=str(model_dir),
                                       server=['fake://a']), progress=False)
    rows = canonical(stored_rows(tmp_path / 'run' / 'trajectories'), {})
    # the 4 resumed episodes sample as a batch of 4, not 6: the same ids, log-probs equal to fp rounding
    assert [(r['policy'], r['ids']) for r in rows] == [(NAME, w['ids']) for w in _golden_rows()]
