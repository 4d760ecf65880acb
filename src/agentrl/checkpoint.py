"""L1: TinyAgent checkpoints: save, load, and the bounds checked before anything is allocated.

The file is ``torch.save({'config': model.config(), 'state_dict': ...})``; loading never runs
code (``weights_only=True``) and checks the config and every weight's shape first.
"""
from __future__ import annotations

import os

import torch

from .model import TinyAgent

__all__ = ['save_checkpoint', 'load_checkpoint', 'checkpoint_config', 'CHECKPOINT_BOUNDS', 'MAX_CHECKPOINT_PARAMS']


def save_checkpoint(model: TinyAgent, path: str) -> None:
    """Save weights and config to ``path`` through :func:`agentrl.io.atomic_path` (never a half-written file).

    Raises:
        OSError: the write failed (full disk, read-only folder); no temporary file is left.
    """
    from .io import atomic_path         # looked up per call: tests fill the disk through io.atomic_path
    with atomic_path(path) as tmp:
        torch.save({'config': model.config(), 'state_dict': model.state_dict()}, tmp)


#: Bounds on a checkpoint's config, checked before anything is allocated (TinyAgent is a toy:
#: the defaults are V=316, max_len=256, d_model=64, 2 layers, 4 heads, about 0.11 M parameters).
CHECKPOINT_BOUNDS = {'vocab_size': (1, 1 << 20), 'max_len': (2, 1 << 16), 'd_model': (1, 4096),
                     'n_layers': (1, 64), 'n_heads': (1, 256)}
#: Most parameters a checkpoint may declare (2**27 float32 = 512 MiB).
MAX_CHECKPOINT_PARAMS = 1 << 27


def _param_count(cfg: dict) -> int:
    """Parameters of ``TinyAgent(**cfg)`` without building it (embeddings, blocks, final norm, head)."""
    V, L, d, n = cfg['vocab_size'], cfg['max_len'], cfg['d_model'], cfg['n_layers']
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return V * d + L * d + n * block + 2 * d + (d * V + V)


def checkpoint_config(cfg, where: str = 'checkpoint') -> dict:
    """Validate and bound a TinyAgent config before anything is allocated.

    Args:
        cfg: the checkpoint's ``config`` dict (keys of :meth:`TinyAgent.config`; ``max_len``,
            ``d_model``, ``n_layers`` and ``n_heads`` default to the constructor's).
        where: how to name the checkpoint in errors (its path).

    Returns:
        the config as a dict of ints, every value within :data:`CHECKPOINT_BOUNDS`.

    Raises:
        ValueError: not a dict, an unknown key, a value that is not an int or out of bounds,
            ``d_model`` not divisible by ``n_heads``, or more than :data:`MAX_CHECKPOINT_PARAMS`
            parameters. Fix: save the model with :func:`save_checkpoint`.
    """
    fix = 'save the model with agentrl.checkpoint.save_checkpoint'
    if not isinstance(cfg, dict):
        raise ValueError(f'{where}: config is a {type(cfg).__name__}, not a dict; {fix}')
    unknown = sorted(map(str, set(cfg) - set(CHECKPOINT_BOUNDS)))
    if unknown:
        raise ValueError(f'{where}: config has unknown keys {unknown[:5]} (known: {", ".join(CHECKPOINT_BOUNDS)}); '
                         f'{fix}')
    defaults = {'max_len': 256, 'd_model': 64, 'n_layers': 2, 'n_heads': 4}
    if 'vocab_size' not in cfg:
        raise ValueError(f'{where}: config has no vocab_size; {fix}')
    out = {}
    for key, (lo, hi) in CHECKPOINT_BOUNDS.items():
        v = cfg.get(key, defaults.get(key))
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ValueError(f'{where}: config {key} is {v!r}, not an int in [{lo}, {hi}]; {fix}')
        out[key] = v
    if out['d_model'] % out['n_heads']:
        raise ValueError(f'{where}: config d_model {out["d_model"]} is not divisible by n_heads {out["n_heads"]}; '
                         f'{fix}')
    n = _param_count(out)
    if n > MAX_CHECKPOINT_PARAMS:
        raise ValueError(f'{where}: config asks for {n:,} parameters ({4 * n / 2**30:.1f} GiB), more than the '
                         f'{MAX_CHECKPOINT_PARAMS:,} a TinyAgent checkpoint may hold; {fix}')
    return out


def load_checkpoint(path: str) -> TinyAgent:
    """Load a TinyAgent saved by :func:`save_checkpoint`, or a plain dict of ``state_dict``,
    ``vocab_size`` and (optional, default 256) ``max_len``.

    The file is read with ``torch.load(weights_only=True)`` (no code runs); the config is
    validated and bounded (:func:`checkpoint_config`), and every weight's name and shape is
    compared with the config, before the model is allocated.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not an agentrl TinyAgent checkpoint, its config is malformed or
            out of bounds, or its weights do not fit the config (one line naming the file).
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f'checkpoint {path!r} not found; pass the model.pt written by `agentrl train`')
    try:
        state = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:   # not a torch file at all (text, truncated, another pickle)
        raise ValueError(f'{path!r} is not an agentrl TinyAgent checkpoint (torch.load failed: '
                         f'{type(e).__name__}); pass model.pt from `agentrl train` or `agentrl rollout`') from None
    if isinstance(state, dict) and 'config' in state and 'state_dict' in state:
        cfg = checkpoint_config(state['config'], repr(path))
    elif isinstance(state, dict) and 'state_dict' in state and 'vocab_size' in state:
        cfg = checkpoint_config({'vocab_size': state['vocab_size'], 'max_len': state.get('max_len', 256)}, repr(path))
    else:
        raise ValueError(f'{path!r} is not an agentrl TinyAgent checkpoint (expected keys config and state_dict, '
                         'or state_dict, vocab_size and max_len)')
    weights = state['state_dict']
    if not isinstance(weights, dict) or not all(torch.is_tensor(v) for v in weights.values()):
        raise ValueError(f'{path!r}: state_dict is not a dict of tensors; save the model with '
                         'agentrl.checkpoint.save_checkpoint')
    with torch.device('meta'):
        want = {k: tuple(v.shape) for k, v in TinyAgent(**cfg).state_dict().items()}
    missing = sorted(set(want) - set(weights))
    extra = sorted(map(str, set(weights) - set(want)))
    if missing or extra:
        raise ValueError(f'{path!r}: state_dict does not fit the config {cfg} (missing {missing[:3]}, '
                         f'unexpected {extra[:3]}); save the model with agentrl.checkpoint.save_checkpoint')
    for k, shape in want.items():
        if tuple(weights[k].shape) != shape:
            raise ValueError(f'{path!r}: weight {k} has shape {list(weights[k].shape)}, but the config {cfg} '
                             f'needs {list(shape)}; save the model with agentrl.checkpoint.save_checkpoint')
    model = TinyAgent(**cfg)
    model.load_state_dict(weights)
    return model.eval()
