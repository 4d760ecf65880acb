"""Tokenizers load right or not at all: a probe text must encode and decode as the folder's tokenizer.json does.

``load_tokenizer`` checks :data:`agentrl.templates.loading.ROUND_TRIP_PROBE` (runs of spaces, a newline,
non-ASCII) against ``tokenizers.Tokenizer.from_file``; a class that encodes otherwise (transformers 5.10
loads DeepSeek-V3 as ``LlamaTokenizer`` with a Metaspace pre-tokenizer, tests/interop checks that one) is
replaced by ``PreTrainedTokenizerFast``, and refused in one line when that disagrees too.
"""
import pytest

from _tokenizers import load, tokenizer_path
from agentrl.templates import loading

#: ROUND_TRIP_PROBE under DeepSeek-V3's tokenizer.json (tokenizers.Tokenizer.from_file)
DEEPSEEK_IDS = [2107, 344, 223, 1069, 8490, 37, 201, 223, 9109, 14, 112752, 223, 66771]
QWEN3_IDS = [2132, 374, 220, 17, 20, 36286, 34, 198, 220, 5394, 11, 94880, 586, 60596, 109, 46553]


def _ids(tok):
    return tok(loading.ROUND_TRIP_PROBE, add_special_tokens=False)['input_ids']


def test_a_loaded_tokenizer_encodes_the_probe_as_its_file_does():
    tok = loading.load_tokenizer(str(tokenizer_path('deepseek-v3')))
    assert _ids(tok) == DEEPSEEK_IDS and tok.decode(DEEPSEEK_IDS) == 'It is 25 °C\n  ok, naïve 東京'
    assert _ids(loading.load_tokenizer(str(tokenizer_path('qwen3')))) == QWEN3_IDS


def test_a_tokenizer_that_disagrees_with_its_file_is_loaded_as_the_file_is():
    other = load('qwen3')                                   # stands for a class that rebuilt the pipeline
    path = str(tokenizer_path('deepseek-v3'))
    tok = loading.verified_tokenizer(other, path)
    assert type(tok).__name__ != type(other).__name__ and _ids(tok) == DEEPSEEK_IDS
    assert tok.decode(DEEPSEEK_IDS) == loading.ROUND_TRIP_PROBE


def test_a_tokenizer_no_load_gets_right_is_refused_in_one_line(monkeypatch):
    transformers = pytest.importorskip('transformers')
    other = load('qwen3')
    path = str(tokenizer_path('deepseek-v3'))
    monkeypatch.setattr(transformers.PreTrainedTokenizerFast, 'from_pretrained',
                        classmethod(lambda cls, *a, **k: other))
    with pytest.raises(ValueError) as e:
        loading.verified_tokenizer(other, path)
    assert str(e.value) == (
        f"TOKENIZER {path!r} does not encode text as its tokenizer.json does under transformers "
        f"{transformers.__version__} ({type(other).__name__} gives ids {QWEN3_IDS} and text "
        "'It is 25 °C\\n  ok, naïve 東京' for 'It is 25 °C\\n  ok, naïve 東京'); install another transformers version "
        '(pip install "transformers>=5.24") or fix tokenizer_class in tokenizer_config.json')
