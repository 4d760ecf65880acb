"""DeepSeek-V3's tokenizer under the interop venv's transformers (5.10: ``AutoTokenizer`` gives a Metaspace
``LlamaTokenizer`` that drops spaces, newlines and non-ASCII): ``load_tokenizer`` still gives the ids of its
tokenizer.json, and text round-trips."""
import pytest

pytest.importorskip('transformers')

from _tokenizers import tokenizer_path  # noqa: E402
from agentrl.templates import load_tokenizer  # noqa: E402

TEXT = 'It is 25 °C\n  ok, naïve 東京'


def test_deepseek_v3_loads_with_the_ids_of_its_tokenizer_json():
    tok = load_tokenizer(str(tokenizer_path('deepseek-v3')))
    ids = tok(TEXT, add_special_tokens=False)['input_ids']
    assert ids == [2107, 344, 223, 1069, 8490, 37, 201, 223, 9109, 14, 112752, 223, 66771]
    assert tok.decode(ids) == TEXT
