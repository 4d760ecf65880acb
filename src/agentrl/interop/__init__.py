"""L4: feed the trainers people use (verl, TRL, slime, OpenRLHF, SkyRL, prime-rl) and import their rollouts.

Exporters turn agentrl records into the exact batch each trainer consumes, doing the one slice at
``P-1`` that moves agentrl's ``[T-1]`` alignment to the framework's own-index response fields, and
refuse what would train silently wrong (named :class:`~agentrl.checks.errors.RecordError` subclasses):
a ``[T-1]`` mask handed where ``[T]`` is expected (``MaskAlignmentError``), log-probs and ids of
different lengths (``LogProbLengthError``), groups not contiguous where the trainer groups by
position (``GroupOrderError``), and truncated-support log-probs for a trainer that recomputes over
the full vocabulary (``SupportMismatchError``). Importers rebuild records from the frameworks'
batches and from vLLM / SGLang responses so ``agentrl check``, ``show`` and ``report`` work on them.

Framework packages are never imported here (verl only inside :func:`to_verl_dataproto` and file
loading); the layouts are written from their source at the versions named in each module.
"""
from .common import (SupportMismatchWarning, check_groups, check_support, expected_step0_ratio, sort_by_group, split,
                     split_turns)
from .correction import CORRECTION_FIELDS, ExportCorrection, load_correction
from .files import EXPORTS, IMPORTS, export, import_records, load_export
from .openai import from_openai, parse_response, spec_from_request
from .openrlhf import from_openrlhf, to_openrlhf
from .prime_rl import from_prime_rl, to_prime_rl
from .sft import SFT_FORMS, check_sft_row, to_sft
from .skyrl import from_skyrl, to_skyrl
from .slime import from_slime, to_slime
from .trl import from_trl, to_trl, to_trl_rollout, trl_reward, trl_rollout_func
from .verl import from_verl, to_verl, to_verl_dataproto

__all__ = ['to_verl', 'to_verl_dataproto', 'from_verl', 'to_trl', 'to_trl_rollout', 'from_trl', 'trl_rollout_func',
           'trl_reward', 'to_slime', 'from_slime', 'to_openrlhf', 'from_openrlhf', 'to_skyrl', 'from_skyrl',
           'to_prime_rl', 'from_prime_rl', 'to_sft', 'check_sft_row', 'SFT_FORMS', 'from_openai', 'parse_response',
           'spec_from_request', 'export', 'import_records', 'load_export', 'EXPORTS', 'IMPORTS', 'split',
           'check_groups', 'check_support', 'SupportMismatchWarning', 'expected_step0_ratio', 'sort_by_group',
           'split_turns', 'CORRECTION_FIELDS', 'ExportCorrection', 'load_correction']
