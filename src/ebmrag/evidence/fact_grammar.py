"""The grammar of fact states (rules/evidence/facts.toml), compiled once, and the few text helpers its readers
share (evidence.facts, evidence.pathology_roles).

The file says which tier rule states which kind of fact and how an allergy and a pathology report name their roles;
the drug, reaction, result, gene and negation vocabularies stay with their own readers. English patterns match at
word boundaries and any case, Chinese ones anywhere, as in the other rule files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ebmrag.rules import RuleFile, rule_file
from ebmrag.vocab._files import versioned

FACTS = "evidence/facts.toml"  # in the rules folder
KINDS = ("allergy", "adr", "pathology", "genetic", "result")
PATHOLOGY_ROLES = ("grade", "stage", "margins", "biomarker")
CJK = re.compile(r"[\u4e00-\u9fff]")
SENTENCE = re.compile(r"[.](?!\d)|[;!?。；！？\n]")  # a decimal point has a digit after it
CLAUSE = re.compile(r"[.,](?!\d)|[;:!?。；！？，：\n]|\s(?:but|however|although)\s")
Span = tuple[int, int]


@dataclass(frozen=True)
class FactGrammar:
    """facts.toml compiled: [kinds] per kind, the allergy grammar, the pathology grammar (module docstring)."""

    kinds: tuple[tuple[str, re.Pattern[str]], ...]
    entries: re.Pattern[str]
    after: re.Pattern[str]
    before: re.Pattern[str]
    between: re.Pattern[str]
    categories: frozenset[str]
    function_words: frozenset[str]
    lead: re.Pattern[str]  # Chinese lead words at the start of a run
    severity: re.Pattern[str]
    not_reactions: frozenset[str]
    examinations: re.Pattern[str]
    procedures: re.Pattern[str]
    conclusion: re.Pattern[str]
    verbs: re.Pattern[str]
    fields: re.Pattern[str]
    heads: re.Pattern[str]
    not_heads: frozenset[str]
    stops: frozenset[str]
    chinese_stops: re.Pattern[str]
    not_yet: re.Pattern[str]
    max_words: int
    max_chinese: int
    roles: tuple[tuple[str, re.Pattern[str]], ...]  # PATHOLOGY_ROLES, in that order


def alternation(items: Iterable[str]) -> str:
    """One alternation, longest first: English patterns at word boundaries, Chinese ones anywhere."""
    ordered = sorted(set(items), key=len, reverse=True)
    english = "|".join(i for i in ordered if i.isascii())
    chinese = "|".join(f"(?:{i})" for i in ordered if not i.isascii())
    parts = ([rf"(?<![\w-])(?:{english})(?!\w)"] if english else []) + ([chinese] if chinese else [])
    return "|".join(parts) or "(?!)"


def _compiled(items: Iterable[str]) -> re.Pattern[str]:
    return re.compile(alternation(items), re.IGNORECASE)


@rule_file(FACTS, as_files=True)
def grammar(file: RuleFile) -> FactGrammar:
    """rules/evidence/facts.toml, compiled once per book (default: the bundled one)."""
    raw = versioned(file, "fact grammar")
    kinds, allergy, pathology = raw["kinds"], raw["allergy"], raw["pathology"]
    marker = f"(?:{pathology['marker']})"
    return FactGrammar(
        kinds=tuple((k, re.compile("|".join(kinds[k]))) for k in KINDS),
        entries=re.compile("|".join(kinds["entries"])),
        after=_compiled(allergy["after"]),
        before=_compiled(allergy["before"]),
        between=re.compile("|".join(allergy["chinese_between"])),
        categories=frozenset(allergy["categories"]),
        function_words=frozenset(allergy["function_words"]),
        lead=re.compile(f"(?:{'|'.join(allergy['chinese_lead'])})+"),
        severity=_compiled(allergy["severity"]),
        not_reactions=frozenset(allergy["not_reactions"]),
        examinations=_compiled(pathology["examinations"]),
        procedures=_compiled([*pathology["procedures"], *pathology["chinese_procedures"]]),
        conclusion=_compiled(pathology["conclusion"]),
        verbs=_compiled(pathology["finding_verbs"]),
        fields=_compiled(pathology["finding_fields"]),
        heads=_compiled([*pathology["heads"], *pathology["chinese_heads"]]),
        not_heads=frozenset(pathology["not_heads"]),
        stops=frozenset(pathology["modifier_stops"]),
        chinese_stops=re.compile("|".join(sorted(pathology["chinese_stops"], key=len, reverse=True))),
        not_yet=_compiled(pathology["not_yet"]),
        max_words=int(pathology["max_diagnosis_words"]),
        max_chinese=int(pathology["max_chinese_diagnosis"]),
        roles=tuple((role, _compiled(p.replace("MARKER", marker) for p in pathology[key])) for role, key in zip(
            PATHOLOGY_ROLES, ("grade", "stage", "margins", "biomarkers"), strict=True)),
    )


def overlap(a: Span, b: Span) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def sentence(text: str, at: int) -> Span:
    """The sentence holding position `at`."""
    start = max((m.end() for m in SENTENCE.finditer(text, 0, at)), default=0)
    stop = SENTENCE.search(text, at)
    return start, stop.start() if stop else len(text)


def clause_end(text: str, at: int) -> int:
    stop = CLAUSE.search(text, at)
    return stop.start() if stop else len(text)


def unique(spans: Sequence[Span]) -> list[Span]:
    """The spans in order, each overlapping none kept before it (the longest at a start first)."""
    kept: list[Span] = []
    for span in sorted(spans, key=lambda s: (s[0], -s[1])):
        if not any(overlap(span, k) for k in kept):
            kept.append(span)
    return kept
