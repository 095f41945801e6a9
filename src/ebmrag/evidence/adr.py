"""Adverse drug reactions recognised from their parts: a drug, a reaction and a link, in one clause.

A chart tells a drug reaction in many ways ("azithromycin-induced ototoxicity", "blistering of the mouth after a
course of an antibiotic", "注射青霉素后出现呼吸困难、血压下降"); none of them needs the word "allergy". What they
share is a grammar: a DRUG (the drug lexicon of vocab.lexicon, or a name built on a WHO INN stem), a REACTION (an
adverse-reaction term, a serious reaction, or a word that names a disorder) and a LINK that makes the drug the
cause (a compound such as "-induced", a causal or temporal cue between them). A reaction stated as absent ("no
reaction to", "tolerated") or not yet happened ("if she develops a rash") is no fact. The vocabularies live in
rules/adr.toml and rules/reactions.txt, the negation cues in the shared src/ebmrag/rules/negation.toml
(vocab.negation); this module only finds spans and checks their order.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.models.ngram_classifier import HashedNgramClassifier
from ebmrag.rules import rule_file
from ebmrag.vocab.lexicon import chinese_drug_spans, drug_names, terms
from ebmrag.vocab.negation import negation

ADR_RULES, REACTIONS = "evidence/adr.toml", "evidence/reactions.txt"  # in the rules folder
MODEL_PATH = Path(__file__).parent / "models" / "adr_model.npz"  # bench/train_adr_model.py
SERIOUS = "serious"  # the last part of a serious reaction's description ("drug=...; reaction=...; serious")
_SENTENCE = re.compile(r"(?<!\d)[.](?!\d)|[;!?。；！？\n]")
_WORD = re.compile(r"[a-z][a-z0-9]*(?:['-][a-z0-9]+)*")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_ZH_ROUTE = re.compile(r"^[\u4e00-\u9fff]{0,2}?(使用|服用|应用|肌注|注射|输注|静滴|静点|口服|予以|给予|予|用)")
_SCOPE_BREAK = re.compile(r"\b(but|however|although|though|yet|until|except|whereas)\b|[:，,]|出现|后", re.IGNORECASE)
MAX_GAP = 140  # characters between a drug and its reaction
_SHORT_LINK = re.compile(r"^\W{0,3}(to|of|from|with)\s+(the\s+|an?\s+|oral\s+|topical\s+|intravenous\s+|iv\s+)?$")
_CONDITION_OF = re.compile(r"\b(with|has|had|have|known|history of)\s+(\S+\s+)?$")  # "a patient with asthma ..."


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    text: str


@dataclass(frozen=True)
class AdrMention:
    """One drug reaction: the drug and the reaction as written, the link that joins them, and whether the
    reaction is one of the serious ones (anaphylaxis, angioedema, SJS/TEN, DRESS, ...)."""

    drug: str
    reaction: str
    link: str
    serious: bool

    def describe(self) -> str:
        return f"drug={self.drug}; reaction={self.reaction}" + (f"; {SERIOUS}" if self.serious else "")


@dataclass(frozen=True)
class _Vocabulary:
    stems_suffix: tuple[str, ...]
    stems_prefix: tuple[str, ...]
    min_stem_word: int
    zh_drug: re.Pattern[str]
    en_generic: frozenset[str]
    not_drug_words: frozenset[str]
    not_drug_context: re.Pattern[str]
    serious: re.Pattern[str]
    zh_reaction: re.Pattern[str]
    reaction_terms: frozenset[str]
    suffixes: tuple[str, ...]
    min_suffix_word: int
    compound: re.Pattern[str]
    reaction_then_drug: re.Pattern[str]
    drug_then_reaction: re.Pattern[str]
    before_drug: re.Pattern[str]
    indication: re.Pattern[str]
    condition_then_drug: re.Pattern[str]
    improvement: re.Pattern[str]
    withdrawal: re.Pattern[str]
    negation: re.Pattern[str]
    tolerated: re.Pattern[str]
    hypothetical: re.Pattern[str]


def _strings(table: Mapping[str, Any], key: str, path: str) -> list[str]:
    value = table.get(key)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"ADR rules {path}: `{key}` must be a list of strings")
    return value


def _alternation(patterns: list[str], key: str, path: str) -> re.Pattern[str]:
    try:
        return re.compile("|".join(f"(?:{p})" for p in sorted(patterns, key=len, reverse=True)), re.IGNORECASE)
    except re.error as exc:
        raise ConfigError(f"ADR rules {path}: a pattern in `{key}` is not a valid regex: {exc}") from exc


@rule_file(ADR_RULES, REACTIONS)
def vocabulary(data: Mapping[str, Any], terms: tuple[str, ...]) -> _Vocabulary:
    """The ADR rules (rules/evidence/adr.toml) with the reaction terms (rules/evidence/reactions.txt), both from the
    same book. The negation cues and drug names come from the bundled vocabularies (vocab/), shared by every reader."""
    rules_path = ADR_RULES
    drugs, reactions, links, qualifiers = (data.get(k) for k in ("drugs", "reactions", "links", "qualifiers"))
    if not all(isinstance(t, dict) for t in (drugs, reactions, links, qualifiers)):
        raise ConfigError(f"ADR rules {rules_path}: needs [drugs], [reactions], [links] and [qualifiers] tables")
    assert isinstance(drugs, dict) and isinstance(reactions, dict) and isinstance(links, dict)
    assert isinstance(qualifiers, dict)

    def alt(table: Mapping[str, Any], key: str, escape: bool = False) -> re.Pattern[str]:
        items = _strings(table, key, rules_path)
        return _alternation([re.escape(i) for i in items] if escape else items, key, rules_path)

    compound = links.get("drug_compound")
    if not isinstance(compound, str):
        raise ConfigError(f"ADR rules {rules_path}: `drug_compound` must be a regex string")
    return _Vocabulary(
        stems_suffix=tuple(_strings(drugs, "inn_stems_suffix", rules_path)),
        stems_prefix=tuple(_strings(drugs, "inn_stems_prefix", rules_path)),
        min_stem_word=int(drugs.get("min_stem_word", 7)),
        zh_drug=_alternation([f"[\u4e00-\u9fff]{{0,4}}{re.escape(s)}" for s in _strings(drugs, "zh_stems", rules_path)]
                             + [f"{re.escape(s)}[\u4e00-\u9fff]{{0,2}}"
                                for s in _strings(drugs, "zh_stems_prefix", rules_path)]
                             + [re.escape(c) for c in _strings(drugs, "zh_classes", rules_path)],
                             "zh_stems", rules_path),
        en_generic=frozenset(_strings(drugs, "en_generic", rules_path)),
        not_drug_words=frozenset(_strings(drugs, "not_drug_words", rules_path)),
        not_drug_context=alt(drugs, "not_drug_context"),
        serious=_alternation([f"\\b(?:{p})" for p in _strings(reactions, "serious_en", rules_path)]
                             + [re.escape(z) for z in _strings(reactions, "serious_zh", rules_path)],
                             "serious_en", rules_path),
        zh_reaction=alt(reactions, "other_zh", escape=True),
        reaction_terms=frozenset([*terms, *_strings(reactions, "en_words", rules_path)]),
        suffixes=tuple(_strings(reactions, "suffixes", rules_path)),
        min_suffix_word=int(reactions.get("min_suffix_word", 7)),
        compound=_compile(compound, rules_path),
        reaction_then_drug=alt(links, "reaction_then_drug"),
        drug_then_reaction=alt(links, "drug_then_reaction"),
        before_drug=alt(links, "before_drug"),
        indication=alt(links, "indication"),
        condition_then_drug=alt(links, "condition_then_drug"),
        improvement=alt(links, "improvement"),
        withdrawal=alt(links, "withdrawal"),
        negation=negation().cue,
        tolerated=alt(qualifiers, "tolerated"),
        hypothetical=alt(qualifiers, "hypothetical"),
    )


def _compile(pattern: str, path: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise ConfigError(f"ADR rules {path}: `drug_compound` is not a valid regex: {exc}") from exc


# --------------------------------------------------------------------------- spans
def _words(text: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m.group()) for m in _WORD.finditer(text)]


def _is_drug_word(word: str, vocab: _Vocabulary) -> bool:
    if word in vocab.not_drug_words:
        return False
    if word in drug_names() or word in vocab.en_generic or word in terms().general:
        return True
    return len(word) >= vocab.min_stem_word and (word.endswith(vocab.stems_suffix)
                                                 or word.startswith(vocab.stems_prefix))


def drug_spans(text: str, vocab: _Vocabulary | None = None) -> list[Span]:
    """Drug names, classes and INN-stem names in a lower-cased, NFKC text; a hyphenated compound is also read
    by its parts ("metoclopramide-induced")."""
    vocab = vocab or vocabulary()
    spans = []
    for start, end, word in _words(text):
        parts = [(start, end, word)] if "-" not in word else _parts(start, word)
        spans += [Span(s, e, w) for s, e, w in parts if _is_drug_word(w, vocab)]
    if _CJK.search(text):
        for m in vocab.zh_drug.finditer(text):
            lead = _ZH_ROUTE.match(m.group())  # "肌注青霉素": the route is not the drug's name
            spans.append(Span(m.start() + (lead.end() if lead else 0), m.end(), m.group()[lead.end() if lead else 0:]))
        stems = [(s.start, s.end) for s in spans]  # a brand or preparation without an INN stem: the vocabulary's names
        spans += [Span(a, b, name) for a, b, name in chinese_drug_spans(text)
                  if all(b <= x or a >= y for x, y in stems)]
    blocked = [m.span() for m in vocab.not_drug_context.finditer(text)]
    return [s for s in spans if not any(a <= s.start < b for a, b in blocked)]


def _parts(start: int, word: str) -> list[tuple[int, int, str]]:
    out, offset = [(start, start + len(word), word)], start
    for part in word.split("-"):
        out.append((offset, offset + len(part), part))
        offset += len(part) + 1
    return out


def reaction_spans(text: str, vocab: _Vocabulary | None = None) -> list[tuple[Span, bool]]:
    """(reaction span, serious) in a lower-cased, NFKC text: serious reactions, adverse-reaction terms of one to
    four words, words built on a disorder suffix, and Chinese reaction terms."""
    vocab = vocab or vocabulary()
    found = [(Span(m.start(), m.end(), m.group()), True) for m in vocab.serious.finditer(text)]
    words = _words(text)
    for i in range(len(words)):
        for n in (4, 3, 2, 1):
            if i + n > len(words):
                continue
            phrase = " ".join(w for _, _, w in words[i:i + n])
            if phrase in vocab.reaction_terms:
                found.append((Span(words[i][0], words[i + n - 1][1], phrase), False))
                break
        else:
            word = words[i][2].rsplit("-", 1)[-1]
            if len(word) >= vocab.min_suffix_word and word.endswith(vocab.suffixes):
                found.append((Span(words[i][0], words[i][1], words[i][2]), False))
    if _CJK.search(text):
        found += [(Span(m.start(), m.end(), m.group()), False) for m in vocab.zh_reaction.finditer(text)]
    serious = [span for span, grave in found if grave]
    return [(span, grave) for span, grave in found
            if grave or not any(s.start < span.end and span.start < s.end for s in serious)]


# --------------------------------------------------------------------------- links
def _clauses(text: str) -> Iterator[tuple[int, str]]:
    start = 0
    for mark in _SENTENCE.finditer(text):
        yield start, text[start:mark.start()]
        start = mark.end()
    yield start, text[start:]


def _before(clause: str, end: int, reach: int) -> str:
    """Up to `reach` characters before `end`, from the last scope break (a 'but', a comma) on."""
    window = clause[max(0, end - reach): end]
    breaks = list(_SCOPE_BREAK.finditer(window))
    return window[breaks[-1].end():] if breaks else window


def _after(clause: str, start: int, reach: int) -> str:
    """Up to `reach` characters from `start`, to the first scope break."""
    window = clause[start:start + reach]
    cut = _SCOPE_BREAK.search(window)
    return window[:cut.start()] if cut else window


def _link(clause: str, drug: Span, reaction: Span, vocab: _Vocabulary) -> str:
    """The cue that makes the drug the cause of the reaction, or '' when there is none (or an indication)."""
    if reaction.start >= drug.end:
        between = clause[drug.end:reaction.start]
        if len(between) > MAX_GAP or _indication_for(clause, reaction, vocab, condition=False):
            return ""
        if vocab.improvement.search(between) or vocab.improvement.search(_after(clause, reaction.end, 25)):
            return ""  # "after amoxicillin the cough improved", "输液治疗后头痛逐渐缓解": the drug helped
        if (compound := vocab.compound.match(clause, drug.end)) and compound.end() <= reaction.end:
            return compound.group().strip(" -")
        if cue := vocab.drug_then_reaction.search(between):
            return cue.group()
        lead = clause[max(0, drug.start - 40): drug.start]
        if cue := vocab.before_drug.search(lead):
            return cue.group()
        return ""
    between = clause[reaction.end:drug.start]
    if len(between) > MAX_GAP:
        return ""
    if vocab.improvement.search(clause[reaction.start:drug.start]):
        # "the rash resolved after amoxicillin was stopped": a dechallenge, the classic sign of a drug reaction
        return "dechallenge" if vocab.withdrawal.search(clause[reaction.end: drug.end + 30]) else ""
    if _indication_for(clause, reaction, vocab):
        return ""
    cue = vocab.reaction_then_drug.search(between)
    if cue:
        return cue.group()
    short = _SHORT_LINK.match(between)  # "hypersensitivity to flurbiprofen", "toxicity of lithium"
    return short.group(1) if short else ""


def _indication_for(clause: str, reaction: Span, vocab: _Vocabulary, condition: bool = True) -> bool:
    """'treated for pneumonia', 'patients with asthma on ...': the condition the drug was given for (`condition`:
    also 'with X' before the drug; after it, 'left her with X' is the reaction)."""
    lead = _before(clause, reaction.start, 25)
    return bool(vocab.indication.search(lead)) or (condition and bool(_CONDITION_OF.search(lead)))


def _treated(clause: str, reaction: Span, vocab: _Vocabulary) -> bool:
    """What the grammar knows against a reaction, for the model's clauses too: the condition a drug is given
    for ("for asthma", "治疗肺炎"), or a condition that got better ("wheeze improved", "咳嗽好转")."""
    lead = clause[max(0, reaction.start - 25): reaction.start]
    return (_indication_for(clause, reaction, vocab) or bool(vocab.improvement.search(_after(clause, reaction.end, 25)))
            or bool(vocab.indication.search(clause[reaction.end:reaction.end + 4]))
            or bool(vocab.condition_then_drug.search(clause[reaction.end:reaction.end + 30]))
            or bool(vocab.improvement.search(lead)))


def _stated(clause: str, drug: Span, reaction: Span, vocab: _Vocabulary) -> bool:
    """Not negated, not tolerated, not hypothetical, not excluded or taken back after it (the shared grammar of
    vocab.negation: "青霉素过敏史已排除", "既往头孢过敏经激发试验证实为非过敏", "allergy label removed after a negative
    challenge")."""
    first = min(drug.start, reaction.start)
    if vocab.negation.search(_before(clause, reaction.start, 45)):
        return False
    if negation().taken_back(clause, [(reaction.start, reaction.end)], preceding=False)[0]:
        return False
    if vocab.tolerated.search(clause[max(0, drug.start - 40): drug.end + 30]):
        return False
    return not vocab.hypothetical.search(clause[max(0, first - 60): reaction.start])


@lru_cache(maxsize=4096)  # the tier rules' allergy detectors may ask of one text in turn
def allergy_taken_back(text: str, entry: bool = False) -> str:
    """The words that take back every allergy and reaction the text names, or '' when one of them stands (or it
    names none): "Penicillin allergy delabelled after a negative oral challenge", "否认药物过敏史". A reaction told
    without the word allergy ("anaphylaxis to peanuts") is named too, so that a denial beside it never hides it.
    `entry`: the text is an allergy entry, which names its allergy in its head ("Penicillin: tolerated
    amoxicillin 2023"; vocab.negation). What the tier rules ask before a fragment is packed as an allergy."""
    normalized = unicodedata.normalize("NFKC", text).lower()
    return negation().allergy_taken_back(normalized, entry, [(s.start, s.end) for s, _ in reaction_spans(normalized)])


def adr_mentions(text: str, use_model: bool = True) -> list[AdrMention]:
    """Every drug reaction the text states, in order; [] when it names no drug or no reaction.

    The grammar decides first. A clause that names a drug and a reaction the grammar cannot link (a case-report
    turn of phrase: "torsade de pointes represents a complication of chronic amiodarone therapy") goes to the
    ADR model, which reads the clause with its drugs and reactions masked, so it learns how a link is written
    rather than which drugs cause what."""
    return linked_or_modelled(*scan(text), use_model=use_model)


def linked_or_modelled(found: Sequence[AdrMention], unlinked: Sequence[Unlinked],
                       use_model: bool = True) -> list[AdrMention]:
    """What the grammar linked, else what the ADR model reads in the clauses it could not link (`scan`'s two
    results: a caller that has scanned the text already does not scan it again)."""
    if not found and unlinked and use_model and (model := adr_model()) is not None:
        return _model_mentions(model, list(unlinked))
    return list(found)


Unlinked = tuple[str, Span, Span, bool]  # masked clause, drug, nearest reaction, serious


def scan(text: str) -> tuple[list[AdrMention], list[Unlinked]]:
    """What the grammar links, and the clauses with a drug and a stated reaction that it could not link."""
    vocab = vocabulary()
    normalized = unicodedata.normalize("NFKC", text).lower()
    found: list[AdrMention] = []
    unlinked: list[Unlinked] = []
    every_drug = drug_spans(normalized, vocab)  # once for the text: most fragments name no drug at all
    if not every_drug:
        return found, unlinked
    for offset, clause in _clauses(normalized):
        drugs = [Span(d.start - offset, d.end - offset, d.text) for d in every_drug
                 if offset <= d.start and d.end <= offset + len(clause)]
        if not drugs:
            continue
        reactions = [(r, s) for r, s in reaction_spans(clause, vocab)
                     if not any(d.start <= r.start < d.end or r.start <= d.start < r.end for d in drugs)]
        pairs = _pairs(clause, drugs, reactions, vocab)
        found += pairs
        if pairs:
            continue
        named = [d for d in drugs if d.text not in vocab.en_generic and d.text not in terms().general]
        if not named or not reactions:  # "controlled with medication", "taking phenytoin": nothing to link
            continue
        reaction, serious = min(reactions, key=lambda r: abs(r[0].start - named[0].start))
        if _stated(clause, named[0], reaction, vocab) and not _treated(clause, reaction, vocab):
            unlinked.append((masked(clause, drugs, [r for r, _ in reactions]), named[0], reaction, serious))
    return found, unlinked


def masked(clause: str, drugs: list[Span], reactions: list[Span]) -> str:
    """The clause with every drug written 'drugx' and every reaction 'reactx': what the ADR model reads."""
    spans = sorted([(d.start, d.end, " drugx ") for d in drugs] + [(r.start, r.end, " reactx ") for r in reactions])
    out, at = [], 0
    for start, end, mark in spans:
        if start >= at:
            out += [clause[at:start], mark]
            at = end
    return "".join([*out, clause[at:]])


@cache
def adr_model(path: Path = MODEL_PATH) -> HashedNgramClassifier | None:
    """The bundled ADR model, or None when the package was built without it."""
    return HashedNgramClassifier(path) if path.exists() else None


def link_probability(text: str) -> float:
    """The ADR model's highest probability that a clause the grammar could not link states a reaction to its
    drug (0.0 when the text has no such clause, 1.0 when the grammar links one; evidence.second_reading weighs
    a drug beside a clinical event by it when no recogniser reads the text)."""
    found, unlinked = scan(text)
    if found:
        return 1.0
    model = adr_model()
    if not unlinked or model is None:
        return 0.0 if not unlinked else 1.0
    return float(model.probabilities([clause for clause, *_ in unlinked])[:, model.labels.index("adr")].max())


def _model_mentions(model: HashedNgramClassifier, unlinked: list[Unlinked]) -> list[AdrMention]:
    threshold = float(model.meta.get("threshold", 0.5))
    column = model.labels.index("adr")
    p = model.probabilities([text for text, *_ in unlinked])[:, column]
    return [AdrMention(drug.text, reaction.text, f"model p={p_i:.2f}", serious)
            for (_, drug, reaction, serious), p_i in zip(unlinked, p, strict=True) if p_i >= threshold]


def _pairs(clause: str, drugs: list[Span], reactions: list[tuple[Span, bool]], vocab: _Vocabulary) -> list[AdrMention]:
    out: list[AdrMention] = []
    for drug in drugs:
        compound = vocab.compound.match(clause, drug.end)
        if compound and not reactions and _stated(clause, drug, Span(compound.start(), compound.end(), ""), vocab):
            out.append(AdrMention(drug.text, compound.group().strip(" -"), "compound", False))
            continue
        for reaction, serious in sorted(reactions, key=lambda r: abs(r[0].start - drug.start)):
            link = _link(clause, drug, reaction, vocab)
            if link and _stated(clause, drug, reaction, vocab):
                out.append(AdrMention(drug.text, reaction.text, link, serious or _serious_clause(clause, vocab)))
                break
    return out


def _serious_clause(clause: str, vocab: _Vocabulary) -> bool:
    return bool(vocab.serious.search(clause))
