"""L4: load a local Hugging Face causal LM and its tokenizer; build the small Qwen3 (or Qwen2.5-VL) test model.

transformers is imported inside the functions (extra ``pip install agentrl[hf]``). Nothing is
downloaded: every path here is a local folder.
"""
from __future__ import annotations

import inspect
import json
import math
import os
import shutil
from pathlib import Path

import torch

from ...templates.chat import find_tokenizer_dir, load_tokenizer, require_hf
from ...templates.loading import generation_eos_ids

__all__ = ['load_model', 'make_test_model', 'default_tokenizer_dir', 'model_id', 'score_rows',
           'forward_kwargs', 'pad_token_id', 'is_vision_model', 'TOKENIZER_FILES', 'MAX_TEST_MODEL_PARAMS',
           'VISION_TEST_PROCESSOR', 'VISION_TEMPLATE']

#: Parameters a test model may have (about 3.7 GiB of float32), checked before it is allocated (docs/design.md#bounds).
MAX_TEST_MODEL_PARAMS = 1_000_000_000

#: Files copied from a tokenizer folder into a test model's folder (when present).
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'vocab.json', 'merges.txt', 'special_tokens_map.json',
                   'added_tokens.json', 'chat_template.jinja', 'chat_template.json', 'tokenizer.model',
                   'LICENSE', 'LICENSE-MODEL', 'LICENSE-CODE', 'NOTICE', 'USE_POLICY.md', 'PROVENANCE.md')
_TEST_MODEL_NOTE = 'agentrl_test_model.json'
#: The image processor settings of the vision test model (Qwen2-VL's PIL processor; at most 64 placeholder ids an
#: image: ``max_pixels`` is 64 merged 28 x 28 patches).
VISION_TEST_PROCESSOR = {'patch_size': 14, 'merge_size': 2, 'temporal_patch_size': 2, 'min_pixels': 56 * 56,
                         'max_pixels': 28 * 28 * 64}
#: The chat template of the vision test model: TRL's copy of Qwen2.5-VL's, read from the installed trl at build time.
VISION_TEMPLATE = 'qwen2_5_vl'
#: The tokens a Qwen2-VL-style model needs in its tokenizer, by config field.
_VISION_TOKENS = {'image_token_id': '<|image_pad|>', 'video_token_id': '<|video_pad|>',
                  'vision_start_token_id': '<|vision_start|>', 'vision_end_token_id': '<|vision_end|>'}


def _dtype_kwarg(transformers) -> str:
    """``'dtype'`` on transformers >= 4.56, ``'torch_dtype'`` before (the keyword was renamed)."""
    try:
        major, minor = (int(x) for x in transformers.__version__.split('.')[:2])
    except ValueError:  # pragma: no cover - dev versions
        return 'dtype'
    return 'dtype' if (major, minor) >= (4, 56) else 'torch_dtype'


def _quiet_progress(transformers):
    """Disable transformers' progress bars; return a function that restores the previous state."""
    lg = transformers.utils.logging
    was = lg.is_progress_bar_enabled()
    lg.disable_progress_bar()
    return lg.enable_progress_bar if was else (lambda: None)


def load_model(model_dir, *, dtype: torch.dtype = torch.float32, device: str | torch.device | None = None,
               tokenizer_dir=None, attn_implementation: str | None = None):
    """Load a local causal LM and its tokenizer, in eval mode, for token-in/token-out rollouts.

    Args:
        model_dir: a folder written by ``save_pretrained`` (``config.json`` + weights), e.g. one
            made by :func:`make_test_model` or a downloaded Qwen3-0.6B.
        dtype: parameter dtype (default float32: the 1e-4 step-0 check is stated in fp32).
        device: where to put the model (default CPU).
        tokenizer_dir: tokenizer folder (default: ``model_dir``).
        attn_implementation: e.g. ``'eager'`` or ``'sdpa'`` (default: transformers' choice).

    Returns:
        ``(model, tokenizer)``: an ``AutoModelForCausalLM`` in eval mode (``AutoModelForImageTextToText`` for a
        vision-language folder, :func:`is_vision_model`) and an ``AutoTokenizer``.

    Raises:
        ImportError: without the ``hf`` extra (``pip install agentrl[hf]``).
        FileNotFoundError: ``model_dir`` has no ``config.json``; pass a folder written by
            ``save_pretrained`` (``agentrl make-test-model OUT`` makes one).
        ValueError: the folder holds no causal LM, its weights cannot be read (a truncated
            ``model.safetensors``: ``model 'DIR' could not be loaded as a causal LM (SafetensorError: ...);
            if its weights are damaged ...``), or no tokenizer (the message names which), one line.

    Source: Hugging Face ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``.
    """
    transformers = require_hf('load_model')
    model_dir = Path(model_dir)
    if not (model_dir / 'config.json').is_file():
        raise FileNotFoundError(f'--model {str(model_dir)!r} has no config.json; pass a folder written by '
                                'save_pretrained (`agentrl make-test-model OUT` builds a small one)')
    kwargs = {_dtype_kwarg(transformers): dtype}
    if attn_implementation:
        kwargs['attn_implementation'] = attn_implementation
    restore = _quiet_progress(transformers)
    try:
        try:
            cls = transformers.AutoModelForCausalLM
            if is_vision_model(model_dir):
                cls = transformers.AutoModelForImageTextToText      # the model with its vision tower
            model = cls.from_pretrained(str(model_dir), **kwargs)
        except ImportError:
            raise
        except Exception as e:  # OSError, ValueError, SafetensorError (a cut weights file), torch errors ...
            msg = (str(e).strip().splitlines() or [''])[0]
            raise ValueError(f'model {str(model_dir)!r} could not be loaded as a causal LM ({type(e).__name__}: '
                             f'{msg}); if its weights are damaged or partly copied, copy or download them again; '
                             'else pass a folder written by save_pretrained') from e
        tdir = Path(tokenizer_dir) if tokenizer_dir is not None else model_dir
        try:
            tok = load_tokenizer(str(tdir))
        except ValueError as e:
            raise ValueError(f'no tokenizer could be loaded from {str(tdir)!r} ({type(e).__name__}: {e}); '
                             'save the tokenizer next to the model or pass tokenizer_dir') from e
    finally:
        restore()
    model.eval()
    if device is not None:
        model.to(device)
    return model, tok


def is_vision_model(model_dir) -> bool:
    """Whether ``model_dir``'s ``config.json`` describes a vision-language model (it has a ``vision_config``)."""
    try:
        return 'vision_config' in json.loads((Path(model_dir) / 'config.json').read_text())
    except (OSError, ValueError):
        return False


def model_id(model) -> str:
    """The model's id for provenance: its ``name_or_path`` (the folder it was loaded from), or its class.

    Source: design notes (``Provenance.model``: model or checkpoint id).
    """
    cfg = getattr(model, 'config', None)
    name = (getattr(cfg, '_name_or_path', '') or getattr(cfg, 'name_or_path', '')) if cfg is not None else ''
    if name and os.path.isdir(name):
        name = os.path.abspath(name)
    return name or type(model).__name__


def forward_kwargs(model) -> dict:
    """How to pass a KV cache and the kept-logits count to ``model.forward`` in this transformers.

    Returns:
        ``{'cache': name or None, 'keep': name or None}``: the cache keyword (``'cache'`` in
        transformers >= 5.x, ``'past_key_values'`` before) and the logits-to-keep keyword
        (``'logits_to_keep'``, ``'num_logits_to_keep'`` on older releases, None if unsupported).

    Source: transformers ``Qwen3ForCausalLM.forward`` signatures across releases.
    """
    params = inspect.signature(model.forward).parameters
    cache = 'cache' if 'cache' in params else 'past_key_values' if 'past_key_values' in params else None
    keep = next((k for k in ('logits_to_keep', 'num_logits_to_keep') if k in params), None)
    return {'cache': cache, 'keep': keep}


#: The one lookup of a real tokenizer family folder (``$AGENTRL_TOKENIZERS``, ``../shared/tokenizers``,
#: the hub for ungated repos): :func:`agentrl.templates.chat.find_tokenizer_dir`.
default_tokenizer_dir = find_tokenizer_dir


def _qwen3_parameters(vocab: int, layers: int, hidden: int, heads: int, kv_heads: int) -> int:
    """Parameters of the test model's ``Qwen3ForCausalLM`` (tied embeddings, MLP ``2 * hidden`` wide)."""
    hd = hidden // heads
    attention = 2 * hidden * heads * hd + 2 * hidden * kv_heads * hd + 2 * hd
    return vocab * hidden + layers * (attention + 3 * hidden * 2 * hidden + 2 * hidden) + hidden


def make_test_model(out_dir, tokenizer_dir=None, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                    kv_heads: int = 2, seed: int = 0, end_of_turn_rate: float | None = 0.05,
                    token_rates: dict | None = None, max_positions: int = 4096, vision: bool = False,
                    chat_template: str | None = None) -> Path:
    """Build a small randomly initialised Qwen3 paired with a real tokenizer, saved with ``save_pretrained``.

    The architecture is transformers' ``Qwen3ForCausalLM`` (RoPE, GQA, q/k norms, tied
    embeddings) at a toy size: 2 layers and hidden 64 give about 9.8M parameters, almost all of
    them the 151,669 x 64 embedding. The tokenizer files are copied byte for byte.

    A random model spreads its probability almost uniformly over the vocabulary, so it would
    practically never write its end-of-turn token and every turn would be cut at
    ``max_new_tokens``. With ``end_of_turn_rate`` the model gets one constant hidden channel
    (channel 0 of every embedding, never written by attention or MLP outputs) and the end-of-turn
    token's embedding is raised on that channel, so that it is sampled with about that
    probability per token at temperature 1 (turns of about ``1 / rate`` tokens); ``token_rates``
    does the same for other tokens (e.g. ``{'</think>': 0.05}`` for turns that hold reasoning the
    template can strip). Everything else stays random and context-dependent. The result is an
    ordinary Qwen3 checkpoint.

    Args:
        out_dir: folder to write (created; existing model files are overwritten).
        tokenizer_dir: tokenizer folder (default :func:`default_tokenizer_dir`, the real Qwen3 one).
        layers, hidden, heads, kv_heads: model size (``hidden`` divisible by ``heads``, ``heads``
            by ``kv_heads``); the MLP is ``2 * hidden`` wide.
        seed: initialisation seed (the global RNG is left untouched).
        end_of_turn_rate: target probability of the end-of-turn token (the tokenizer's
            ``eos_token``) per sampled token, in (0, 1); None keeps the plain random init.
        token_rates: ``{token string: rate}`` for more single tokens (all rates summing below 1).
        max_positions: ``max_position_embeddings`` (the context limit rollouts respect).
        vision: build transformers' ``Qwen2_5_VLForConditionalGeneration`` instead: the same text model
            (its 3-D rotary sections split head_dim / 2 as Qwen2.5-VL does, 1/4 time and 3/8 each for height and
            width: 2/3/3 at head_dim 16, 4/6/6 at 32) with a 2-block vision tower of width 32
            (patch 14, merge 2), its image processor saved as ``preprocessor_config.json`` with
            :data:`VISION_TEST_PROCESSOR` (Qwen2-VL's PIL processor: no torchvision needed), and the chat template
            ``chat_template.jinja`` (default: TRL's copy of Qwen2.5-VL's, :data:`VISION_TEMPLATE`, read from the
            installed trl). The tokenizer must hold ``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``
            and ``<|video_pad|>`` (Qwen3's does).
        chat_template: with ``vision``, the template text to save instead of TRL's.

    Returns:
        ``Path(out_dir)``, holding ``config.json``, ``model.safetensors``, ``generation_config.json``
        (its ``eos_token_id`` the tokenizer folder's ``generation_config.json`` list when it has one, as
        the model's repository ships it, else the ``eos_token`` id), the tokenizer files and ``agentrl_test_model.json`` (the build options and the measured
        per-token rates).

    Raises:
        ImportError: without the ``hf`` extra.
        FileNotFoundError: no tokenizer folder (pass ``tokenizer_dir``).
        ValueError: with ``vision``, a tokenizer without the vision tokens, a head_dim not a multiple of 8, or no
            chat template (trl not installed: ``pip install trl`` or pass ``chat_template``);
            sizes that do not divide, an odd head_dim, or more than :data:`MAX_TEST_MODEL_PARAMS`
            parameters (refused before anything is allocated); a rate outside (0, 1), rates summing to 1 or more,
            or a ``token_rates`` key that is not one token; the tokenizer has no ``eos`` token.

    Example:
        >>> path = make_test_model('/tmp/tiny-qwen3')        # a few seconds on one CPU core
        >>> model, tok = load_model(path)

    Source: docs/design.md#hf-engine.
    """
    transformers = require_hf('make_test_model')
    if hidden % heads or heads % kv_heads or layers < 1:
        raise ValueError(f'make_test_model: hidden ({hidden}) must be divisible by heads ({heads}), heads by '
                         f'kv_heads ({kv_heads}), and layers ({layers}) >= 1')
    if (hidden // heads) % 2:
        raise ValueError(f'make_test_model: hidden ({hidden}) / heads ({heads}) gives head_dim {hidden // heads}, '
                         'which is odd; rotary position embeddings rotate pairs of channels: pass sizes whose '
                         'quotient is even')
    tdir = Path(tokenizer_dir) if tokenizer_dir is not None else default_tokenizer_dir('qwen3')
    if not (tdir / 'tokenizer_config.json').is_file():
        raise FileNotFoundError(f'--tokenizer {str(tdir)!r} has no tokenizer_config.json; pass a tokenizer folder')
    tok = load_tokenizer(str(tdir))
    if tok.eos_token is None:
        raise ValueError(f'the tokenizer in {str(tdir)!r} has no eos_token (end-of-turn token)')
    eot = tok.convert_tokens_to_ids(tok.eos_token)
    wanted = dict({tok.eos_token: end_of_turn_rate} if end_of_turn_rate is not None else {}, **(token_rates or {}))
    rates = {}
    for text, rate in wanted.items():
        ids = tok(text, add_special_tokens=False)['input_ids']
        if len(ids) != 1:
            raise ValueError(f'make_test_model: token_rates key {text!r} encodes to {len(ids)} tokens; '
                             'use single tokens')
        if not 0.0 < float(rate) < 1.0:
            raise ValueError(f'make_test_model: the rate of {text!r} must be in (0, 1), got {rate}')
        rates[ids[0]] = float(rate)
    if sum(rates.values()) >= 1.0:
        raise ValueError(f'make_test_model: token rates sum to {sum(rates.values())}; they must sum below 1')
    n = _qwen3_parameters(len(tok), layers, hidden, heads, kv_heads)
    if n > MAX_TEST_MODEL_PARAMS:
        raise ValueError(f'make_test_model: layers {layers} x hidden {hidden} with the {len(tok):,}-token vocabulary '
                         f'make {n:,} parameters ({n * 4 / 2 ** 30:.1f} GiB of float32), over the bound of '
                         f'{MAX_TEST_MODEL_PARAMS:,} for a test model; lower hidden (--hidden) or layers (--layers): '
                         'hidden 64 and 2 layers make about 9.8M')
    text = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                tie_word_embeddings=True, eos_token_id=eot,
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eot, bos_token_id=tok.bos_token_id)
    if vision:
        template_text = _vision_template(chat_template)
        cfg = _vision_config(transformers, tok, text, hidden // heads)
        build = transformers.Qwen2_5_VLForConditionalGeneration
    else:
        cfg = transformers.Qwen3Config(head_dim=hidden // heads, **text)
        build = transformers.Qwen3ForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build(cfg).eval()
    measured = None
    if rates:
        measured = {tok.convert_ids_to_tokens(t): r for t, r in _bias_tokens(model, rates, seed).items()}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    restore = _quiet_progress(transformers)
    gen_eos = generation_eos_ids(tdir)         # the tokenizer folder's model stops, as vLLM would read them
    try:
        model.generation_config.eos_token_id = list(gen_eos) if gen_eos else eot
        model.generation_config.pad_token_id = cfg.pad_token_id
        model.save_pretrained(str(out))
    finally:
        restore()
    for name in TOKENIZER_FILES:
        if (tdir / name).is_file():
            shutil.copyfile(tdir / name, out / name)
    if vision:
        _save_vision_files(transformers, out, template_text)
    note = {'builder': 'agentrl.engines.hf.make_test_model', 'tokenizer_dir': str(tdir.resolve()), 'layers': layers,
            'hidden': hidden, 'heads': heads, 'kv_heads': kv_heads, 'seed': seed,
            'token_rates': {tok.convert_ids_to_tokens(t): r for t, r in rates.items()}, 'measured_rates': measured,
            'parameters': sum(p.numel() for p in model.parameters())}
    if vision:
        note['vision'] = {'architecture': 'Qwen2_5_VLForConditionalGeneration', 'processor': VISION_TEST_PROCESSOR,
                          'chat_template': VISION_TEMPLATE if chat_template is None else 'given'}
    (out / _TEST_MODEL_NOTE).write_text(json.dumps(note, indent=2) + '\n')
    return out


def _vision_template(chat_template: str | None) -> str:
    """The vision test model's chat template: ``chat_template``, else TRL's ``VISION_TEMPLATE`` from the installed trl."""
    if chat_template is not None:
        return chat_template
    from importlib import metadata
    try:
        path = Path(metadata.distribution('trl').locate_file(f'trl/chat_templates/{VISION_TEMPLATE}.jinja'))
    except metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ValueError(f'make_test_model(vision=True) reads the {VISION_TEMPLATE} chat template from the installed '
                         "trl, which is missing: pip install trl (the dev extra), or pass chat_template='...'")
    return path.read_text()


def _vision_config(transformers, tok, text: dict, head_dim: int):
    """``Qwen2_5_VLConfig`` of the vision test model around the text model's settings ``text``."""
    if head_dim % 8:
        raise ValueError(f'make_test_model(vision=True): head_dim {head_dim} (hidden / heads) is not a multiple of 8; '
                         'the 3-D rotary sections split head_dim / 2 over time, height and width: pass e.g. hidden 64 '
                         'with heads 4 (or 2)')
    half = head_dim // 2
    sections = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    ids = {}
    for key, t in _VISION_TOKENS.items():
        i = tok.convert_tokens_to_ids(t)
        if i is None or i == tok.unk_token_id or tok.convert_ids_to_tokens(i) != t:
            raise ValueError(f'make_test_model(vision=True): the tokenizer has no {t!r} token; use a Qwen tokenizer')
        ids[key] = i
    text = dict(text, rope_parameters={'rope_type': 'default', 'rope_theta': 1e6, 'mrope_section': sections})
    vis = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text['hidden_size'],
               window_size=112, fullatt_block_indexes=[1], **{k: VISION_TEST_PROCESSOR[k] for k in
                                                             ('patch_size', 'temporal_patch_size')},
               spatial_merge_size=VISION_TEST_PROCESSOR['merge_size'])
    return transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vis, tie_word_embeddings=True,
                                         eos_token_id=text['eos_token_id'], pad_token_id=text['pad_token_id'], **ids)


def _save_vision_files(transformers, out: Path, template_text: str) -> None:
    """Write the image processor (``preprocessor_config.json``) and ``chat_template.jinja`` into ``out``."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    Qwen2VLImageProcessorPil(**VISION_TEST_PROCESSOR).save_pretrained(str(out))
    (out / 'chat_template.jinja').write_text(template_text)


def _decoder_layers(model):
    """The decoder layers of a causal LM or of a vision-language model's language model."""
    inner = model.model
    return getattr(inner, 'language_model', inner).layers


@torch.no_grad()
def _bias_tokens(model, rates: dict, seed: int, channel_value: float = 0.5) -> dict:
    """Give the model a constant hidden channel and raise chosen tokens' logits on it; return measured rates.

    Channel 0 of every token embedding is set to ``channel_value`` and rows 0 of every
    ``o_proj`` / ``down_proj`` are zeroed, so channel 0 of the residual stream is that constant
    everywhere; after the final RMSNorm it is an almost constant ``h0``. With tied embeddings the
    logit of token v gains ``h0 * E[v, 0]``: the same for every token except the chosen ones,
    whose ``E[v, 0]`` is raised by ``log(rate_v / (1 - R) * (V - n)) / h0`` (``R`` the sum of
    the ``n`` rates), which gives each about its rate when the other logits are nearly flat.
    """
    emb = model.get_input_embeddings().weight
    V = emb.shape[0]
    emb[:, 0] = channel_value
    for layer in _decoder_layers(model):
        layer.self_attn.o_proj.weight[0] = 0.0
        layer.mlp.down_proj.weight[0] = 0.0
    gen = torch.Generator().manual_seed(seed + 1)
    probe = torch.randint(0, V, (4, 64), generator=gen)
    h0 = float(model.model(input_ids=probe).last_hidden_state[..., 0].mean())
    total, n = sum(rates.values()), len(rates)
    for tid, rate in rates.items():
        emb[tid, 0] = channel_value + math.log(rate / (1.0 - total) * (V - n)) / h0
    probs = model(input_ids=probe).logits.float().softmax(-1)
    return {tid: round(float(probs[..., tid].mean()), 4) for tid in rates}


def scoring_head(model):
    """``(decoder, output head, softcap)`` for scoring only the needed rows, or None."""
    get_dec = getattr(model, 'get_decoder', None)
    get_out = getattr(model, 'get_output_embeddings', None)
    if get_dec is None or get_out is None:
        return None
    try:
        dec, head = get_dec(), get_out()
    except (AttributeError, NotImplementedError):
        return None
    if dec is None or head is None or dec is model:
        return None
    return dec, head, getattr(getattr(model, 'config', None), 'final_logit_softcapping', None)


@torch.no_grad()
def score_rows(model, ids: torch.Tensor, attention_mask: torch.Tensor, rows: list) -> list:
    """Logits at chosen prediction rows of a right-padded batch, from one plain forward pass.

    Args:
        model: a transformers causal LM.
        ids: ``[B, T]`` int64, right-padded.
        attention_mask: ``[B, T]`` (1 on real tokens).
        rows: B int64 tensors; ``rows[b]`` are positions j whose logits predict ``ids[b, j+1]``.

    Returns:
        B float32 tensors ``[len(rows[b]), V]``.

    Notes:
        Only the requested rows go through the output head (a 150k vocabulary makes full
        ``[B, T, V]`` logits hundreds of MB per record); the decoder runs with default
        positions, which are right for right padding. Models with a final logit soft-cap
        (Gemma 2) get it applied.

    Source: book chapter 3.7 / 5.7 (one causal forward pass over the padded batch).
    """
    dev = next(model.parameters()).device
    ids, attention_mask = ids.to(dev), attention_mask.to(dev).long()
    parts = scoring_head(model)
    if parts is None:
        logits = model(input_ids=ids, attention_mask=attention_mask).logits
        return [logits[b, r.to(dev)].float().cpu() for b, r in enumerate(rows)]
    dec, head, cap = parts
    hidden = dec(input_ids=ids, attention_mask=attention_mask).last_hidden_state
    out = []
    for b, r in enumerate(rows):
        lg = head(hidden[b, r.to(dev)]).float()
        if cap:
            lg = torch.tanh(lg / cap) * cap
        out.append(lg.cpu())
    return out


def pad_token_id(tokenizer, model) -> int:
    """The id to pad prompts with: the tokenizer's pad id, else the model config's, else EOS, else 0."""
    config = getattr(model, 'config', None)
    for cand in (getattr(tokenizer, 'pad_token_id', None), getattr(config, 'pad_token_id', None),
                 getattr(tokenizer, 'eos_token_id', None)):
        if cand is not None:
            return int(cand)
    return 0
