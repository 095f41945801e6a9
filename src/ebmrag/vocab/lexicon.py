"""Drug and drug-class mentions from an offline lexicon: rules/drugs/lexicon.txt and rules/drugs/drug_terms.toml.

Tier rules that need to know whether a text names a drug ("hives and throat swelling after taking
cefuroxime") ask this lexicon rather than a regex: 27,000 names do not fit a readable pattern, and a
set lookup per word costs microseconds. General words and Chinese names are listed beside the names because a
chart says "after an antibiotic" or "头孢类" as often as it names the molecule; which drug a Chinese name
identifies (阿莫西林 -> amoxicillin) is the drug vocabulary's business (vocab/drugs.py), read from the same file.
A Chinese brand or preparation (希罗达, 速效救心丸) has no INN stem and no class word: rules/drugs/zh_drug_names.txt,
harvested from the drug spans of annotated Chinese corpora (bench/build_zh_drug_names.py), names it as a drug of
unknown ingredient. The files are declared with the rules loader (ebmrag.rules): `RuleBook.check()` reads them
at start-up.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.rules import FOLDER, RuleFile, rule_file
from ebmrag.vocab._files import versioned

LEXICON, TERMS, ZH_NAMES = "drugs/lexicon.txt", "drugs/drug_terms.toml", "drugs/zh_drug_names.txt"  # rules folder
TERMS_PATH = FOLDER / TERMS
_MEANINGS = ("ingredient", "class", "general")
_TOKEN = re.compile(r"[a-z][a-z-]+")


@dataclass(frozen=True)
class ChineseName:
    """What a Chinese name names: `kind` "ingredient" (an INN), "class" (a class id of the drug tables) or
    "general" (no drug of its own; `value` is its English meaning)."""

    kind: str
    value: str


@dataclass(frozen=True)
class Terms:
    """drug_terms.toml: the English general words and the Chinese names, in the file's order."""

    general: frozenset[str]
    chinese: Mapping[str, ChineseName]

    @property
    def chinese_general(self) -> frozenset[str]:
        return frozenset(name for name, meaning in self.chinese.items() if meaning.kind == "general")

    @classmethod
    def of(cls, file: RuleFile) -> Terms:
        """drug_terms.toml read and checked (the bundled file's through `terms()`, a test's or a site's through
        the drug vocabulary's `from_files`)."""
        raw, path = versioned(file, "drug terms"), file.path
        general = raw.get("general", {}).get("en") if isinstance(raw.get("general"), dict) else None
        if not isinstance(general, list) or not all(isinstance(w, str) and w.strip() for w in general):
            raise ConfigError(f"drug terms {path}: [general] en must be a list of words")
        table = raw.get("chinese")
        if not isinstance(table, dict):
            raise ConfigError(f"drug terms {path}: [chinese] must be a table of name = {{ kind = value }}")
        return cls(frozenset(general), {name: _meaning(name, means, path) for name, means in table.items()})


@rule_file(LEXICON)
def drug_names(lines: tuple[str, ...]) -> frozenset[str]:
    """The lexicon's names (lower case), once per book (default: the bundled one)."""
    return frozenset(lines)


@rule_file(TERMS, as_files=True)
def terms(file: RuleFile) -> Terms:
    """The general words and Chinese names, read and checked once per book (default: the bundled one)."""
    return Terms.of(file)


@rule_file(ZH_NAMES)
def zh_drug_names(lines: tuple[str, ...]) -> tuple[str, ...]:
    """The harvested Chinese drug names, longest first (a name inside a longer one is not a second drug)."""
    return tuple(sorted(dict.fromkeys(lines), key=len, reverse=True))


def _meaning(name: str, means: Any, path: Path) -> ChineseName:
    if not isinstance(means, dict) or len(means) != 1 or next(iter(means)) not in _MEANINGS \
            or not isinstance(value := next(iter(means.values())), str) or not value.strip():
        raise ConfigError(f"drug terms {path}: [chinese] {name!r} must be one of "
                          f"{{ ingredient = \"INN\" }}, {{ class = \"id\" }}, {{ general = \"meaning\" }}")
    return ChineseName(next(iter(means)), value)


def drug_mentions(text: str) -> list[str]:
    """The drug names and classes a text mentions, in order (Chinese by substring)."""
    lowered = text.lower()
    names, general = drug_names(), terms().general
    words = _TOKEN.findall(lowered)
    parts = [part for word in words if "-" in word for part in word.split("-")]  # "metoclopramide-induced"
    found = [w for w in words + parts if w in names or w in general]
    found += [f"{a} {b}" for a, b in itertools.pairwise(words) if f"{a} {b}" in general]
    chinese = [name for name in terms().chinese if name in text]
    return found + chinese + _harvested(text, chinese)


def _harvested(text: str, known: list[str]) -> list[str]:
    """The harvested Chinese names in `text`, longest first, each where no known or longer name was found."""
    if not any("\u4e00" <= c <= "\u9fff" for c in text):
        return []
    taken = {i for name in known for start in _starts(text, name) for i in range(start, start + len(name))}
    found = []
    for name in zh_drug_names():
        free = [s for s in _starts(text, name) if taken.isdisjoint(range(s, s + len(name)))]
        if free:
            found.append(name)
            taken.update(i for s in free for i in range(s, s + len(name)))
    return found


def chinese_drug_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of every Chinese drug name in `text` (a named ingredient or class of drug_terms.toml, or
    a harvested name), longest first and never inside a longer one: for readers that need where a drug stands
    (the ADR recogniser links it to a reaction), not only that it is named."""
    if not any("\u4e00" <= c <= "\u9fff" for c in text):
        return []
    general = terms().chinese_general
    names = sorted({*(n for n in terms().chinese if n not in general), *zh_drug_names()}, key=len, reverse=True)
    taken: set[int] = set()
    spans = []
    for name in names:
        for start in _starts(text, name):
            if taken.isdisjoint(range(start, start + len(name))):
                spans.append((start, start + len(name), name))
                taken.update(range(start, start + len(name)))
    return sorted(spans)


def _starts(text: str, name: str) -> list[int]:
    return [m.start() for m in re.finditer(re.escape(name), text)]
