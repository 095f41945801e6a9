"""Clinical entity extraction and the entity-preserving compressed state B of T1/T2 fragments.

State B keeps the clauses that carry key entities (values with units, test names, named findings,
drug/allergen names, positive/negative conclusions) and drops the rest. Negation is protected by
construction: a clause that holds a negated entity is kept together with every clause back to its
negation cue, so "no evidence of malignancy" can never shrink to "malignancy". Dates are counted as
entities (N_total) but never keep a clause alive; dropping them is what lowers the fidelity F(B).

A lab panel or structured result report (`[panel] min_results` results read, 3 by default) keeps what is
abnormal (issue 46): its normal results (evidence/result_flags.py) are cut out and counted, "(6 other results
normal)" / "（其余6项正常）" in the text's language, before the clauses are chosen; every critical, abnormal or
unjudged result stays as written, with an arrow when the text does not flag it itself. Cutting a result never
moves a negation cue: the strongest separator around a cut stays, so a scope ends where it ended.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.evidence.result_flags import (
    ABNORMAL,
    CRITICAL,
    HIGH,
    NORMAL,
    ResultReading,
    flags_fingerprint,
    result_readings,
)
from ebmrag.evidence.result_tables import vocabulary_fingerprint
from ebmrag.evidence.results import result_mentions
from ebmrag.kvcache import KeyValueCache, digest
from ebmrag.protocols import checkpoint
from ebmrag.rules import bundled, read_user_file, rule_file
from ebmrag.text.sentences import split_sentences
from ebmrag.vocab.negation import negation

ENTITY_LEXICON = "evidence/entities.toml"  # the bundled lexicon, in the rules folder
CHECK_EVERY = 64  # texts compressed between two checkpoints (protocols.checkpoint: a long chart may be stopped)
# How a panel is cut and counted, a heading label kept and a colon read (below): in a stored state B's fingerprint.
PANEL_RULES = "panel-2; label-1; colon-1"
MIN_CUT = 2  # normal results a panel must hold to be counted: one is shorter written than "(1 other result normal)"
_LABEL = re.compile(r"[^\s:：,，;；]+(?:[ \t]+[^\s:：,，;；]+){0,4}[ \t]*[:：]")  # "Urine dipstick:", "胸片："


class EntityKind(StrEnum):
    VALUE = "value"
    TEST = "test"
    FINDING = "finding"
    DRUG = "drug"
    CONCLUSION = "conclusion"
    QUALIFIER = "qualifier"  # what makes a finding critical: grade, stage, size, receptor status, side, score
    DATE = "date"


@dataclass(frozen=True)
class Entity:
    kind: EntityKind
    text: str
    start: int
    end: int
    negated: bool = False

    @property
    def key(self) -> tuple[str, str, bool]:
        """Identity used to count survivors: same kind, same words, same polarity."""
        return (self.kind.value, re.sub(r"\s+", " ", self.text.lower()), self.negated)


@dataclass(frozen=True)
class PanelWording:
    """How a compressed panel marks and counts (entities.toml [panel]); `words[language]` holds `critical`,
    `other`, `others` and `all` for "english" and "chinese"."""

    min_results: int
    high: str
    low: str
    words: Mapping[str, Mapping[str, str]]

    def mark(self, reading: ResultReading, language: str) -> str:
        """The arrow (and the critical word) after a kept value whose abnormality the text does not write."""
        if reading.written or reading.result.flag not in (ABNORMAL, CRITICAL) or not reading.side:
            return ""
        arrow = self.high if reading.side == HIGH else self.low
        return arrow + (self.words[language]["critical"] if reading.result.flag == CRITICAL else "")

    def count(self, normal: int, kept: bool, language: str) -> str:
        words = self.words[language]
        if not kept:
            return words["all"].format(n=normal)
        return words["other"] if normal == 1 else words["others"].format(n=normal)


def _panel_wording(path: Path | str, table: Any) -> PanelWording:
    keys = ("critical", "other", "others", "all")
    try:
        words = {language: {key: str(table[language][key]) for key in keys} for language in ("english", "chinese")}
        wording = PanelWording(int(table["min_results"]), str(table["high"]), str(table["low"]), words)
        for language in words:
            wording.count(2, True, language), wording.count(2, False, language)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ConfigError(f"entity lexicon {path}: [panel] needs min_results, high, low and the english and "
                          f"chinese tables of {list(keys)} (with {{n}} in others and all): {exc!r}") from exc
    if wording.min_results < 1:
        raise ConfigError(f"entity lexicon {path}: [panel] min_results must be at least 1")
    return wording


@dataclass(frozen=True)
class Compression:
    """State B of a fragment; `fidelity_ratio` is N_entity / N_total (1.0 when the text has no entity)."""

    text: str
    entities_total: int
    entities_kept: int

    @property
    def fidelity_ratio(self) -> float:
        return self.entities_kept / self.entities_total if self.entities_total else 1.0


def _alternation(terms: list[str]) -> str:
    return "|".join(re.escape(t) for t in sorted(set(terms), key=len, reverse=True))


def _word_pattern(terms: list[str]) -> re.Pattern[str]:
    ascii_terms = [t for t in terms if t.isascii()]
    cjk_terms = [t for t in terms if not t.isascii()]
    parts = [rf"(?<![\w-])(?:{_alternation(ascii_terms)})(?![\w-])"] if ascii_terms else []
    if cjk_terms:
        parts.append(f"(?:{_alternation(cjk_terms)})")
    return re.compile("|".join(parts), re.IGNORECASE)


_DATE = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b|"
    r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?\s+(?:\d{1,2},?\s+)?(?:19|20)\d{2}\b|"
    r"\b(?:in|since|from|on)\s+(?:19|20)\d{2}\b|\d{4}年(?:\d{1,2}月)?(?:\d{1,2}日)?",
    re.IGNORECASE,
)
_SCOPE_END = re.compile(r"\.(?!\d)|[!?。！？\n;；]|\b(?:but|however|although)\b", re.IGNORECASE)
# A comma between digits ("1,100/mm3", a decimal "1,73 m2") is part of a number, not a clause end; nor is a colon
# between digits (an HLA allele "HLA-B*58:01", a time "06:30").
_CLAUSE_END = re.compile(r"(?<!\d),|,(?!\d)|(?<!\d):|:(?!\d)|[，;；：]|(?=\s(?:but|however|although)\s)",
                         re.IGNORECASE)


class EntityExtractor:
    """Regex and lexicon entity extractor; lexicons come from rules/evidence/entities.toml (or a user's file at
    `lexicon_path`), negation cues from the shared rules/negation.toml (vocab.negation)."""

    def __init__(self, lexicon_path: str | Path | None = None) -> None:
        if lexicon_path:
            path: Path | str = Path(lexicon_path)
            lex, source = read_user_file(Path(lexicon_path), "entity lexicon")
        else:
            path, lex, source = ENTITY_LEXICON, bundled().read(ENTITY_LEXICON), bundled().source(ENTITY_LEXICON)
        # what a stored result computed from this lexicon depends on (and laboratory results, rules/analytes.toml,
        # the negation cues, and the flags that decide which results of a panel are normal)
        cues = negation()
        self.fingerprint = digest("entities", source, vocabulary_fingerprint(), cues.source, flags_fingerprint(),
                                  PANEL_RULES)
        self.panel = _panel_wording(path, lex["panel"] if "panel" in lex else bundled().read(ENTITY_LEXICON)["panel"])
        missing = {
            "units",
            "tests",
            "drugs",
            "drug_suffixes",
            "findings",
            "finding_suffixes",
            "conclusions",
            "filler",
        } - set(lex)
        if missing:
            raise ConfigError(f"entity lexicon {path} lacks lists {sorted(missing)}")
        number = r"[<>≤≥~]?\d+(?:[.,]\d+)?(?:\s*(?:-|–|/|×|x|to)\s*\d+(?:[.,]\d+)?)*"
        self._value = re.compile(rf"{number}\s*(?:{_alternation(lex['units'])})(?![A-Za-z])", re.IGNORECASE)
        self._patterns = {
            EntityKind.TEST: _word_pattern(lex["tests"]),
            EntityKind.DRUG: re.compile(
                _word_pattern(lex["drugs"]).pattern + rf"|\b\w+(?:{_alternation(lex['drug_suffixes'])})\b",
                re.IGNORECASE,
            ),
            EntityKind.FINDING: re.compile(
                _word_pattern(lex["findings"]).pattern
                + rf"|\b\w{{3,}}(?:{_alternation(lex['finding_suffixes'])})\b|\bCD\d+\b",
                re.IGNORECASE,
            ),
            EntityKind.CONCLUSION: _word_pattern(lex["conclusions"]),
        }
        qualifiers = lex.get("qualifiers", [])
        try:
            self._qualifier = re.compile("|".join(f"(?:{q})" for q in qualifiers), re.IGNORECASE) if qualifiers \
                else None
        except re.error as exc:
            raise ConfigError(f"entity lexicon {path}: a qualifiers pattern is not a valid regex: {exc}") from exc
        self._negation = cues.cue
        self._filler = _word_pattern(lex["filler"])

    def extract(self, text: str) -> list[Entity]:
        """Entities in text order; overlapping matches keep the earliest, then the longest."""
        found: list[tuple[int, int, EntityKind]] = []
        found += [(m.start(), m.end(), EntityKind.VALUE) for m in self._value.finditer(text)]
        found += [(m.start(), m.end(), EntityKind.DATE) for m in _DATE.finditer(text)]
        for kind, pattern in self._patterns.items():
            found += [(m.start(), m.end(), kind) for m in pattern.finditer(text)]
        if self._qualifier is not None:
            found += [(m.start(), m.end(), EntityKind.QUALIFIER) for m in self._qualifier.finditer(text) if m.group()]
        # A laboratory result the lexicon cannot see ("K+ 6.8↑", "Na 118", "血清钾：6.8") is a value with its analyte.
        found += [(m.start, m.end, EntityKind.VALUE) for m in result_mentions(text)
                  if not any(start < m.end and m.start < end for start, end, _ in found)]
        found.sort(key=lambda item: (item[0], -(item[1] - item[0])))
        entities: list[Entity] = []
        scopes = self.negation_scopes(text)
        last_end = -1
        for start, end, kind in found:
            if start >= last_end:
                negated = self.negation_cue_start(text, start, scopes) is not None
                entities.append(Entity(kind, text[start:end], start, end, negated))
                last_end = end
        return entities

    def negation_scopes(self, text: str) -> list[tuple[int, int]]:
        """(cue start, scope end) for every negation cue in the text.

        A scope runs from the cue to the end of its sentence, but stops at "but"/"however" and at a
        semicolon; commas do not end it ("no fever, chills or rash" negates all three).
        """
        stops = sorted(m.start() for m in _SCOPE_END.finditer(text))
        scopes = []
        for cue in self._negation.finditer(text):
            end = next((stop for stop in stops if stop >= cue.end()), len(text))
            scopes.append((cue.start(), end))
        return scopes

    def negation_cue_start(self, text: str, position: int, scopes: list[tuple[int, int]] | None = None) -> int | None:
        """Start of the nearest negation cue whose scope covers `position`, if any."""
        covering = [
            start
            for start, end in (scopes if scopes is not None else self.negation_scopes(text))
            if start <= position < end
        ]
        return max(covering) if covering else None

    def strip_filler(self, text: str) -> str:
        stripped = self._filler.sub("", text)
        stripped = re.sub(r"\s+([,.;:])", r"\1", re.sub(r"\s{2,}", " ", stripped)).strip(" ,")
        stripped = re.sub(r"^(?:and|or|then)\s+", "", stripped, flags=re.IGNORECASE)
        return stripped[:1].upper() + stripped[1:] if stripped else stripped


def _clause_spans(sentence: str) -> list[tuple[int, int]]:
    spans, start = [], 0
    for match in _CLAUSE_END.finditer(sentence):
        spans.append((start, match.end()))
        start = match.end()
    spans.append((start, len(sentence)))
    return [(s, e) for s, e in spans if sentence[s:e].strip()]


def _join_clauses(clauses: list[str]) -> str:
    """Join with a space, except after Chinese text, which is written without one."""
    text = ""
    for clause in clauses:
        text += clause if not text or not text[-1].isascii() else " " + clause
    return text.rstrip(",，;； ")


class EntityCompressor:
    """Builds state B: the clauses that hold key entities, filler removed, negation intact.

    State B is a pure function of the text and the lexicon, so it is memoised in memory and, given a
    `store` (the packer passes its cache directory's), on disk: a large record packed again costs a lookup.
    """

    def __init__(self, extractor: EntityExtractor, memory: int = 8192, store: KeyValueCache | None = None) -> None:
        """`extractor`: the composition root's (compose.Resources.extractor), shared with the gate and grounding."""
        self.extractor = extractor
        self._memory: dict[str, Compression] = {}  # text -> state B; `prepare` and `run` ask for the same texts
        self._limit = memory
        self.store = store

    def _compress_sentence(self, sentence: str) -> str:
        entities = self.extractor.extract(sentence)
        scopes = self.extractor.negation_scopes(sentence)
        spans = _clause_spans(sentence)
        keep: set[int] = set()
        for entity in entities:
            if entity.kind is EntityKind.DATE:
                continue
            index = next(i for i, (s, e) in enumerate(spans) if s <= entity.start < e)
            last = next((i for i, (s, e) in enumerate(spans) if s < entity.end <= e), index)  # "Na: 118" spans two
            cue = self.extractor.negation_cue_start(sentence, entity.start, scopes) if entity.negated else None
            first = index if cue is None else next(i for i, (s, e) in enumerate(spans) if s <= cue < e)
            keep.update(range(first, max(index, last) + 1))
        for result in result_mentions(sentence):  # "Sodium: 138": the test is an entity, its value is not
            keep.update(i for i, (s, e) in enumerate(spans) if s < result.end and result.start < e)
        if not keep:
            return ""
        if 0 not in keep and _LABEL.fullmatch(sentence[spans[0][0]:spans[0][1]].strip()):
            keep.add(0)  # a short label heading the sentence names what the kept clauses are about
        kept = _join_clauses([sentence[s:e].strip() for i, (s, e) in enumerate(spans) if i in keep])
        slim = self.extractor.strip_filler(kept)
        before = {e.key for e in self.extractor.extract(kept) if e.kind is not EntityKind.DATE}
        after = {e.key for e in self.extractor.extract(slim) if e.kind is not EntityKind.DATE}
        return slim if before <= after else kept

    def compress(self, text: str) -> Compression:
        """State B of `text`, computed once per text (a pure function of the text and the lexicon)."""
        return self.compress_many([text])[0]

    def compress_many(self, texts: Sequence[str]) -> list[Compression]:
        """State B of each text: memory first, then the disk store in one query, then computed (and stored).
        The results come from this call's own lookups: another thread may clear the memory meanwhile."""
        remembered = {t: c for t in dict.fromkeys(texts) if (c := self._memory.get(t)) is not None}
        missing = [t for t in dict.fromkeys(texts) if t not in remembered]
        found: dict[str, Compression] = {}
        if missing and self.store is not None:
            keys = {digest(self.extractor.fingerprint, t): t for t in missing}
            for key, blob in self.store.get_many(list(keys)).items():
                body, total, kept = json.loads(blob)
                found[keys[key]] = Compression(body, total, kept)
        fresh: dict[str, Compression] = {}
        for text in (t for t in missing if t not in found):
            if len(fresh) % CHECK_EVERY == 0:
                checkpoint()
            fresh[text] = self._compress(text)
        if fresh and self.store is not None:
            self.store.put_many({digest(self.extractor.fingerprint, t): json.dumps(
                [c.text, c.entities_total, c.entities_kept]).encode() for t, c in fresh.items()})
        known = {**found, **fresh}
        results = [known[t] if t in known else remembered[t] for t in texts]
        if len(self._memory) + len(known) > self._limit:
            self._memory.clear()
        self._memory.update(known)
        return results

    def forget(self, texts: Sequence[str]) -> int:
        """Erase these texts' state B from memory and the disk store; returns the rows removed."""
        for text in texts:
            self._memory.pop(text, None)
        if self.store is None:
            return 0
        return self.store.forget([digest(self.extractor.fingerprint, t) for t in texts])

    def _compress(self, text: str) -> Compression:
        original = {e.key for e in self.extractor.extract(text)}
        panel, readings = self.extractor.panel, result_readings(text)
        language = "chinese" if len(_CHINESE.findall(text)) >= 2 else "english"
        sentences, normal = [s.text for s in split_sentences(text)], 0
        if len(readings) >= panel.min_results and sum(r.result.flag == NORMAL for r in readings) >= MIN_CUT:
            cut = [_without_normal_results(s, panel, language) for s in sentences]
            sentences, normal = [s for s, _ in cut], sum(n for _, n in cut)
        pieces = [self._compress_sentence(s) for s in sentences if s]
        compressed = " ".join(p if p[-1] in ".!?。！？" else p + "." for p in pieces if p)
        if normal:
            count = panel.count(normal, any(r.result.flag != NORMAL for r in readings), language)
            compressed += ("" if not compressed or language == "chinese" else " ") + count
        kept = {e.key for e in self.extractor.extract(compressed)} & original
        return Compression(compressed, len(original), len(kept))


_CHINESE = re.compile(r"[\u3400-\u9fff\u3000-\u303f\uff01-\uff0f\uff1a-\uff1f]")  # ideographs, CJK punctuation
_CUT = "\x00"
_AROUND_CUT = re.compile(r"[\s,，、;；:：|]*\x00(?:[\s,，、;；:：|]*\x00)*[\s,，、;；:：|]*")
# a cut keeps the strongest separator around it: a line break or a semicolon ends a negation scope, a comma not
_STRONGEST = ("\n", "；", ";", "：", ":", "，", ",", "、", "|")
_EMPTY_BRACKETS = re.compile(r"[(（\[]\s*[)）\]]")
_BEFORE_END = re.compile(r"[\s,，、;；:：|]+(?=[。！？!?]|\.(?!\d)|$)")


def _without_normal_results(sentence: str, panel: PanelWording, language: str) -> tuple[str, int]:
    """The sentence with its normal results cut out (each with its unit, flag and range) and the rest marked,
    and how many were cut. The separators around a cut collapse to the strongest of them, so "Na 138; K 6.8 H"
    keeps its semicolon, and a negation scope that ended at one still ends there."""
    pieces, at, cut = [], 0, 0
    for reading in result_readings(sentence):
        start = reading.result.mention.start
        if reading.result.flag == NORMAL:
            pieces += [sentence[at:start], _CUT]
            cut += 1
        else:
            pieces += [sentence[at:reading.end], panel.mark(reading, language)]
        at = reading.end
    if not cut:
        return "".join([*pieces, sentence[at:]]), 0
    joined = _AROUND_CUT.sub(_strongest, "".join([*pieces, sentence[at:]]))
    joined = _BEFORE_END.sub("", _EMPTY_BRACKETS.sub("", joined)).strip(" \n,，、;；:：|")
    return (joined if any(c.isalnum() for c in joined) else ""), cut


def _strongest(found: re.Match[str]) -> str:
    around = found.group()
    return next((s + (" " if s.isascii() and s.strip() else "") for s in _STRONGEST if s in around), " ")


@rule_file(ENTITY_LEXICON)
def default_extractor(table: Mapping[str, Any]) -> EntityExtractor:
    """The extractor of the bundled lexicon, compiled once by the rule book: what the composition root hands every
    component (`compose.Resources.extractor`); a component never falls back to it on its own."""
    return EntityExtractor()
