"""Rebuild ``docs/img/show-html.png``: the Qwen3 rendering of the book's two-turn clamp episode.

Usage (needs the ``hf`` extra, the shared Qwen3 tokenizer and headless Chromium)::

    AGENTRL_TOKENIZERS=../shared/tokenizers PYTHONPATH=src:tests .venv/bin/python docs/make_show_html.py

The record is labelled by :func:`agentrl.templates.label_owners` (hand-authored turns, log-probs
0), drawn by ``agentrl show``'s HTML writer, the first policy cell hovered, and the page captured
by the same headless browser the viz tests use. Pictures name the tokenizer by its folder name and
fingerprint, never by a local path.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from transformers import AutoTokenizer

    from agentrl import gym, viz
    from agentrl.cli.template import chapter_messages
    from agentrl.record import OWNER, Provenance, Trajectory
    from agentrl.templates import label_owners
    from test_viz import Browser, find_chromium
    folder = Path(os.environ.get('AGENTRL_TOKENIZERS', ROOT.parent / 'shared' / 'tokenizers')) / 'qwen3'
    tok = AutoTokenizer.from_pretrained(str(folder))
    messages = chapter_messages()
    lab = label_owners(tok, messages, tools=gym.TOOL_SCHEMAS)
    ids, owner = lab.ids, lab.owner
    turn, k, prev = [], -1, OWNER['prompt']
    for o in list(owner):
        if o == OWNER['policy'] and prev != OWNER['policy']:
            k += 1
        turn.append(k)
        prev = o
    t = Trajectory.from_tokens(ids, owner, turn, [0.0] * len(ids), 0.0, {'task': 'clamp (Qwen3 rendering)'},
                               Provenance(policy='hand-authored', model='Qwen/Qwen3-0.6B', logp_placeholder=True))
    strip = viz.build_strip(t, viz.decoder_for(t, tok))
    html = viz.to_html(strip, heading='Qwen3-0.6B rendering of the two-turn clamp episode (Figure 5.1)')
    with tempfile.TemporaryDirectory() as d:
        page_path = Path(d) / 'show.html'
        page_path.write_text(html)
        b = Browser(find_chromium())
        try:
            page = b.open(page_path)
            x, y = page.eval("(function(){var c=document.querySelectorAll('.strip .tok.o-policy');"
                             "var r=c[Math.min(12, c.length-1)].getBoundingClientRect();return [r.left+4, r.top+4];})()")
            page.mouse(x, y)
            page.screenshot(ROOT / 'docs' / 'img' / 'show-html.png', width=1280)
        finally:
            b.close()
    print('wrote docs/img/show-html.png;', strip.decoded if hasattr(strip, 'decoded') else '')


if __name__ == '__main__':
    sys.path.insert(0, str(ROOT / 'tests'))
    torch.set_num_threads(1)
    main()
