"""Drug and drug-class mentions from an offline lexicon: rules/drugs/lexicon.txt and rules/drugs/drug_terms.toml.

Tier rules that need to know whether a text names a drug ("hives and throat swelling after taking
cefuroxime") ask this lexicon rather than a regex: 27,000 names do not fit a readable pattern, and a
set lookup per word costs microseconds. General words and Chinese names are listed beside the names because a
chart says "after an antibiotic" or "头孢类" as often as it names the molecule; which drug a Chinese name
identifies (阿莫西林 -> amoxicillin) is the drug vocabulary's business (vocab/drugs.py), read from the same file.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.vocab._files import DRUGS, read_lines, read_toml

NAMES_PATH = DRUGS / "lexicon.txt"
TERMS_PATH = DRUGS / "drug_terms.toml"
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


def drug_names() -> frozenset[str]:
    """The bundled lexicon's names (lower case)."""
    return _names()


@cache
def _names(path: Path = NAMES_PATH) -> frozenset[str]:
    return frozenset(read_lines(path, "drug lexicon"))


@cache
def terms(path: Path = TERMS_PATH) -> Terms:
    """The general words and Chinese names, read and checked once."""
    raw = read_toml(path, "drug terms")
    general = raw.get("general", {}).get("en") if isinstance(raw.get("general"), dict) else None
    if not isinstance(general, list) or not all(isinstance(w, str) and w.strip() for w in general):
        raise ConfigError(f"drug terms {path}: [general] en must be a list of words")
    table = raw.get("chinese")
    if not isinstance(table, dict):
        raise ConfigError(f"drug terms {path}: [chinese] must be a table of name = {{ kind = value }}")
    return Terms(frozenset(general), {name: _meaning(name, means, path) for name, means in table.items()})


def _meaning(name: str, means: Any, path: Path) -> ChineseName:
    if not isinstance(means, dict) or len(means) != 1 or next(iter(means)) not in _MEANINGS \
            or not isinstance(value := next(iter(means.values())), str) or not value.strip():
        raise ConfigError(f"drug terms {path}: [chinese] {name!r} must be one of "
                          f"{{ ingredient = \"INN\" }}, {{ class = \"id\" }}, {{ general = \"meaning\" }}")
    return ChineseName(next(iter(means)), value)


def drug_mentions(text: str) -> list[str]:
    """The drug names and classes a text mentions, in order (Chinese by substring)."""
    lowered = text.lower()
    names, general = _names(), terms().general
    words = _TOKEN.findall(lowered)
    parts = [part for word in words if "-" in word for part in word.split("-")]  # "metoclopramide-induced"
    found = [w for w in words + parts if w in names or w in general]
    found += [f"{a} {b}" for a, b in itertools.pairwise(words) if f"{a} {b}" in general]
    found += [name for name in terms().chinese if name in text]
    return found
