"""A hub id while the Hugging Face hub is unreachable: the local cache only, refused at once."""
import socket

import pytest

pytest.importorskip('transformers')

from agentrl.templates import loading  # noqa: E402


def test_a_bare_name_offline_is_refused_at_once_without_the_hub_retries(monkeypatch, tmp_path):
    monkeypatch.setattr(loading, '_HUB_REACHABLE', {'ok': False})
    monkeypatch.setenv('HF_HOME', str(tmp_path / 'hf'))          # an empty local cache
    dialled = []
    monkeypatch.setattr(socket.socket, 'connect', lambda self, addr: dialled.append(addr) or (_ for _ in ()).throw(
        OSError('no network in this test')))
    with pytest.raises(ValueError, match=r"^TOKENIZER 'mdoel-typo' is not a folder here nor in the local Hugging Face "
                                         r"cache, and huggingface.co did not answer within 1.5 s, so it was not "
                                         r"downloaded: pass a folder with tokenizer.json, or run where the hub is "
                                         r"reachable$"):
        loading.load_tokenizer('mdoel-typo')
    assert dialled == []                    # nothing was dialled: before, the hub's retries took 48-64 s offline


def test_a_local_folder_is_loaded_offline_as_before(monkeypatch):
    from _tokenizers import tokenizer_path
    monkeypatch.setattr(loading, '_HUB_REACHABLE', {'ok': False})
    path = str(tokenizer_path('tiny'))
    tok = loading.load_tokenizer(path)
    assert tok.name_or_path == path and len(tok) > 0
