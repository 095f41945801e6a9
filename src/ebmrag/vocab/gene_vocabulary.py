"""The gene vocabulary read from its three rule files: the HGNC symbols and the written forms that name one gene
alone (rules/genes/hgnc_symbols.txt), CPIC's gene-drug pairs (cpic_pairs.toml) and the result words in English
and Chinese (grammar.toml), compiled with the notations of `variant_notation` into one `GeneVocabulary`.

Why apart from `genes`: reading and checking the files is one job (a form that names two genes, a CPIC gene that
is no HGNC symbol, a result word that holds no anchor: a `ConfigError` at start-up), recognising results in a text
another. The three files are declared with the rules loader, so `RuleBook.check()` builds the vocabulary at
start-up: one dictionary of written forms looked up per token, one regex of cues, built once. `genes` re-exports
the public names, so importers read them all from there.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.rules import FOLDER, RuleFile, rule_file
from ebmrag.vocab._files import language_list, read_file, versioned
from ebmrag.vocab.variant_notation import NOTATION_HINT, notation_patterns

SYMBOLS, PAIRS, GRAMMAR = "genes/hgnc_symbols.txt", "genes/cpic_pairs.toml", "genes/grammar.toml"
SYMBOLS_PATH, PAIRS_PATH, GRAMMAR_PATH = (FOLDER / name for name in (SYMBOLS, PAIRS, GRAMMAR))
ACTIONABLE = ("A", "A/B", "B")  # CPIC levels whose genotype should change prescribing

WORD_KINDS = ("classification", "biomarker", "zygosity", "phenotype", "genetic", "fusion", "ambiguous", "status")
_LISTS = (*WORD_KINDS, "surgical", "context", "before", "filler", "sought", "anchors")
_ANCHORED = ("zygosity", "phenotype", "classification", "biomarker")  # word kinds that are results on their own
_ALNUM = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_ALNUM_DIGIT = re.compile(r"(?<![a-z])[a-z]+\d[a-z0-9]*")  # a lower-cased word holding a digit
_DIGIT = re.compile(r"\d")


@dataclass(frozen=True)
class Grammar:
    """grammar.toml compiled: `cues` finds every notation and word at once (its group names the kind); the rest
    are the word lists that decide whether a cue reaches a gene."""

    cues: re.Pattern[str]
    surgical: re.Pattern[str]
    context: re.Pattern[str]
    before: re.Pattern[str]
    filler: re.Pattern[str]
    chinese_before: re.Pattern[str]
    sought: re.Pattern[str]  # ends a text just before a word that is being looked for, not found
    anchors: tuple[str, ...]  # lower case: one of them is in every result word that names no gene
    notation: re.Pattern[str]  # the notations that are results on their own (a text's quick test)


@dataclass(frozen=True)
class GeneVocabulary:
    """`written`: every form a text may write -> its approved symbol (case as written); `folded`: the lower case of
    forms holding a digit -> approved symbol; `families`: stem -> members; `stems`: every stem two symbols
    share (ABL of ABL1 and ABL2), read only as a fusion's partner; `pairs`: gene -> CPIC level -> drugs;
    `source`: the three files' texts, for the fingerprint of results computed with them."""

    written: Mapping[str, str]
    folded: Mapping[str, str]
    families: Mapping[str, tuple[str, ...]]
    stems: frozenset[str]
    pairs: Mapping[str, Mapping[str, tuple[str, ...]]]
    grammar: Grammar
    source: str = field(repr=False, default="")
    triggers: frozenset[str] = field(repr=False, default=frozenset())  # a written form's longest word, as written
    folded_triggers: frozenset[str] = field(repr=False, default=frozenset())  # ... lower case, those with a digit

    def __post_init__(self) -> None:
        words = {max(_ALNUM.findall(form), key=len) for form in [*self.written, *self.stems, "HLA"]}
        object.__setattr__(self, "triggers", frozenset(words))
        object.__setattr__(self, "folded_triggers", frozenset(w.lower() for w in words if _DIGIT.search(w)))

    def worth_reading(self, text: str) -> bool:
        """A quick test, a few microseconds: may the text state a result? No when it writes no word of a gene, no
        anchor of a result word and no notation; the grammar is read only where it may."""
        if not self.triggers.isdisjoint(_ALNUM.findall(text)):
            return True
        if not self.folded_triggers.isdisjoint(_ALNUM_DIGIT.findall(text.lower())):
            return True
        lowered = text.lower()
        return any(anchor in lowered for anchor in self.grammar.anchors) or (
            NOTATION_HINT.search(text) is not None and self.grammar.notation.search(text) is not None)

    @classmethod
    def of(cls, symbols: RuleFile, pairs: RuleFile, grammar: RuleFile) -> GeneVocabulary:
        written, folded, families, stems = _symbols(symbols.table, symbols.path)
        table = _pairs(pairs, written)
        for gene, entry in versioned(pairs, "CPIC pairs")["genes"].items():
            if isinstance(entry.get("cpic_symbol"), str):
                written.setdefault(entry["cpic_symbol"], gene)
        hla = sorted((s[4:] for s in written.values() if s.startswith("HLA-")), key=len, reverse=True)
        return cls(written, folded, families, stems, table, _grammar(grammar, hla),
                   symbols.source + pairs.source + grammar.source)

    @classmethod
    def from_files(cls, symbols: Path = SYMBOLS_PATH, pairs: Path = PAIRS_PATH,
                   grammar: Path = GRAMMAR_PATH) -> GeneVocabulary:
        """The vocabulary of other files (a test's, the bench's while it regenerates the tables)."""
        lines = Path(symbols).read_text(encoding="utf-8").splitlines()
        table = tuple(s for line in lines if (s := line.strip()) and not s.startswith("#"))
        return cls.of(RuleFile(Path(symbols), table, "\n".join(lines)), read_file(pairs, "CPIC pairs"),
                      read_file(grammar, "gene grammar"))

    def drugs(self, gene: str) -> tuple[str, ...]:
        """The drugs CPIC gives a level A or B recommendation for, for this gene (each partner of a fusion)."""
        found = [drug for part in gene.split("::") for level in ACTIONABLE
                 for drug in self.pairs.get(part, {}).get(level, ())]
        return tuple(dict.fromkeys(found))

    def gene(self, token: str) -> str | None:
        """The approved symbol a written form names, or None."""
        if token in self.written:
            return self.written[token]
        if len(token) >= 4 and any(c.isdigit() for c in token):
            return self.folded.get(token.lower())
        return None


def _symbols(lines: Any, path: Path
             ) -> tuple[dict[str, str], dict[str, str], dict[str, tuple[str, ...]], frozenset[str]]:
    """The written forms, their folded forms, the families (stems of four letters or more shared by two to four
    symbols) and every stem shared by two symbols or more (a fusion partner may be written so: BCR-ABL)."""
    if not isinstance(lines, tuple) or not lines:
        raise ConfigError(f"gene symbols {path}: no symbols")
    written: dict[str, str] = {}
    for line in lines:
        symbol, *forms = line.split()
        written[symbol] = symbol
        for form in forms:
            if form in written and written[form] != symbol:
                raise ConfigError(f"gene symbols {path}: {form!r} names both {written[form]} and {symbol}")
            written[form] = symbol
    lowered: dict[str, set[str]] = defaultdict(set)
    for form, symbol in written.items():
        if len(form) >= 4 and any(c.isdigit() for c in form):
            lowered[form.lower()].add(symbol)
    folded = {form: next(iter(symbols)) for form, symbols in lowered.items() if len(symbols) == 1}
    grouped: dict[str, list[str]] = defaultdict(list)
    for symbol in set(written.values()):
        if match := re.fullmatch(r"([A-Z]{3,})\d+", symbol):
            grouped[match.group(1)].append(symbol)
    stems = {stem: members for stem, members in grouped.items() if len(members) >= 2 and stem not in written}
    families = {stem: tuple(sorted(members)) for stem, members in stems.items() if len(stem) >= 4 and len(members) <= 4}
    return written, folded, families, frozenset(stems)


def _pairs(file: RuleFile, written: Mapping[str, str]) -> dict[str, dict[str, tuple[str, ...]]]:
    genes = versioned(file, "CPIC pairs").get("genes")
    if not isinstance(genes, Mapping):
        raise ConfigError(f"CPIC pairs {file.path}: [genes] must be a table of gene = {{ level = [drugs] }}")
    table: dict[str, dict[str, tuple[str, ...]]] = {}
    for gene, levels in genes.items():
        if gene not in written:
            raise ConfigError(f"CPIC pairs {file.path}: {gene!r} is not a symbol of {SYMBOLS}")
        table[gene] = {level: tuple(drugs) for level, drugs in levels.items() if level != "cpic_symbol"}
    return table


def _either(english: Sequence[str], chinese: Sequence[str]) -> str:
    """English fragments as whole words, case-insensitive; Chinese ones anywhere."""
    parts = [rf"(?<![A-Za-z0-9])(?i:{'|'.join(english)})(?![A-Za-z0-9])"] if english else []
    return "|".join(parts + ([f"(?:{'|'.join(chinese)})"] if chinese else []))


def _grammar(file: RuleFile, hla_loci: Sequence[str]) -> Grammar:
    raw = versioned(file, "gene grammar")
    where = f"gene grammar {file.path}"
    lists = {(language, key): language_list(raw, language, key, where, "regex fragments")
             for language in ("english", "chinese") for key in _LISTS if (language, key) != ("chinese", "filler")}
    notations = notation_patterns(hla_loci)
    words = {kind: _either(lists["english", kind], lists["chinese", kind]) for kind in WORD_KINDS}
    cues = "|".join(f"(?P<{kind}>{pattern})" for kind, pattern in {**notations, **words}.items())
    return Grammar(
        re.compile(cues), re.compile(_either(lists["english", "surgical"], lists["chinese", "surgical"])),
        re.compile(_either(lists["english", "context"], lists["chinese", "context"])),
        re.compile(rf"\s*(?:(?i:{'|'.join(lists['english', 'before'])})\s+)(?:(?i:the|a|an|both|his|her|their)\s+)?"),
        re.compile(_either(lists["english", "filler"], ())),
        re.compile(rf"(?:{'|'.join(lists['chinese', 'before'])})[\s：:]{{0,2}}"),
        re.compile(rf"(?:{_either(lists['english', 'sought'], lists['chinese', 'sought'])})\s*(?:(?i:the|a|an)\s+)?$"),
        _anchors(lists, file.path),
        re.compile("|".join(notations[kind] for kind in ("hgvs", "hla", "rsid", "diplotype", "exon", "karyotype",
                                                         "repeat", "protein"))),
    )


def _anchors(lists: Mapping[tuple[str, str], list[str]], path: Path) -> tuple[str, ...]:
    """The anchors, once every word that is a result on its own holds one (grammar.toml says why)."""
    anchors = tuple(a.lower() for language in ("english", "chinese") for a in lists[language, "anchors"])
    for language in ("english", "chinese"):
        for kind in _ANCHORED:
            for entry in lists[language, kind]:
                if not any(anchor in entry.lower() for anchor in anchors):
                    raise ConfigError(f"gene grammar {path}: [{language}] {kind} entry {entry!r} holds no anchor")
    return anchors


@rule_file(SYMBOLS, PAIRS, GRAMMAR, as_files=True)
def vocabulary(symbols: RuleFile, pairs: RuleFile, grammar: RuleFile) -> GeneVocabulary:
    """The HGNC symbols, CPIC pairs and grammar, read and compiled once per book (default: the bundled one)."""
    return GeneVocabulary.of(symbols, pairs, grammar)
