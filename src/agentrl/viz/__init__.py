"""L4: ownership pictures of trajectories (book Figures 5.1 and 5.2) and the run report.

One model, three views: :func:`build_strip` turns a record into cells (token text, owner, turn,
stored mask and log-prob, highlights) and segments (runs of one owner, folded when long); then

- :func:`to_html`: interactive, self-contained HTML (hover tooltips, collapsible folds);
- :func:`to_svg`: a static, deterministic figure for papers;
- :func:`print_strip` / :func:`term_lines`: coloured tokens in a terminal with ``rich``;
- :func:`report_html`: the per-policy run report with charts and the first episode's strip.

Example::

    import agentrl as arl
    from agentrl import viz
    strip = viz.build_strip(traj)              # text from the word tokenizer / HF tokenizer / ids
    open('ep.svg', 'w').write(viz.to_svg(strip))
"""
from .html import page, strip_fragment, to_html
from .report import group_by_policy, report_html
from .strip import (DEFAULT_FOLD, FOLDABLE, Cell, Segment, Strip, build_strip, decoder_for, display_text,
                    hf_decoder, id_decoder, load_audit, word_decoder)
from .svg import to_svg
from .term import print_strip, term_lines

__all__ = ['Cell', 'Segment', 'Strip', 'DEFAULT_FOLD', 'FOLDABLE', 'build_strip', 'decoder_for', 'display_text',
           'hf_decoder', 'id_decoder', 'word_decoder', 'load_audit', 'to_html', 'strip_fragment', 'page', 'to_svg',
           'term_lines', 'print_strip', 'report_html', 'group_by_policy']
