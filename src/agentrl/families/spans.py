"""L2: token spans of character spans in a decoded reply (ids and text from the same decode).

A byte-level token may hold part of a character, and a character's bytes may spread over tokens,
so a span is found by decoding prefixes: the first token of ``[a, b)`` is the last ``k`` whose
prefix ends at or before ``a``, its end the first ``k`` whose prefix reaches ``b``.
"""
from __future__ import annotations

__all__ = ['TokenSpans']


class TokenSpans:
    """Where a character of a decoded reply falls in its ids, by bisection over decoded prefixes.

    Args:
        template: has ``decode``. ids: ``[n]`` the reply's ids. text: ``decode(ids)``.

    Each lookup costs ``O(log n)`` decodes of a prefix (cached); a prefix that ends inside a
    character counts only the characters it decodes completely.
    """

    def __init__(self, template, ids: list, text: str):
        self.template, self.ids, self.text, self._len = template, ids, text, {0: 0, len(ids): len(text)}

    def length(self, k: int) -> int:
        """Characters of ``text`` that ``decode(ids[:k])`` holds completely."""
        if k not in self._len:
            part = self.template.decode(self.ids[:k])
            n = 0
            for a, b in zip(part, self.text):      # the longest common prefix ('\ufffd' of a cut character)
                if a != b:
                    break
                n += 1
            self._len[k] = n
        return self._len[k]

    def first_token(self, c: int) -> int:
        """The largest ``k`` whose prefix ends at or before char ``c`` (the token holding char ``c``)."""
        lo, hi = 0, len(self.ids)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.length(mid) <= c:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def last_token(self, c: int) -> int:
        """The smallest ``k`` whose prefix reaches char ``c``."""
        lo, hi = 0, len(self.ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.length(mid) >= c:
                hi = mid
            else:
                lo = mid + 1
        return lo
