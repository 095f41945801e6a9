"""Fact states: a critical fragment's finding read into named roles and rendered as one line (issue 46).

A critical fact told in an ordinary sentence costs tens of tokens in full and barely fewer compressed, because the
compressed state keeps the whole clause; the fact itself ("penicillin → anaphylaxis (severe)") is a line of ten
tokens or so (bench/fact_states.py measures it on the shared sets). This module gives the packer that line, built
only from what the shared readers find, never by summarising:

- allergy and ADR: drug (or another allergen), reaction and severity as written: the ADR reader's pairs
  (evidence.adr; the tier rule's own finding first), the allergy grammar of rules/evidence/facts.toml for a
  substance named beside its allergy word ("allergic to X", "X allergy", "对X过敏"), the reaction vocabulary;
- result: analyte, value and unit as written, with the critical flag the result reader gives (evidence.results);
- genetic: gene, variant and phenotype as written (vocab.genes) and the drugs CPIC pairs with the gene;
- pathology: specimen, diagnosis, grade, stage, margins and biomarker status, each by its grammar in facts.toml.

Every role but a result's flag and a gene's drugs (the readers' judgement, not the text's words) is a span of the
fragment's text as written, so a line never says what the fragment does not. A fragment whose essential role
cannot be read (no substance for an allergy, no drug and reaction for an ADR, no diagnosis, no analyte with its
value, no gene) has no fact state, and neither has an allergy or reaction that the shared negation grammar takes
back (vocab.negation). The grammar is read by evidence.fact_grammar, the pathology roles by
evidence.pathology_roles.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from ebmrag.evidence.adr import allergy_taken_back, drug_spans, reaction_spans, vocabulary
from ebmrag.evidence.fact_grammar import CJK, KINDS, Span, grammar, overlap, unique
from ebmrag.evidence.pathology_roles import pathology_roles
from ebmrag.evidence.result_tables import ANALYTES, CRITICAL, result_tables
from ebmrag.evidence.second_reading import adr_in, genes_in, results_in
from ebmrag.records.fragment import TierDecision
from ebmrag.rules import bundled
from ebmrag.text.injection import without_instructions
from ebmrag.vocab.genes import vocabulary as gene_vocabulary
from ebmrag.vocab.lexicon import terms
from ebmrag.vocab.negation import negation

__all__ = ["DRUGS_SHOWN", "KINDS", "REACH", "Fact", "fact_kind", "read_fact"]

DRUGS_SHOWN = 4  # CPIC drugs a genetic line names before "+N more": a line stays near 25 tokens
REACH = 60  # characters after a substance within which a reaction is its own ("Sulfa caused blisters and rash")
_HEADS = {"allergy": "allergy", "adr": "ADR", "pathology": "pathology", "genetic": "genetic", "result": "result"}
_SUBSTANCE = ("drug", "allergen")
_STATEMENT = re.compile(r"[.](?!\d)|[!?。！？\n]")
_LIST_END = re.compile(r"[.](?!\d)|[;:!?。；！？：)）\]\n]|\s(?:but|however|although)\s")
_LIST = re.compile(r"\s*(?:,|、|，|/|\band\b|\bor\b|和|及|或)\s*", re.IGNORECASE)
_WORD = re.compile(r"\w[\w'’-]*")
_DETERMINERS = ("a", "an", "the", "his", "her", "their", "any", "some", "all", "most")
_NUMBER = re.compile(r"[<>≤≥]?=?\s*\d+(?:[.,]\d+)*")
_FLAG = re.compile(r"\((critical (?:high|low))\)")
_SPAN = re.compile(r"\b([A-Z]+)=(.*?)(?=; [A-Z]+=|$)")  # the recogniser's spans: "DRUG=co-amoxiclav; REACTION=rash"
Entities = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Fact:
    """A critical fragment's finding by role, each role's text as the fragment writes it (a result's flag and a
    gene's CPIC drugs are the readers' words): `kind` allergy | adr | pathology | genetic | result."""

    kind: str
    entities: Entities
    also: tuple[Fact, ...] = ()  # what the same text states of a kind read with it (a tumour's genetics)

    def line(self) -> str:
        """One line holding every entity's text verbatim: "allergy: penicillin → anaphylaxis (severe)"."""
        return "; ".join([f"{_HEADS[self.kind]}: {_RENDER[self.kind](self.entities)}",
                          *(fact.line() for fact in self.also)])


def read_fact(text: str, decision: TierDecision) -> Fact | None:
    """The fact a tier decision's fragment states, or None when its kind has no fact or its essential role cannot
    be read. Memoised on (text, rule, finding): the packer asks for each critical fragment on every pack."""
    return _read(text, decision.rule_id, decision.finding, decision.critical)


@lru_cache(maxsize=4096)
def _read(text: str, rule_id: str, finding: str, critical: bool) -> Fact | None:
    kind = fact_kind(rule_id, critical)
    if not kind:
        return None
    read = _Text(without_instructions(text))
    entities = _READERS[kind](read, rule_id, finding)
    if not entities:
        return None
    also = [Fact(k, tuple(e)) for k in _READ_WITH.get(kind, ()) if (e := _READERS[k](read, rule_id, finding))
            and any(role in _ESSENTIAL[k] for role, _ in e)]
    return Fact(kind, tuple(entities), tuple(also))


def fact_kind(rule_id: str, critical: bool = False) -> str:
    """The kind of fact a decision's rule states (facts.toml [kinds]), "" for none; a critical decision whose rule
    the table does not name is a result (a possible critical fact states nothing)."""
    kind = next((k for k, pattern in grammar().kinds if pattern.search(rule_id)), "")
    return kind or ("result" if critical and not rule_id.startswith("possible_critical.") else "")


# --------------------------------------------------------------------------- the text as written and as read
class _Text:
    """A text as written and as the shared readers read it (NFKC, lower case), with where each read character
    stands in the written text, so that what a reader finds is given back in the fragment's own words."""

    def __init__(self, text: str) -> None:
        self.text = text
        pieces: list[str] = []
        self.index: list[int] = []  # read position -> written position
        self.at: list[int] = []  # written position -> read position
        for i, char in enumerate(text):
            piece = unicodedata.normalize("NFKC", char).lower()
            self.at.append(len(self.index))
            pieces.append(piece)
            self.index.extend([i] * len(piece))
        self.at.append(len(self.index))
        self.read = "".join(pieces)
        self.whole = unicodedata.normalize("NFKC", text).lower()  # what the readers' spans index

    def find(self, phrase: str, near: int = 0) -> Span | None:
        """Where a reader's phrase is written: the occurrence nearest `near` (a position of the read text)."""
        phrase = unicodedata.normalize("NFKC", phrase).lower().strip()
        starts = [m.start() for m in re.finditer(re.escape(phrase), self.read)] if phrase else []
        if not starts:
            return None
        start = min(starts, key=lambda s: abs(s - near))
        return self.index[start], self.index[start + len(phrase) - 1] + 1

    def said(self, span: Span) -> str:
        return self.text[span[0]:span[1]]

    def taken_back(self, spans: Sequence[Span], entry: bool = False) -> list[str]:
        """Per written span, the words of the shared negation grammar that deny or take it back ('' if none)."""
        read = [(self.at[a], self.at[b]) for a, b in spans]
        return negation().taken_back(self.read, read, entry) if read else []


def _whole_words(text: str, span: Span) -> bool:
    """A Latin span begins and ends at word boundaries (a recogniser's "farction" is no reaction)."""
    a, b = span

    def latin(i: int) -> bool:
        return 0 <= i < len(text) and text[i].isascii() and text[i].isalnum()
    return not (latin(a - 1) and latin(a)) and not (latin(b) and latin(b - 1))


# --------------------------------------------------------------------------- allergy and ADR
def _finding_pairs(finding: str) -> list[tuple[str, str]]:
    """The (drug, reaction) pairs of an ADR rule's finding ("drug=amoxicillin; reaction=urticaria; serious")."""
    pairs, drug = [], ""
    for part in finding.split("; "):
        key, _, value = part.partition("=")
        if key == "drug":
            drug = value
        elif key == "reaction" and drug:
            pairs.append((drug, value))
            drug = ""
    return pairs


def _model_spans(finding: str, kind: str) -> list[str]:
    """The recogniser's spans of one type in a decision's finding ("DRUG=co-amoxiclav; REACTION=rash")."""
    return [m.group(2).strip() for m in _SPAN.finditer(finding) if m.group(1) == kind and m.group(2).strip()]


def _generic(word: str) -> bool:
    """A word the drug readers take for a drug that names none: "medication", "antibiotic", "药物" (a class such as
    "penicillins" or "sulfa" names the allergen, and stays)."""
    lowered = word.lower().strip()
    return lowered in vocabulary().en_generic or lowered in grammar().categories \
        or lowered in terms().chinese_general or (len(lowered) == 1 and bool(CJK.match(lowered)))  # 药


def _drug_as_written(t: _Text, drug: str) -> Span | None:
    """Where a reader's drug is written; a Chinese one without the lead words read with it ("对青霉素" -> 青霉素)."""
    span = t.find(drug)
    if span is None or not CJK.search(drug):
        return span
    lead = grammar().lead.match(t.said(span))
    return (span[0] + lead.end(), span[1]) if lead and lead.end() < span[1] - span[0] else span


def _pairs(t: _Text, finding: str) -> list[tuple[Span, Span | None]]:
    """(drug, reaction) as written: the rule's finding, else the ADR reader's, else the recogniser's spans."""
    pairs = _finding_pairs(finding) or [(m.drug, m.reaction) for m in adr_in(t.text)]
    if not pairs:
        drugs, reactions = _model_spans(finding, "DRUG"), _model_spans(finding, "REACTION")
        pairs = [(d, r) for d in drugs for r in reactions or [""]]
    found: list[tuple[Span, Span | None]] = []
    for drug, reaction in pairs:
        where = _drug_as_written(t, drug) if not _generic(drug) else None
        if where is not None and _whole_words(t.text, where):
            said = t.find(reaction, t.at[where[0]]) if reaction else None
            found.append((where, said if said and _whole_words(t.text, said) else None))
    return found


def _adr(t: _Text, rule_id: str, finding: str) -> list[tuple[str, str]]:
    """The drugs of the reader's (drug, reaction) pairs, each with every reaction its statement gives it (the
    pair's reaction may be the generic "reaction" of "an anaphylactic reaction with low blood pressure")."""
    if allergy_taken_back(t.text):
        return []
    pairs = [(d, r) for d, r in _pairs(t, finding) if r is not None]
    drugs = [*dict.fromkeys(d for d, _ in pairs)]
    owned: list[list[Span]] = [[r for d, r in pairs if d == drug] for drug in drugs]
    for reaction in _reactions(t, drugs):
        owner = _owner(t.text, reaction, drugs)
        if owner is not None and not any(overlap(reaction, r) for r in owned[owner]):
            owned[owner].append(reaction)
    return _grouped(t, drugs, owned, "drug")


def _allergy(t: _Text, rule_id: str, finding: str) -> list[tuple[str, str]]:
    entry = bool(grammar().entries.search(rule_id))
    if allergy_taken_back(t.text, entry) or _unread_allergy(t.text):
        return []
    named = [d for d, _ in _pairs(t, finding)]
    named += [s for s in _substances(t.text) if not any(overlap(s, n) for n in named)]
    named += [s for s in (_entry_head(t.text) if entry else []) if not any(overlap(s, n) for n in named)]
    distinct = sorted(set(named))
    named = [s for s, back in zip(distinct, t.taken_back(distinct, entry), strict=True) if not back]
    if not named:
        return []
    owned: list[list[Span]] = [[] for _ in named]
    for reaction in _reactions(t, named):
        owner = _owner(t.text, reaction, named)
        if owner is not None:
            owned[owner].append(reaction)
    return _grouped(t, named, owned, "")


_PRODUCT_WORDS = 8  # a list item of up to this many words and no function word is one substance's name


def _unread_allergy(text: str) -> bool:
    """Whether an allergy word opens a list the grammar reads no substance from ("Drug allergy to <a name no
    reader knows>"): then a fact line would drop that allergy, so the fragment gets none."""
    for match in grammar().after.finditer(text):
        stop = _LIST_END.search(text, match.end())
        if not _listed(text, match.end(), stop.start() if stop else len(text)):
            return True
    return False


def _substances(text: str) -> list[Span]:
    """The substances the allergy grammar names: a list after an allergy word, the words right before one, or
    what a Chinese allergy names between 对 and 过敏."""
    g, found = grammar(), []
    after = list(g.after.finditer(text))
    for match in after:
        stop = _LIST_END.search(text, match.end())
        found += _listed(text, match.end(), stop.start() if stop else len(text))
    for match in g.before.finditer(text):
        if not any(a.start() == match.start() for a in after) and not _modifies_drug(text, match.end()):
            found += _preceding(text, match.start())
    for match in g.between.finditer(text):
        found += _listed(text, match.start("substance"), match.end("substance"))
    return unique(found)


def _modifies_drug(text: str, end: int) -> bool:
    """An allergy word before a drug word names a drug for allergies ("allergy medicine"), not an allergy."""
    following = _WORD.match(text, end + 1) if text[end:end + 1] == " " else None
    return following is not None and (following.group().lower() in vocabulary().en_generic
                                      or following.group().lower() in terms().general)


def _listed(text: str, start: int, end: int) -> list[Span]:
    """The items of a list of substances ("peanuts, dust, and pollen"); the list ends at an item that opens with a
    function word ("penicillin, which caused hives") or goes on past its substance ("aspirin resulting in ...")."""
    items, at = [], start
    for separator in [*_LIST.finditer(text, start, end), None]:
        item = _item(text, at, separator.start() if separator else end)
        if item is None:
            break
        items += item[0]
        if separator is None or item[1]:
            break
        at = separator.end()
    return [s for s in items if text[s[0]:s[1]].lower() not in grammar().categories]


def _item(text: str, start: int, end: int) -> tuple[list[Span], bool] | None:
    """A list item as substances: without its determiners, Chinese lead words or a bracketed remark; a longer item
    ("aspirin resulting in GI upset") gives the drugs it names, and ends the list (True); None when it opens with a
    function word."""
    g = grammar()
    piece = re.split(r"[(（\[]", text[start:end], maxsplit=1)[0]
    words = list(_WORD.finditer(piece))
    while words and words[0].group().lower() in _DETERMINERS:
        words = words[1:]
    if words and words[0].group().lower() in g.function_words:
        return None
    if not words:
        return [], False
    first, last = start + words[0].start(), start + words[-1].end()
    if lead := g.lead.match(text, first, last):
        first = lead.end()
    worded = any(w.group().lower() in g.function_words for w in words)
    if worded or len(words) > 4:
        read = unicodedata.normalize("NFKC", text[first:last]).lower()
        drugs = [(first + d.start, first + d.end) for d in drug_spans(read) if not _generic(d.text)
                 and len(read) == last - first]
        if drugs or worded or len(words) > _PRODUCT_WORDS:
            return drugs, True
    return ([(first, last)] if last > first else []), False  # a product's name: "Heel sarsaparilla ... granule"


def _preceding(text: str, at: int) -> list[Span]:
    """The substance written right before an allergy word: up to three words back to a function, severity or
    category word ("a severe peanut allergy"), or the Chinese run before 过敏 without its lead words."""
    g = grammar()
    if at and CJK.match(text[at - 1]):
        run = re.search(r"[\u4e00-\u9fffA-Za-z0-9\-]{1,12}$", text[:at])
        item = _item(text, run.start(), at) if run else None
        return [s for s in (item[0] if item else []) if text[s[0]:s[1]] not in g.categories]
    kept: list[re.Match[str]] = []
    for word in reversed(list(_WORD.finditer(text, max(0, at - 60), at))):
        lowered = word.group().lower()
        if text[word.end():kept[0].start() if kept else at].strip() or len(kept) == 3 \
                or lowered in g.function_words or lowered in g.categories or g.severity.fullmatch(lowered) \
                or lowered.isdigit():
            break
        kept.insert(0, word)
    return [(kept[0].start(), kept[-1].end())] if kept else []


def _entry_head(text: str) -> list[Span]:
    """An allergy entry's head ("Penicillin - hives", "Sulfa and trimethoprim.", "Peanuts cause a severe reaction"):
    its substances, before any mark or the ADR grammar's link to a reaction."""
    stop = re.search(r"[:：;；(（\-–—.]", text)
    end = stop.start() if stop else len(text)
    link = vocabulary().drug_then_reaction.search(text.lower(), 0, end)
    return [s for s in _listed(text, 0, link.start() if link else end) if not _generic(text[s[0]:s[1]])]


def _reactions(t: _Text, substances: Sequence[Span]) -> list[Span]:
    """The reactions the reaction vocabulary finds, as written, outside the substances and the allergy's own
    words, not taken back; of nested ones the longest."""
    g, found = grammar(), []
    for span, _ in reaction_spans(t.whole):
        where = t.find(span.text, span.start)
        if where and not any(overlap(where, s) for s in substances) and t.said(where).lower() not in g.not_reactions:
            found.append(where)
    found = [r for r in found if not any(o != r and o[0] <= r[0] and r[1] <= o[1] for o in found)]
    found = sorted(set(found))
    return [r for r, back in zip(found, t.taken_back(found), strict=True) if not back]


def _owner(text: str, reaction: Span, substances: Sequence[Span]) -> int | None:
    """The substance a reaction belongs to: the nearest one before it in its sentence within REACH characters
    ("Sulfa caused blisters"), else one after it that the ADR grammar links it to ("hives after cefuroxime")."""
    bounds = _statement(text, reaction[0])
    before = [i for i, s in enumerate(substances) if bounds[0] <= s[0] and s[1] <= reaction[0]
              and reaction[0] - s[1] <= REACH]
    if before:
        return max(before, key=lambda i: substances[i][1])
    link = vocabulary().reaction_then_drug
    after = [i for i, s in enumerate(substances) if reaction[1] <= s[0] < bounds[1]
             and link.search(text[reaction[1]:s[0]].lower())]
    return min(after, key=lambda i: substances[i][0]) if after else None


def _grouped(t: _Text, substances: Sequence[Span], reactions: Sequence[Sequence[Span]],
             role: str) -> list[tuple[str, str]]:
    """Entities in groups (substances, their reactions, the severity written nearest): the groups with a reaction
    or a severity first, those without last (one group: "dust, pollen"); `role` "" picks drug or allergen."""
    severities = [m.span() for m in grammar().severity.finditer(t.text)]
    severity: dict[int, Span] = {}
    for span in severities:
        owner = _nearest(t.text, span, substances)
        if owner is not None and owner not in severity:
            severity[owner] = span
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, owned in enumerate(reactions):
        said = [*dict.fromkeys(t.said(r) for r in sorted(owned))]
        groups.setdefault((*said, *([t.said(severity[i])] if i in severity else [])), []).append(i)
    entities: list[tuple[str, str]] = []
    for key, members in sorted(groups.items(), key=lambda item: (not item[0], min(item[1]))):
        named = dict.fromkeys(t.said(substances[i]) for i in members)
        entities += [(role or _substance_role(s), s) for s in named]
        severe = {t.said(severity[i]) for i in members if i in severity}
        entities += [("severity" if said in severe else "reaction", said) for said in key]
    return entities


def _nearest(text: str, span: Span, owners: Sequence[Span]) -> int | None:
    """The owner a severity word qualifies: the nearest in its sentence, the one after it on a tie (an adjective
    stands before its noun: "a severe peanut allergy")."""
    bounds = _statement(text, span[0])
    inside = [i for i, (a, _) in enumerate(owners) if bounds[0] <= a < bounds[1]]
    return min(inside, key=lambda i: (min(abs(span[0] - owners[i][1]), abs(owners[i][0] - span[1])),
                                      owners[i][0] < span[0]), default=None)


def _statement(text: str, at: int) -> Span:
    """The sentence around `at`, semicolons included: an allergy and its reaction are often written as two clauses
    of one statement ("allergy to penicillin; reaction: throat swelling")."""
    start = max((m.end() for m in _STATEMENT.finditer(text, 0, at)), default=0)
    stop = _STATEMENT.search(text, at)
    return start, stop.start() if stop else len(text)


def _substance_role(substance: str) -> str:
    """"drug" when a drug reader names a drug in the substance, else "allergen" (a food, venom, latex)."""
    read = unicodedata.normalize("NFKC", substance).lower()
    return "drug" if any(not _generic(d.text) for d in drug_spans(read)) else "allergen"


# --------------------------------------------------------------------------- results and genetics
def _result(t: _Text, rule_id: str, finding: str) -> list[tuple[str, str]]:
    mentions = [m for m in results_in(t.text) if m.critical]
    if not mentions:  # the recogniser's critical result: the results its analyte spans name
        named = [t.find(a) for a in _model_spans(finding, "ANALYTE")]
        mentions = [m for m in results_in(t.text) if any(s and overlap(s, (m.start, m.end)) for s in named)]
    entities: list[tuple[str, str]] = []
    for m in mentions:
        written = t.text[m.start:m.end]
        value = next((n for n in _NUMBER.finditer(written) if _value_of(n.group()) == m.value), None)
        analyte = _analyte_as_written(written[:value.start()]) if value else ""
        if value is None or not analyte:
            continue
        entities += [("analyte", analyte), ("value", value.group().strip())]
        unit = written[value.end():].strip(" |")
        entities += [("unit", unit)] if m.unit and unit else []
        flag = _FLAG.search(m.critical)
        entities += [("flag", flag.group(1))] if flag else []
    return entities


def _value_of(number: str) -> float | None:
    digits = number.lstrip("<>≤≥= ")
    thousands = re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", digits)
    try:
        return float(digits.replace(",", "") if thousands else digits.replace(",", "."))
    except ValueError:
        return None


def _analyte_as_written(head: str) -> str:
    """The analyte as written at the start of a result ("platelet count" of "platelet count of 20,000"): the
    longest name analytes.toml knows, else the words before the value."""
    lowered = head.lower()
    name = next((s for s in _surfaces() if lowered.startswith(s.lower())), "")
    return head[:len(name)] if name else head.strip(" \t:=|：")


@lru_cache(maxsize=1)
def _surfaces() -> tuple[str, ...]:
    """Every name of an analyte in analytes.toml, longest first."""
    tables = bundled().built((ANALYTES, CRITICAL), result_tables, as_files=True)
    return tuple(sorted((s for s, v in tables.surfaces.items() if v.analyte is not None), key=len, reverse=True))


def _genetic(t: _Text, rule_id: str, finding: str) -> list[tuple[str, str]]:
    cues = gene_vocabulary().grammar.cues
    entities: list[tuple[str, str]] = []
    for m in genes_in(t.text):
        if not m.gene:
            continue
        parts = [(c.lastgroup or "", c.group().strip()) for c in cues.finditer(m.variant)]
        if "".join(p for _, p in parts).replace(" ", "") != m.variant.replace(" ", ""):  # "*57:01": one notation
            parts = [("", m.variant)] if m.variant in t.text else parts
        entities.append(("gene", _gene_as_written(t.text[m.start:m.end], m.gene)))
        entities += [("phenotype" if k == "phenotype" else "variant", p) for k, p in parts if p and p in t.text]
        entities += [("drug", d) for d in m.drugs[:DRUGS_SHOWN]]
        entities += [("more", f"+{len(m.drugs) - DRUGS_SHOWN} more")] if len(m.drugs) > DRUGS_SHOWN else []
    return entities


def _gene_as_written(span: str, symbol: str) -> str:
    """The gene as the text writes it ("HER2" for ERBB2), else its approved symbol."""
    vocab = gene_vocabulary()
    for token in re.finditer(r"[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z0-9]+)*", span):
        if token.group() == symbol or vocab.gene(token.group()) == symbol:
            return token.group()
    return symbol


def _pathology(t: _Text, rule_id: str, finding: str) -> list[tuple[str, str]]:
    return [(role, t.said(span)) for role, span in pathology_roles(t.text)]


# --------------------------------------------------------------------------- rendering
def _groups(entities: Entities, opening: Sequence[str]) -> list[list[tuple[str, str]]]:
    """The entities cut where an opening role follows another role: one group per drug list, result, gene."""
    groups: list[list[tuple[str, str]]] = []
    for role, said in entities:
        if not groups or (role in opening and groups[-1][-1][0] not in opening):
            groups.append([])
        groups[-1].append((role, said))
    return groups


def _of(group: Sequence[tuple[str, str]], *roles: str) -> list[str]:
    return [said for role, said in group if role in roles]


def _reaction_line(entities: Entities) -> str:
    out = []
    for group in _groups(entities, _SUBSTANCE):
        reactions = _of(group, "reaction")
        out.append(", ".join(_of(group, *_SUBSTANCE)) + (f" → {', '.join(reactions)}" if reactions else "")
                   + "".join(f" ({s})" for s in _of(group, "severity")))
    return "; ".join(out)


def _result_line(entities: Entities) -> str:
    return "; ".join(" ".join(_of(g, "analyte", "value", "unit")) + "".join(f" ({f})" for f in _of(g, "flag"))
                     for g in _groups(entities, ("analyte",)))


def _genetic_line(entities: Entities) -> str:
    out = []
    for group in _groups(entities, ("gene",)):
        variants, drugs = _of(group, "variant"), _of(group, "drug")
        named = [*(g for g in _of(group, "gene") if not any(g in v for v in variants)), *variants]
        out.append(" ".join(named) + "".join(f" ({p})" for p in _of(group, "phenotype"))
                   + (f"; affects {', '.join(drugs)}" if drugs else "") + "".join(f" {m}" for m in _of(group, "more")))
    return "; ".join(out)


def _pathology_line(entities: Entities) -> str:
    """"specimen: diagnosis, grade, stage, margins, biomarkers", each piece once (one held in another is not
    repeated: the grade in "moderately differentiated adenocarcinoma")."""
    pieces = [*dict.fromkeys(said for role, said in entities if role != "specimen")]
    kept = [p for p in pieces if not any(p != q and p in q for q in pieces)]
    specimen = _of(entities, "specimen")
    return (f"{specimen[0]}: " if specimen else "") + ", ".join(kept)


_READ_WITH = {"pathology": ("genetic",), "genetic": ("pathology",)}  # a tumour report states both
_ESSENTIAL = {"pathology": ("diagnosis",), "genetic": ("gene",)}  # what makes the kind read with it worth a line
_READERS: Mapping[str, Callable[[_Text, str, str], list[tuple[str, str]]]] = {
    "allergy": _allergy, "adr": _adr, "result": _result, "genetic": _genetic, "pathology": _pathology}
_RENDER: Mapping[str, Callable[[Entities], str]] = {
    "allergy": _reaction_line, "adr": _reaction_line, "result": _result_line, "genetic": _genetic_line,
    "pathology": _pathology_line}
