"""L4: BugFix episodes with a Hugging Face model: :func:`run_chat_episodes` + :class:`~agentrl.engines.bugfix.BugFixAdapter`.

Source: docs/design.md#hf-engine; book chapter 5.2.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...record import Provenance, SamplingSpec
from ...sampling import episode_seed
from ...templates import ChatRecorder, ChatTemplate
from ..bugfix import BugFixAdapter
from .episodes import run_chat_episodes
from .models import load_model, model_id, pad_token_id
from .sampler import HFSampler

__all__ = ['bugfix_rollouts', 'bugfix_job']


def bugfix_rollouts(model, tokenizer, tasks, *, spec: SamplingSpec | None = None, max_new_tokens: int = 256,
                    max_turns: int = 6, reward_tests: str = 'hidden', seed: int = 0, batch_size: int = 32,
                    cache: bool = True, max_context: int | None = None, enable_thinking: bool | None = None,
                    template: ChatTemplate | None = None, model_name: str | None = None, seeds=None,
                    sampler: HFSampler | None = None, on_done: Callable | None = None, reuse_cache: bool = True,
                    profile: dict | None = None, policy_version: int | str | None = None) -> list:
    """Roll out BugFix episodes with a Hugging Face model through real function calling.

    :func:`run_chat_episodes` with a :class:`~agentrl.engines.bugfix.BugFixAdapter`: the gym's
    ``TOOL_SCHEMAS`` become the template's tools; each turn is sampled from the recorder's prompt
    ids; its call is parsed from the decoded text (:func:`~agentrl.engines.bugfix.parse_tool_calls`,
    :func:`~agentrl.engines.bugfix.gym_call`) and stepped in a :class:`~agentrl.gym.BugFixEnv`; an
    unparseable call, and any turn cut at its token budget, gets ``error : malformed call``; the
    observation returns as a ``tool`` message through the template's bridge.

    Args:
        model: a transformers causal LM (eval mode). tokenizer: its Hugging Face tokenizer.
        tasks: the episodes' tasks (one episode each; repeat a task for a group).
        spec: the sampler (default temperature 1, no truncation, ``processed`` log-probs).
        max_new_tokens: token budget of one turn.
        max_turns: the gym's turn budget (stop ``budget``) and the loop's limit.
        reward_tests: ``'hidden'`` or ``'public'`` (see :class:`~agentrl.gym.BugFixEnv`).
        seed: run seed; without ``seeds``, episode ``i`` of task ``t`` samples with
            :func:`agentrl.sampling.episode_seed` ``(seed, f'{seed}/hf/{t.name}', f'{seed}/hf/{t.name}/{i}')``.
        seeds: explicit per-episode seeds instead (one int per task), e.g. to sample a subset of a
            run one by one with the seeds it had in the batch.
        batch_size: episodes per sampler call. cache: use the KV cache (False: recompute).
        max_context: context limit (default the model's ``max_position_embeddings``).
        enable_thinking: passed to the template when not None (Qwen3: False renders an empty
            think block after the generation prompt, template-owned).
        template: a ready :class:`~agentrl.templates.ChatTemplate` (overrides ``tokenizer``,
            ``enable_thinking``; must carry the gym's tools).
        model_name: ``Provenance.model`` (default the folder the model was loaded from).
        sampler: a ready :class:`~agentrl.engines.hf.HFSampler` (or subclass) to use instead of
            building one from ``model``, ``spec``, ``max_new_tokens`` and ``cache``; its spec
            is the one recorded.
        on_done: progress callback ``on_done(i)``.
        reuse_cache, profile: as :func:`run_chat_episodes` (keep each episode's KV cache across
            turns; fill ``profile`` with the per-turn time split).
        policy_version: every record's ``provenance.policy_version`` (training step or checkpoint
            fingerprint of ``model``'s weights; None: not recorded).

    Returns:
        One :class:`~agentrl.record.Trajectory` per task, in order, with provenance (policy
        ``'hf'``, tokenizer and template fingerprints, the spec, the model id, the episode seed);
        ``info`` = the gym's final info + ``actions`` (gym call text, '' for a malformed call),
        ``tool_calls`` (parsed calls per turn, None if unparseable), ``truncated_turns``,
        ``turn_tokens`` and ``template``.

    Raises:
        ImportError: without the ``hf`` extra.
        ValueError: ``seeds`` of another length than ``tasks``; as :func:`run_chat_episodes`.

    Source: docs/design.md#hf-engine; book chapter 5.2 (``TOOL_SCHEMAS`` as function-calling tools).
    """
    spec = spec if spec is not None else SamplingSpec()
    adapter = BugFixAdapter(tasks, max_turns=max_turns, reward_tests=reward_tests)
    if template is None:
        opts = {} if enable_thinking is None else {'enable_thinking': bool(enable_thinking)}
        template = ChatTemplate(tokenizer, tools=adapter.tools, **opts)
    if sampler is None:
        sampler = HFSampler(model, template.stop_ids, spec, max_new_tokens=max_new_tokens, cache=cache,
                            pad_id=pad_token_id(template.tokenizer, model), tokenizer=template.tokenizer)
    spec = sampler.spec
    recorders = [ChatRecorder(template, messages) for messages in adapter.openings()]
    if seeds is None:     # the one seed rule, over this call's identities (group = task, rollout = index)
        seeds = [episode_seed(seed, f'{seed}/hf/{t.name}', f'{seed}/hf/{t.name}/{i}') for i, t in enumerate(tasks)]
    elif len(seeds) != len(tasks):
        raise ValueError(f'bugfix_rollouts: {len(seeds)} seeds for {len(tasks)} tasks; pass one per task')
    seeds = [int(x) for x in seeds]
    name = model_name or model_id(model)
    prov = lambda i: Provenance(policy='hf', sampling=spec, model=name, seed=seeds[i],  # noqa: E731
                                policy_version=policy_version)
    trajs = run_chat_episodes(sampler, recorders, adapter.respond, seeds=seeds, max_turns=max_turns,
                              max_context=max_context, batch_size=batch_size, provenance=prov, on_done=on_done,
                              reuse_cache=reuse_cache, profile=profile)
    return adapter.finish(trajs)


def bugfix_job(model_dir, tasks, *, spec: SamplingSpec | None = None, max_new_tokens: int = 256, max_turns: int = 6,
               reward_tests: str = 'hidden', seed: int = 0, batch_size: int = 32, device=None,
               on_done: Callable | None = None, profile: dict | None = None) -> list:
    """Load a model folder and roll out BugFix episodes with it (what ``agentrl rollout --engine hf`` runs).

    Args:
        model_dir: a ``save_pretrained`` folder with its tokenizer (``agentrl make-test-model OUT``).
        tasks: one task per episode, in order.
        spec, max_new_tokens, max_turns, reward_tests, seed, batch_size, on_done, profile: as
            :func:`bugfix_rollouts`.
        device: where to run (default: ``cuda`` when available, else CPU); parameters in fp32.

    Returns:
        The records of :func:`bugfix_rollouts` (``Provenance.model`` is the folder's absolute path).

    Raises:
        ImportError: without the ``hf`` extra. FileNotFoundError / ValueError: as
        :func:`~agentrl.engines.hf.load_model`.

    Source: docs/design.md#hf-engine.
    """
    if device is None:
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    model, tok = load_model(model_dir, device=device)
    return bugfix_rollouts(model, tok, tasks, spec=spec, max_new_tokens=max_new_tokens, max_turns=max_turns,
                           reward_tests=reward_tests, seed=seed, batch_size=batch_size, on_done=on_done,
                           profile=profile)
