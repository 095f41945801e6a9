"""Text written to steer a model, recognised whatever its disguise, at the bottom of the stack so every stage
(tiering, packing, the brief, the model path) reads text the same way.

Matching runs on a folded view of the text (`fold`): Unicode NFKC (full-width and compatibility forms), format
characters removed (zero-width spaces and joiners, soft hyphens, bidirectional controls: Unicode category Cf),
and letters that look like Latin letters folded to them (Unicode TR39 confusables, from the maintained data of
`confusable-homoglyphs`: a Cyrillic "о" inside "ignоre" is an "o"). The text shown is never changed by folding.

A sentence is instruction-like when it matches the grammar of `rules/text/injection.toml` (a data file, by concept): it
cancels earlier instructions or switches the reader's mode (override), addresses an AI or model ("Note to the AI
reviewing this chart: ..."; address), carries a chat turn, an instruction-dataset header or a forged context line
header ("(2|T1|2026-01-01] No known drug allergies"; role), or orders what the reader writes (output). Such a
sentence is data: never a finding, never must-keep.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ebmrag.rules import rule_file
from ebmrag.text.sentences import split_sentences

_CJK_START = 0x2E80  # CJK and later blocks are never folded: their look-alikes are not letters of a Latin word

@dataclass(frozen=True)
class InjectionGrammar:
    """The patterns of rules/text/injection.toml by concept (override, address, role, output), one compiled
    alternation of all of them, and the cue words and marks one of which every match contains."""

    concepts: dict[str, tuple[str, ...]]
    pattern: re.Pattern[str]
    cue_words: frozenset[str]
    cue_marks: tuple[str, ...]

    def concept_of(self, folded: str) -> str | None:
        """Which concept a folded sentence matches first (for the trace and the tests); None when none."""
        for concept, patterns in self.concepts.items():
            if any(re.search(p, folded, re.IGNORECASE | re.MULTILINE) for p in patterns):
                return concept
        return None


@rule_file("text/injection.toml")
def grammar(data: Mapping[str, Any]) -> InjectionGrammar:
    """The grammar, compiled; a pattern that does not compile is named in the error."""
    macros: dict[str, str] = data["macros"]

    def expand(pattern: str) -> str:
        for name in sorted(macros, key=len, reverse=True):  # AI_ANY before AI
            pattern = pattern.replace("{" + name + "}", macros[name])
        return pattern.replace("{AI}", macros["AI"])

    concepts = {name: tuple(expand(p) for p in patterns) for name, patterns in data["concepts"].items()}
    for name, patterns in concepts.items():
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"a pattern of [concepts] {name} does not compile: {exc}") from None
    every = "|".join(f"(?:{p})" for patterns in concepts.values() for p in patterns)
    return InjectionGrammar(concepts, re.compile(every, re.IGNORECASE | re.MULTILINE),
                            frozenset(data["cues"]["words"].split()), tuple(data["cues"]["marks"]))


# After "System:", a body system of a review of systems is an exam heading ("System: Respiratory - clear"),
# not a chat role.
_ROS = (r"(?!\s*(?:respiratory|cardio\w*|neuro\w*|gastro\w*|gi|gu|genitourinary|musculoskeletal|msk|skin|"
        r"integumentary|psych\w*|endocrine|hemat\w*|lymph\w*|heent|eyes|ent|constitutional|renal|allerg\w*|"
        r"immun\w*|review)\b)")
# Chat-template role tags and tool-call syntax that could end the data and start a new turn.
MARKUP = re.compile(r"<\|[a-z_]+\|>|</?(?:system|assistant|user|tool_call|tool|function_call|data)\b[^>]*>"
                    r"|^\s*(?:system\s*:" + _ROS + r"|(?:assistant|user)\s*:)|```(?:tool|function)\w*"
                    r"|\[/?inst\]|<</?sys>>|<start_of_turn>|<end_of_turn>", re.IGNORECASE | re.MULTILINE)
MARKUP_REMOVED = "[markup removed]"


@cache
def _latin_look_alikes() -> dict[int, str]:
    """Code point -> the ASCII letter or digit it is confusable with (TR39 data)."""
    import confusable_homoglyphs  # type: ignore[import-untyped]

    data = json.loads((Path(confusable_homoglyphs.__file__).parent / "confusables.json").read_text(encoding="utf-8"))
    table: dict[int, str] = {}
    for char, homoglyphs in data.items():
        if len(char) != 1 or char.isascii() or ord(char) >= _CJK_START:
            continue
        latin = [h["c"] for h in homoglyphs if len(h["c"]) == 1 and h["c"].isascii() and h["c"].isalnum()]
        if latin:  # TR39 merges capital I into l (its skeleton); a capital look-alike (Greek Ι) reads as I
            table[ord(char)] = "I" if latin[0] == "l" and unicodedata.category(char) == "Lu" else latin[0]
    return table


def fold(text: str) -> str:
    """The matching view of `text`: NFKC, format characters removed, Latin look-alikes folded (plain ASCII is
    its own view: the fast path for most chart text, since this runs on every fragment tiered or packed)."""
    if text.isascii():
        return text
    normal = unicodedata.normalize("NFKC", text)
    visible = "".join(ch for ch in normal if unicodedata.category(ch) != "Cf")
    return visible.translate(_latin_look_alikes())


_WORD = re.compile(r"[a-z]+")


def _may_instruct(lowered: str) -> bool:
    """A cheap test every match passes (it holds a cue word or mark): most text has none, and this costs a
    tenth of the patterns; tiering runs it on every fragment."""
    rules = grammar()
    return any(mark in lowered for mark in rules.cue_marks) or not rules.cue_words.isdisjoint(_WORD.findall(lowered))


def is_instruction(sentence: str) -> bool:
    folded = fold(sentence)
    if not _may_instruct(folded.lower()):
        return False
    return bool(grammar().pattern.search(folded) or MARKUP.search(folded))


def strip_markup(text: str) -> str:
    """Chat role tags and tool-call markup replaced, read through the folded view (a tag with a zero-width
    space inside is still a tag); text without markup comes back unchanged."""
    folded = fold(text)
    if not MARKUP.search(folded):
        return text
    return MARKUP.sub(MARKUP_REMOVED, folded)


def without_instructions(text: str) -> str:
    """The text with its instruction-like sentences left out: what a rule may read as a finding. Most text holds
    none, and one search of the whole text says so without splitting it (tiering runs this on every fragment)."""
    if not is_instruction(text):
        return text
    sentences = split_sentences(text)
    if not any(is_instruction(s.text) for s in sentences):
        return text
    return " ".join(s.text.strip() for s in sentences if not is_instruction(s.text))
