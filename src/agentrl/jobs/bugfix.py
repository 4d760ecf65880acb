"""L5: the BugFix gym behind function calling, for any engine: the one home of the gym's glue.

:class:`BugFixAdapter` owns one :class:`~agentrl.gym.BugFixEnv` per episode: it gives each
episode's opening messages, answers each decoded turn with a :class:`~agentrl.engines.episode.Reply`
(its call parsed from the text, never encoded again), and finishes the records with the parsed
calls and the gym's final info. :func:`bugfix_rollouts` (a Hugging Face model), :func:`bugfix_job`
(a model folder) and :func:`bugfix_server_rollouts` (the servers of any server backend) run BugFix
episodes on the one episode driver (:mod:`agentrl.engines.driver`), every option in one :class:`BugFixOptions`. The
engines never import the gym; this module, above them, joins the two. Torch-free at import (the
templates and the engines are imported by the functions that need them).

Source: docs/design.md#hf-engine; book chapter 5.2 (``TOOL_SCHEMAS`` as function-calling tools).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

from ..engines.episode import Reply
from ..families import QWEN3
from ..families.record_calls import record_calls, tool_names
from ..gym import TOOL_SCHEMAS, BugFixEnv
from ..record import Provenance, SamplingSpec, StopReason
from ..sampling import episode_seed

__all__ = ['BugFixAdapter', 'parse_tool_calls', 'gym_call', 'bugfix_opening', 'MALFORMED', 'BugFixOptions',
           'bugfix_rollouts', 'bugfix_job', 'bugfix_server_rollouts', 'bugfix_template', 'screenshot_settings']

#: Given to the gym for a turn without a valid call: it answers ``MESSAGES['malformed']``.
MALFORMED = ''


def parse_tool_calls(text: str, family=QWEN3) -> list | None:
    """The function calls of a decoded assistant turn, when every call in it is well formed.

    The family reads them (:meth:`~agentrl.families.Family.strict_calls`: calls inside reasoning do
    not count); parsing only, the text is never encoded again.

    Args:
        text: the decoded turn (without its end-of-turn token).
        family: the model family of the policy's template (the BugFix tools are taught in Qwen3's
            Hermes format, so that is the default).

    Returns:
        ``[(name, arguments)]`` in order, ``arguments`` a dict; ``[]`` when the turn calls nothing;
        None when a call is not ``ok`` or a call mark stands outside a block.

    Example:
        >>> parse_tool_calls('<tool_call>\\n{"name":"edit","arguments":{"op":"swap_minmax"}}\\n</tool_call>')
        [('edit', {'op': 'swap_minmax'})]

    Source: book chapter 5.2.
    """
    if not isinstance(text, str):
        return None
    calls = family.strict_calls(text)
    return None if calls is None else [(c.name, c.arguments) for c in calls]


def gym_call(calls) -> str | None:
    """Map parsed function calls to the BugFix gym's call text, or None when it is no valid call.

    The gym takes one call per turn: exactly one function call whose name is a gym tool and
    whose arguments are exactly the tool's (``read``, ``test``, ``submit``: none; ``edit``: one
    string ``op`` without whitespace; an unknown op still maps, and the gym answers ``error :
    unknown op``).

    Args:
        calls: the output of :func:`parse_tool_calls`.

    Returns:
        e.g. ``'<call> edit swap_minmax </call>'``, or None (the turn is a malformed call).

    Source: the gym's grammar (:mod:`agentrl.gym.calls`) and ``TOOL_SCHEMAS``.
    """
    if not calls or len(calls) != 1:
        return None
    name, args = calls[0]
    if name in ('read', 'test', 'submit') and not args:
        return f'<call> {name} </call>'
    if name == 'edit' and set(args) == {'op'} and isinstance(args['op'], str) and args['op'] \
            and len(args['op'].split()) == 1 and args['op'] == args['op'].strip():
        return f'<call> edit {args["op"]} </call>'
    return None


def bugfix_opening(issue: str) -> list:
    """The opening messages of a BugFix episode: the issue as the user message.

    The tools reach the model through the template's ``tools=`` (``TOOL_SCHEMAS``), so no
    system message is needed.

    Source: book chapter 5.2 (the clamp episode opens with the issue as the user turn).
    """
    return [{'role': 'user', 'content': issue}]


class BugFixAdapter:
    """BugFix episodes for a chat engine: openings, one :class:`Reply` per turn, the records' info.

    Args:
        tasks: one task per episode (repeat a task for a group).
        max_turns: the gym's turn budget (stop ``budget``); pass the driver the same limit.
        reward_tests: ``'hidden'`` or ``'public'`` (see :class:`~agentrl.gym.BugFixEnv`).
        template: the chat template the episodes are recorded with; given, :meth:`finish` stores each
            turn's call statuses and token spans as ``info['turn_calls']``
            (:func:`agentrl.families.record_calls.record_calls`, family :attr:`family`).
        screenshots: answer each ``read`` with a picture of the source instead of its text
            (:meth:`read_reply`); needs a vision-language ``template`` (its image processor settings size
            the picture). Why ``read`` and no new ``screenshot`` tool: the policy's tools, its prompt and
            the template fingerprint stay those of a text run, so the two modes differ only in the
            observation's modality and their records compare turn for turn.

    Attributes:
        tools: ``TOOL_SCHEMAS``, for the chat template's ``tools=``. family: the model family the
            calls are read in (Qwen3's Hermes blocks, as :func:`parse_tool_calls`).
        tasks, envs: the tasks and their environments (episode ``i`` steps ``envs[i]``).
        tool_calls: per episode, the parsed calls of each turn (``[{'name', 'arguments'}]``, None
            when the turn's text did not parse or the turn was cut at its budget).
        images: ``digest -> PNG bytes`` of every screenshot sent so far (each picture once): what the
            writer stores in ``RUN/images/`` with the records (``ShardWriter.write(records, images=...)``).

    Example:
        >>> adapter = BugFixAdapter(tasks, max_turns=6)
        >>> recorders = [ChatRecorder(template, m) for m in adapter.openings()]
        >>> trajs = adapter.finish(run_chat_episodes(sampler, recorders, adapter.respond, max_turns=6))

    Source: the gym's grammar (:mod:`agentrl.gym.calls`); book chapter 5.2.
    """

    tools = TOOL_SCHEMAS
    family = QWEN3

    def __init__(self, tasks, max_turns: int = 6, reward_tests: str = 'hidden', template=None,
                 screenshots: bool = False):
        self.template = template
        self.tasks = list(tasks)
        self.max_turns = int(max_turns)
        self.envs = [BugFixEnv(max_turns=max_turns, reward_tests=reward_tests) for _ in self.tasks]
        self.tool_calls: list = [[] for _ in self.tasks]
        self.images: dict = {}
        self.screen = screenshot_settings(template) if screenshots else None

    def openings(self) -> list:
        """Reset every env; one opening message list per task (:func:`bugfix_opening` of its issue)."""
        self.tool_calls = [[] for _ in self.tasks]
        return [bugfix_opening(env.reset(task)) for env, task in zip(self.envs, self.tasks)]

    def respond(self, i: int, turn, text: str) -> Reply:
        """Step episode ``i`` with the call in ``text``; the observation comes back as a ``tool`` message.

        Args:
            i: the episode. turn: the sampled turn (``turn.truncated``: cut at its token budget,
                then the turn is a malformed call whatever its text). text: the decoded turn
                without its end-of-turn token.

        Returns:
            :class:`Reply` with the gym's observation, reward, done and info; ``action`` is the
            gym call text (``''`` for a malformed call).
        """
        calls = None if turn.truncated else parse_tool_calls(text)
        call = gym_call(calls) if calls is not None else None
        self.tool_calls[i].append([{'name': n, 'arguments': a} for n, a in calls] if calls is not None else None)
        obs, reward, done, info = self.envs[i].step(call if call is not None else MALFORMED)
        shot = self.screen is not None and call is not None and call.split()[1:2] == ['read']
        content = self.read_reply(obs) if shot else obs
        return Reply(messages=[{'role': 'tool', 'content': content}], done=done, reward=reward, info=info,
                     action=call or '')

    def read_reply(self, text: str) -> list:
        """The ``tool`` message content of a ``read`` in screenshot mode: one ``image_url`` part, a
        ``data:image/png;base64,...`` URL of ``text`` drawn by :func:`~agentrl.gym.screenshot.render_screenshot`
        (the OpenAI chat format the gateway's tool results carry images in); the PNG is kept in :attr:`images`.

        The picture is sized by the template's processor settings (:func:`screenshot_settings`), so its
        placeholder count is ``(width / 28) * (height / 28)`` and fits the processor's ``max_pixels``.
        """
        import base64

        from ..gym.screenshot import render_screenshot
        from ..images import image_digest
        data = render_screenshot(text, **self.screen)
        self.images.setdefault(image_digest(data), data)
        return [{'type': 'image_url', 'image_url': {'url': 'data:image/png;base64,' + base64.b64encode(data).decode()}}]

    def finish(self, trajs: list) -> list:
        """Add ``info['tool_calls']`` to each record (in episode order), and the gym's final info
        (``task``, ``solved`` ...) to records the driver stopped as truncated; returns ``trajs``.

        Raises:
            ValueError: another number of records than tasks.
        """
        if len(trajs) != len(self.tasks):
            raise ValueError(f'BugFixAdapter.finish: {len(trajs)} records for {len(self.tasks)} tasks; '
                             'pass the records of every episode, in order')
        for i, t in enumerate(trajs):
            self.finish_one(i, t)
        return trajs

    def finish_one(self, i: int, traj):
        """:meth:`finish` for the record of episode ``i`` alone (e.g. the episodes that ended before
        a server died); returns ``traj``."""
        traj.info['tool_calls'] = self.tool_calls[i]
        if self.template is not None:
            traj.info['turn_calls'] = record_calls(traj, self.family, self.template, tool_names(self.tools))
        if traj.info.get('stop') == StopReason.TRUNCATED and 'task' not in traj.info:
            traj.info.update({k: v for k, v in self.envs[i].final_info(False).items() if k not in traj.info})
        return traj


@dataclass(frozen=True)
class BugFixOptions:
    """How BugFix episodes run, on any engine; every default in one place.

    Attributes:
        spec: the sampler (default temperature 1, no truncation, ``processed`` log-probs).
        max_new_tokens: token budget of one turn.
        max_turns: the gym's turn budget (stop ``budget``) and the driver's limit.
        reward_tests: ``'hidden'`` or ``'public'`` (see :class:`~agentrl.gym.BugFixEnv`).
        seed: run seed; without explicit ``seeds``, episode ``i`` of task ``t`` samples with
            :func:`agentrl.sampling.episode_seed` ``(seed, f'{seed}/hf/{t.name}', f'{seed}/hf/{t.name}/{i}')``.
        model_name: ``Provenance.model`` (HF default: the folder the model was loaded from; servers: the served name).
        policy_version: every record's ``provenance.policy_version`` (None: not recorded; HF only).
        batch_size: HF: episodes sampled at once (rows of the cache).
        cache: HF: use the KV cache (False: recompute every step).
        reuse_cache: HF: keep each episode's KV cache row across turns (:func:`~agentrl.engines.hf.run_chat_episodes`).
        max_context: HF: context limit (default the model's ``max_position_embeddings``).
        enable_thinking: HF without a ``template``: passed to the template when not None.
        concurrency: servers: requests in flight at once.
        logp_mode: servers: skip the probe and declare this mode (one already checked on these servers).
        screenshots: every ``read`` is answered with a PNG of the source (:class:`BugFixAdapter`); a
            vision-language model only (HF: give ``image_processor``; the episodes sample through the
            per-turn batch, each prompt with its pixels).
    """
    spec: SamplingSpec = field(default_factory=SamplingSpec)
    max_new_tokens: int = 256
    max_turns: int = 6
    reward_tests: str = 'hidden'
    seed: int = 0
    model_name: str | None = None
    policy_version: int | str | None = None
    batch_size: int = 32
    cache: bool = True
    reuse_cache: bool = True
    max_context: int | None = None
    enable_thinking: bool | None = None
    concurrency: int = 64
    logp_mode: str | None = None
    screenshots: bool = False


def _seeds(tasks, options: BugFixOptions, seeds, caller: str) -> list:
    """One int seed per task: ``seeds`` as given (checked), else the one seed rule over (run seed, task, index)."""
    if seeds is None:
        s = options.seed
        return [episode_seed(s, f'{s}/hf/{t.name}', f'{s}/hf/{t.name}/{i}') for i, t in enumerate(tasks)]
    if len(seeds) != len(tasks):
        raise ValueError(f'{caller}: {len(seeds)} seeds for {len(tasks)} tasks; pass one per task')
    return [int(x) for x in seeds]


def bugfix_rollouts(model, tokenizer, tasks, options: BugFixOptions = BugFixOptions(), *,
                    template: ChatTemplate | None = None, seeds=None, sampler=None, on_done: Callable | None = None,
                    profile: dict | None = None, image_processor=None, images: dict | None = None) -> list:
    """Roll out BugFix episodes with a Hugging Face model through real function calling.

    :func:`~agentrl.engines.hf.run_chat_episodes` with a :class:`BugFixAdapter`: the gym's
    ``TOOL_SCHEMAS`` become the template's tools; each turn is sampled from the recorder's prompt
    ids; its call is parsed from the decoded text (:func:`parse_tool_calls`, :func:`gym_call`) and
    stepped in a :class:`~agentrl.gym.BugFixEnv`; an unparseable call, and any turn cut at its token
    budget, gets ``error : malformed call``; the observation returns as a ``tool`` message.

    Args:
        model: a transformers causal LM (eval mode). tokenizer: its Hugging Face tokenizer.
        tasks: the episodes' tasks (one episode each; repeat a task for a group).
        options: :class:`BugFixOptions`.
        template: a ready :class:`~agentrl.templates.ChatTemplate` (overrides ``tokenizer`` and
            ``options.enable_thinking``; must carry the gym's tools).
        seeds: explicit per-episode seeds (one int per task) instead of ``options.seed``'s rule.
        sampler: a ready :class:`~agentrl.engines.hf.HFSampler` (or subclass) instead of one built from
            ``model`` and the options; its spec is the one recorded.
        on_done: progress callback ``on_done(i)``. profile: filled with the per-turn time split.
        image_processor: the model's image processor (:func:`~agentrl.engines.hf.vlm.load_image_processor`),
            given to the sampler this function builds; needed with ``options.screenshots``.
        images: optional dict, filled with ``digest -> PNG bytes`` of the screenshots the records name
            (what ``ShardWriter.write(records, images=...)`` stores).

    Returns:
        One :class:`~agentrl.record.Trajectory` per task, in order, with provenance (policy ``'hf'``,
        tokenizer and template fingerprints, the spec, the model id, the episode seed); ``info`` = the
        gym's final info + ``actions`` (gym call text, '' for a malformed call), ``tool_calls`` (parsed
        calls per turn, None if unparseable), ``turn_calls`` (every call block per turn with its status
        and token span, :class:`BugFixAdapter`), ``truncated_turns``, ``turn_tokens`` and ``template``.

    Raises:
        ImportError: without the ``hf`` extra.
        ValueError: ``seeds`` of another length than ``tasks``; ``options.screenshots`` without ``sampler`` or
            ``image_processor``; a template without image processor settings (:func:`screenshot_settings`); as
            ``run_chat_episodes``.

    Source: docs/design.md#hf-engine; book chapter 5.2 (``TOOL_SCHEMAS`` as function-calling tools).
    """
    from ..engines.hf import HFSampler, model_id, pad_token_id, run_chat_episodes
    from ..templates import ChatRecorder, ChatTemplate
    o = options
    if template is None:
        extra = {} if o.enable_thinking is None else {'enable_thinking': bool(o.enable_thinking)}
        template = ChatTemplate(tokenizer, tools=TOOL_SCHEMAS, **extra)
    if o.screenshots and sampler is None and image_processor is None:
        raise ValueError('bugfix_rollouts: options.screenshots sends images, which the sampler feeds only with the '
                         "model's image processor; pass image_processor=load_image_processor(model_dir)")
    adapter = BugFixAdapter(tasks, max_turns=o.max_turns, reward_tests=o.reward_tests, template=template,
                            screenshots=o.screenshots)
    if images is not None:
        adapter.images = images            # filled in place as the episodes go
    if sampler is None:
        sampler = HFSampler(model, template.stop_ids, o.spec, max_new_tokens=o.max_new_tokens, cache=o.cache,
                            pad_id=pad_token_id(template.tokenizer, model), tokenizer=template.tokenizer,
                            image_processor=image_processor)
    spec = sampler.spec
    recorders = [ChatRecorder(template, messages) for messages in adapter.openings()]
    seeds = _seeds(tasks, o, seeds, 'bugfix_rollouts')
    name = o.model_name or model_id(model)
    prov = lambda i: Provenance(policy='hf', sampling=spec, model=name, seed=seeds[i],  # noqa: E731
                                policy_version=o.policy_version)
    trajs = run_chat_episodes(sampler, recorders, adapter.respond, seeds=seeds, max_turns=o.max_turns,
                              max_context=o.max_context, batch_size=o.batch_size, provenance=prov, on_done=on_done,
                              reuse_cache=o.reuse_cache, profile=profile)
    return adapter.finish(trajs)


def bugfix_job(model_dir, tasks, options: BugFixOptions = BugFixOptions(), *, device=None,
               on_done: Callable | None = None, profile: dict | None = None) -> list:
    """Load a model folder and roll out BugFix episodes with it (:func:`bugfix_rollouts`).

    Args:
        model_dir: a ``save_pretrained`` folder with its tokenizer (``agentrl make-test-model OUT``).
        tasks, options, on_done, profile: as :func:`bugfix_rollouts`.
        device: where to run (default: ``cuda`` when available, else CPU); parameters in fp32.

    Raises:
        ImportError: without the ``hf`` extra. FileNotFoundError / ValueError: as
            :func:`~agentrl.engines.hf.load_model`; with ``options.screenshots``, a folder without
            ``preprocessor_config.json``.
    """
    import torch

    from ..engines.hf import load_model
    if device is None:
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    model, tok = load_model(model_dir, device=device)
    proc = None
    if options.screenshots:
        from ..engines.hf.vlm import load_image_processor
        proc = load_image_processor(model_dir)
    return bugfix_rollouts(model, tok, tasks, options, on_done=on_done, profile=profile, image_processor=proc)


def bugfix_server_rollouts(engine: str, endpoints, template: ChatTemplate, tasks,
                           options: BugFixOptions = BugFixOptions(), *, seeds, on_done: Callable | None = None,
                           responses: list | None = None, images: dict | None = None) -> list:
    """BugFix episodes on the servers of backend ``engine``: its rollout kit's ``episodes`` with a :class:`BugFixAdapter`.

    The backend is asked through the registry (:func:`~agentrl.engines.factory.rollout_kit`,
    docs/design.md#engines); e.g. ``'vllm'`` runs :func:`~agentrl.engines.vllm.run_vllm_episodes`.

    Args:
        engine: a registry name of a backend with ``servers``.
        endpoints: its servers (the kit's ``connect``). template: a :class:`~agentrl.templates.ChatTemplate`
            with the gym's ``TOOL_SCHEMAS`` as tools (:func:`bugfix_template`).
        tasks: one task per episode. options: :class:`BugFixOptions` (``spec``, ``max_new_tokens``,
            ``max_turns``, ``reward_tests``, ``model_name``, ``concurrency``, ``logp_mode``).
        seeds: one episode seed per task. on_done: ``on_done(i, record)`` as each episode ends (its
            ``info['tool_calls']`` already added). responses: optional list of the servers' answers (tests, audits).
        images: optional dict, filled as the episodes go with ``digest -> PNG bytes`` of the screenshots of
            ``options.screenshots`` (the pictures of the episodes an ``EngineDied`` keeps included). The turn
            requests carry them (``TurnRequest.images``); a backend whose batch does not feed images refuses
            them in one line (:func:`~agentrl.engines.contract.check_request`, docs/design.md#images).

    Returns:
        The records, with ``info['tool_calls']`` and ``info['turn_calls']`` as :func:`bugfix_rollouts`'s.

    Raises:
        ValueError: an unknown ``engine`` or one without servers; ``seeds`` of another length than ``tasks``.
        As the kit's ``episodes`` (an ``EngineDied`` with ``finished`` for a server that died).
    """
    from ..engines.factory import rollout_kit
    from ..templates import ChatRecorder
    kit = rollout_kit(engine)
    o = options
    seeds = _seeds(tasks, o, seeds, 'bugfix_server_rollouts')
    adapter = BugFixAdapter(tasks, max_turns=o.max_turns, reward_tests=o.reward_tests, template=template,
                            screenshots=o.screenshots)
    if images is not None:
        adapter.images = images            # filled in place: kept when the servers die mid-run
    recorders = [ChatRecorder(template, messages) for messages in adapter.openings()]

    def done(i, rec):                      # finished as the others before it is streamed (or kept by EngineDied)
        adapter.finish_one(i, rec)
        if on_done is not None:
            on_done(i, rec)

    return kit.episodes(endpoints, recorders, adapter.respond, seeds=seeds, spec=o.spec,
                        max_new_tokens=o.max_new_tokens, max_turns=o.max_turns, model_name=o.model_name or '',
                        concurrency=o.concurrency, on_done=done, responses=responses, logp_mode=o.logp_mode)


def screenshot_settings(template) -> dict:
    """The :func:`~agentrl.gym.screenshot.render_screenshot` sizes of a vision-language ``template``:
    ``max_pixels``, ``min_pixels`` and ``factor`` (``patch_size * merge_size``) of its image processor.

    Raises:
        ValueError: a template without image processor settings (a text-only model folder): screenshots need
            a vision-language model (``agentrl make-test-model --vision OUT`` builds one).
    """
    v = getattr(template, 'vision', None)
    if not v:
        raise ValueError('screenshots: the chat template has no image processor settings (no '
                         'preprocessor_config.json beside the tokenizer); pass a vision-language model folder')
    return {'max_pixels': int(v['max_pixels']), 'min_pixels': int(v['min_pixels']),
            'factor': int(v['patch_size']) * int(v['merge_size'])}


def bugfix_template(tokenizer, **options) -> ChatTemplate:
    """The BugFix chat template: a tokenizer (or its folder, e.g. the served model's) with the gym's ``TOOL_SCHEMAS``.

    The same template for every engine (its fingerprint goes into the records).

    Raises:
        ImportError: without the ``hf`` extra. OSError: a folder without tokenizer files.
    """
    from ..templates import ChatTemplate, load_tokenizer
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(str(tokenizer))
    return ChatTemplate(tokenizer, tools=TOOL_SCHEMAS, **options)
