"""L3: rules over the records of one file together, and what a check could not check.

- :class:`OneTokenizerPerFile`: a file's records share one tokenizer fingerprint. The same id is
  another token in another vocabulary, so a file mixing two is refused (``TokenizerMismatchError``),
  naming the first row of each; export refuses the same mix in one batch
  (:func:`agentrl.interop.common.check_exportable`).
- :func:`unchecked_notes`: what an importer said it could not check for a record
  (``info['import']['unchecked']``, e.g. template ownership without ``--tokenizer``); ``agentrl check``
  counts and prints them (docs/interop.md#template-ownership).
"""
from __future__ import annotations

from .errors import TokenizerMismatchError

__all__ = ['OneTokenizerPerFile', 'unchecked_notes']


class OneTokenizerPerFile:
    """Remember each file's first tokenizer fingerprint; refuse a record of another one in the same file.

    Records without a fingerprint (``provenance.tokenizer`` empty or no provenance) are not compared.
    """

    def __init__(self):
        self._first: dict = {}          # file -> (row, fingerprint)

    def see(self, record, file: str, row: int, problems: list = ()) -> list:
        """``[TokenizerMismatchError]`` when ``record`` (row ``row`` of ``file``) names another tokenizer
        than the first record of ``file`` that names one, else ``[]`` (also when ``problems``, the
        record's refusals so far, already hold a ``TokenizerMismatchError``: one per record)."""
        prov = getattr(record, 'provenance', None)
        fp = prov.tokenizer if prov is not None else ''
        if not fp:
            return []
        first = self._first.setdefault(file, (row, fp))
        if first[1] == fp or any(isinstance(p, TokenizerMismatchError) for p in problems):
            return []
        return [TokenizerMismatchError(
            f'is {fp!r}, but row {first[0]} of the same file was tokenized by {first[1]!r}; one file holds one '
            "tokenizer's ids (the same id is another token in the other vocabulary)", field='provenance.tokenizer',
            fix='write the records of each tokenizer to their own file')]


def unchecked_notes(record) -> list[str]:
    """The importer's ``info['import']['unchecked']`` notes of ``record`` (strings; empty when none)."""
    info = getattr(record, 'info', None)
    imp = info.get('import') if isinstance(info, dict) else None
    notes = imp.get('unchecked') if isinstance(imp, dict) else None
    return [str(n) for n in notes] if isinstance(notes, list) else []
