"""Text -> BM25 terms: lower case, English stop words out, Snowball stems; Chinese runs segmented by jieba.

Numbers stay terms ("2.8", "hba1c") because lab values and doses are what clinicians search for.
jieba is imported only when a text contains Chinese, so English-only knowledge bases never pay
for its dictionary load.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from ebmrag.errors import require_extra

_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_TERM = re.compile(r"[^\W_]+(?:[.\-][^\W_]+)*")
STOP_WORDS = frozenset(
    "a about above after again against all am an and any are as at be because been before being below between both "
    "but by can could did do does doing down during each few for from further had has have having he her here hers "
    "him his how i if in into is it its itself just me more most my no nor not of off on once only or other our out "
    "over own same she should so some such than that the their them then there these they this those through to too "
    "under until up very was we were what when where which while who whom why will with would you your yours "
    "also may might must shall (are) etc".split()
)


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    stemmer = require_extra("Stemmer", "kb", "the knowledge base's English analyzer")  # PyStemmer
    return stemmer.Stemmer("english")


@lru_cache(maxsize=1)
def _jieba() -> Any:
    import logging

    jieba = require_extra("jieba", "kb", "the knowledge base's Chinese analyzer")

    jieba.setLogLevel(logging.WARNING)
    return jieba


class Analyzer:
    """Deterministic, picklable-by-config term analysis shared by indexing and querying."""

    def __init__(self, stem: bool = True, stop_words: bool = True) -> None:
        self.stem = stem
        self.stop_words = stop_words

    def terms(self, text: str) -> list[str]:
        text = text.lower()
        out: list[str] = []
        position = 0
        for match in _CJK.finditer(text):
            out.extend(self._latin(text[position:match.start()]))
            out.extend(w for w in _jieba().cut_for_search(match.group()) if w.strip())
            position = match.end()
        out.extend(self._latin(text[position:]))
        return out

    def terms_many(self, texts: Iterable[str]) -> list[list[str]]:
        return [self.terms(t) for t in texts]

    def _latin(self, text: str) -> list[str]:
        words = [w for w in _TERM.findall(text) if not (self.stop_words and w in STOP_WORDS)]
        return list(_stemmer().stemWords(words)) if self.stem and words else words

    def to_dict(self) -> dict[str, Any]:
        return {"stem": self.stem, "stop_words": self.stop_words}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Analyzer:
        return cls(**data)
