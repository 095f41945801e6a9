"""The focus of a long consumer question: which condition, drug or test it names, and what it asks about it.

Consumer messages are long and noisy ("Re: NDC# ... I have celiac disease & need to know if these contain
gluten"); the words that decide retrieval are few. The focus is found without a model: every document title in
the knowledge base is a phrase, and the longest titles the question contains (word for word, case-folded,
not inside a longer match) are its focus. A small lexicon of question-type cues (treatment, causes, symptoms,
tests, ...) adds the section words the knowledge base heads its chunks with ("Sciatica — treatment"). The focus
query is searched beside the full question and the two fused (`HybridRetriever(focus_weight=...)`); a question
that names no title gets no focus query and ranks as before. Ablation in docs/results/retrieval.md.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from difflib import get_close_matches

_WORD = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")
MAX_TITLE_WORDS = 8
GENERIC_MIN_ROWS = 50
FUZZY_MIN_CHARS = 7  # shorter words are too often another real word one edit away

# cue pattern -> the section words added to the focus query; one question may ask several things. Cues are words
# that ask, not words a consumer uses to tell their story ("pain", "my family" are not questions about symptoms).
QUESTION_TYPES: tuple[tuple[str, str], ...] = (
    (r"\b(treat\w*|cur(e|ed|es|ing)|therap\w*|medication\w*|surgery|remed\w*|manage\w*|get rid)\b", "treatment"),
    (r"\b(cause[sd]?|why|reasons?)\b", "causes"),
    (r"\b(symptoms?|signs?)\b", "symptoms"),
    (r"\b(tests?|testing|diagnos\w*|exams?)\b", "exams and tests"),
    (r"\b(inherit\w*|hereditary|genetic\w*|run in (the )?famil\w*)\b", "inheritance genetic changes"),
    (r"\b(prevent\w*|avoid\w*|precautions?)\b", "prevention"),
    (r"\b(outlook|prognosis|life expectancy|surviv\w*|go away|permanent)\b", "outlook"),
    (r"\b(how common|how many people|frequen\w*)\b", "frequency"),
    (r"\b(what is|what are|information|explain\w*)\b", "information"),
    (r"\b(side effects?|interact\w*|dose|dosage|ingredients?|contain\w*)\b", "considerations"),
)
_TYPE_PATTERNS = tuple((re.compile(pattern), words) for pattern, words in QUESTION_TYPES)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Focus:
    titles: tuple[str, ...]
    question_types: tuple[str, ...]

    @property
    def query(self) -> str:
        """Empty when no title was found: a focus without its subject would only add noise."""
        return " ".join((*self.titles, *self.question_types)) if self.titles else ""


class FocusExtractor:
    """Longest title phrases contained in a question, plus its question-type words.

    A title whose rarest word appears in more than `max_share` of the knowledge base's `rows` chunks ("Blood",
    "Pain") names a topic, not a focus, and is skipped (`term_share` measures it; without it every title counts;
    in a small knowledge base, a word in fewer than `GENERIC_MIN_ROWS` chunks is never generic). Question
    words that are no title word but are one or two edits from a rare one ("antiphosoholipid") are read as that
    word: consumers misspell exactly the long names that decide retrieval. Built once per generation.
    """

    def __init__(self, titles: Iterable[str], term_share: Callable[[str], float] | None = None, rows: int = 0,
                 max_share: float = 0.01, max_titles: int = 3, min_chars: int = 4) -> None:
        if max_titles < 1:
            raise ValueError(f"max_titles must be >= 1, got {max_titles}")
        if not 0 < max_share <= 1:
            raise ValueError(f"max_share must be in (0, 1], got {max_share}")
        counts = Counter(tuple(words(t)) for t in titles if t.strip())
        self.max_titles = max_titles
        generic = max(max_share, GENERIC_MIN_ROWS / rows) if rows else max_share
        self._phrases = {phrase: " ".join(phrase) for phrase in counts
                         if 0 < len(phrase) <= MAX_TITLE_WORDS and len(" ".join(phrase)) >= min_chars
                         and (term_share is None or term_share(" ".join(phrase)) <= generic)}
        self._known = {w for phrase in self._phrases for w in phrase}
        self._by_prefix: dict[str, list[str]] = {}
        for word in (w for w in self._known if len(w) >= FUZZY_MIN_CHARS):
            self._by_prefix.setdefault(word[:2], []).append(word)

    def __len__(self) -> int:
        return len(self._phrases)

    def _spelled(self, token: str) -> str:
        if len(token) < FUZZY_MIN_CHARS or token in self._known:
            return token
        close = get_close_matches(token, self._by_prefix.get(token[:2], []), n=1, cutoff=0.85)
        return close[0] if close else token

    def extract(self, question: str) -> Focus:
        tokens = [self._spelled(t) for t in words(question)]
        spans = [(start, start + n) for n in range(MAX_TITLE_WORDS, 0, -1) for start in range(len(tokens) - n + 1)
                 if tuple(tokens[start:start + n]) in self._phrases]
        kept: list[tuple[int, int]] = []
        for start, end in spans:  # longest first: a shorter title inside a kept one is part of it, not a focus
            if not any(s <= start and end <= e for s, e in kept):
                kept.append((start, end))
        titles = list(dict.fromkeys(self._phrases[tuple(tokens[s:e])] for s, e in sorted(kept)))[: self.max_titles]
        lowered = " ".join(words(question))
        types = tuple(dict.fromkeys(w for pattern, w in _TYPE_PATTERNS if pattern.search(lowered)))
        return Focus(tuple(titles), types)
