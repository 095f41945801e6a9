"""How a chart's words are compared with the drug tables' names, whatever the language or the spelling.

A German chart writes "Penizillin", a French one "Pénicillines", a Polish one "amoksycylina", a Danish one
"penicilliner"; the tables hold the English INN "penicillin" and "amoxicillin". Typing every language's form
would never end, so each word is compared twice: by its folded form (accents and ligatures dropped, lower case:
exact names, brands and abbreviations match only so) and by a spelling key that reads the regular differences
of INN spellings across European languages as one: ph/f, th/t, ch/c, qu/c, k/c, z/c, y/i, x/ks/ss, doubled letters,
and the inflection at the end of a word ("-e", "-a", "-o", "-es", "-as", "-i", "-s"; a Germanic plural "-er",
"-en" when nothing else matched). Words shorter than six letters (PCN, ASA, sulfa) match only exactly, a key
must keep five letters, and an enzyme's "-ase" is no ending ("penicillinase"), so "pen", "cef" or "sulfo" never
names a drug.

The key is an index over the tables' own names; it never makes a new name up. Two names of different drugs
that share a key are refused when the tables are read (unless one is the class the other belongs to), so
penicillamine stays apart from penicillin and "sulfa" from "sulfate".
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

_WORD = re.compile(r"[^\W_]+")
_LETTERS = str.maketrans({"ø": "o", "æ": "ae", "œ": "oe", "ł": "l", "đ": "d", "ı": "i", "ð": "d", "þ": "th"})
_SPELLING = (("ks", "s"), ("x", "s"), ("ph", "f"), ("th", "t"), ("ch", "c"), ("qu", "c"), ("k", "c"),
             ("z", "c"), ("y", "i"))
_DOUBLED = re.compile(r"(.)\1+")
_ENDING = re.compile(r"[aeiouys]+$")
_GERMANIC_PLURAL = ("er", "en")
_ENZYME = ("ase", "ases", "asen", "asi", "asas")  # penicillinase is an enzyme, not a penicillin: no ending read
MIN_KEYED = 6  # letters a word needs before its spelling key is used
MIN_STEM = 5  # letters a key keeps
MAX_PHRASE = 6  # words in the longest name


def fold(text: str) -> str:
    """Lower case without accents or ligatures ("Pénicillines" -> "penicillines", "ß" -> "ss")."""
    decomposed = unicodedata.normalize("NFKD", text.replace("β", " beta ").replace("ß", "ss"))
    plain = "".join(c for c in decomposed if not unicodedata.combining(c))
    return plain.casefold().translate(_LETTERS)


def words(text: str) -> list[str]:
    """The folded words of a text; punctuation separates words ("amoxicillin/clavulanate", "Pen-VK")."""
    return _WORD.findall(fold(text))


def key(word: str) -> str:
    """The spelling key of one folded word, or the word itself when it is short or holds a digit."""
    if len(word) < MIN_KEYED or not word.isalpha():
        return word
    spelled = word
    for written, read in _SPELLING:
        spelled = spelled.replace(written, read)
    spelled = _DOUBLED.sub(r"\1", spelled)
    stem = spelled if word.endswith(_ENZYME) else _ENDING.sub("", spelled)
    return stem if len(stem) >= MIN_STEM else word


def fallback_key(word: str) -> str:
    """The key of a word read as a Germanic plural ("penicilliner", "makroliden"), or "" when it is none."""
    if len(word) >= MIN_KEYED + 2 and word.isalpha() and word.endswith(_GERMANIC_PLURAL):
        return key(word[:-2])
    return ""


def acid_forms(inn: str) -> list[str]:
    """The other names of an acid INN ("clavulanic acid"): its anion ("clavulanate"), the Romance word order
    ("acide clavulanique", "ácido clavulánico": the key reads both words) and the Germanic compounds
    ("Clavulansäure", "Mefenaminsäure", "clavulaanzuur", "clavulansyre")."""
    parts = inn.split()
    if len(parts) != 2 or parts[1] != "acid" or not parts[0].endswith("ic") or len(parts[0]) < MIN_KEYED:
        return []
    stem = parts[0][:-2]
    romance = [f"{acid} {parts[0]}" for acid in ("acid", "acide", "acido")]
    germanic = [f"{stem}{link}{word}" for link in ("", "in") for word in ("saure", "zuur", "syre", "syra")]
    return [*romance, f"{stem}ate", *germanic]


@dataclass(frozen=True)
class Found:
    """A name found in a text: what it names (the table's own value) and the words it covered."""

    value: tuple[str, str]  # (kind, value) as the tables registered it
    words: tuple[str, ...]


@dataclass
class PhraseIndex:
    """Names of one to MAX_PHRASE words, looked up by folded words first and by spelling keys second; at each
    word the longest name wins, and names never overlap."""

    exact: dict[tuple[str, ...], tuple[str, str]] = field(default_factory=dict)
    keyed: dict[tuple[str, ...], tuple[str, str]] = field(default_factory=dict)
    clashes: list[tuple[str, tuple[str, str], tuple[str, str]]] = field(default_factory=list)

    def add(self, phrase: tuple[str, ...], value: tuple[str, str], *, keyed: bool,
            prefer: Callable[[tuple[str, str], tuple[str, str]], tuple[str, str] | None]) -> None:
        """Register a name; `prefer(old, new)` settles two values for one spelling key (None: a clash)."""
        self.exact.setdefault(phrase, value)
        if not keyed:
            return
        spelled = tuple(key(w) for w in phrase)
        known = self.keyed.get(spelled)
        if known is None or known == value:
            self.keyed[spelled] = value
            return
        chosen = prefer(known, value)
        if chosen is None:
            self.clashes.append((" ".join(phrase), known, value))
        else:
            self.keyed[spelled] = chosen

    def find(self, text: str) -> Iterator[Found]:
        """The names of a text, left to right."""
        folded = words(text)
        keys = [key(w) for w in folded]
        at = 0
        while at < len(folded):
            hit = self._at(folded, keys, at)
            if hit is None:
                at += 1
                continue
            yield hit
            at += len(hit.words)

    def _at(self, folded: list[str], keys: list[str], at: int) -> Found | None:
        for size in range(min(MAX_PHRASE, len(folded) - at), 0, -1):
            span = slice(at, at + size)
            value = self.exact.get(tuple(folded[span])) or self.keyed.get(tuple(keys[span]))
            if value is None and size == 1 and (plural := fallback_key(folded[at])):
                value = self.keyed.get((plural,))
            if value is not None:
                return Found(value, tuple(folded[span]))
        return None
