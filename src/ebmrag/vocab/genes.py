"""Genetic and pharmacogenomic results in free text: which gene, which variant, which drugs it affects (CPIC).

A result is recognised by a grammar, not by a list of famous genes: any HGNC approved symbol of a human gene
(rules/genes/hgnc_symbols.txt, generated from HGNC's table with the written forms that name one gene alone: HER2
for ERBB2, p53 for TP53) counts when a variant notation or a result word stands beside it. The notations follow
their nomenclatures: HGVS (c./g./n./m./r. and p., three- or one-letter amino acids, del/dup/ins/fs/*), protein or
nucleotide changes written beside a gene (V600E, G12C, C677T, F508del), PharmVar star alleles and diplotypes
(CYP2C19*2/*17, "*1/*2"), WHO HLA alleles (HLA-B*57:01, HLA-B*5801), dbSNP rsIDs with their genotype, exons and
codons, ISCN karyotypes and chromosome bands (46,XY; t(9;22); del(5q); 1p/19q codeletion) and fusions written as
HGVS (EML4::ALK) or older hyphen and slash forms. The words are data (rules/genes/grammar.toml, English and
Chinese): mutations, rearrangements, zygosity, metaboliser phenotypes, ACMG classes, MSI/MMR/TMB.

Why the care: a symbol is often a word or an abbreviation too ("MET", "CAT", "SET", "AR", "PC", C5 the vertebra),
so a symbol alone never counts; a symbol of letters alone needs a word right beside it and nothing in a text
written in capitals, where case tells nothing; a one-letter-and-digit symbol (C5, F8) needs a notation of its
own; words that other medicine uses too (deletion, insertion, positive) count beside a symbol that holds a digit
or in a text about molecular testing; "fusion" beside a joint or the spine is an arthrodesis. Symbols are
compared case-sensitively, as HGNC writes them; a form holding a digit may be written in any case ("Brca1").
A gene family written without its member number (BRCA, NTRK, FGFR: a stem of four letters or more shared by two
to four symbols) counts as the family.

Each mention names the gene, the variant as written and, through CPIC's gene-drug table
(rules/genes/cpic_pairs.toml), the drugs with a level A or B recommendation for that gene. This module reads a
text; the notations' patterns are `variant_notation`'s and the three rule files are read and compiled, once per
book, by `gene_vocabulary`, whose public names (`vocabulary`, `GeneVocabulary`, the files' paths) are importable
from here too.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ebmrag.vocab.gene_vocabulary import (
    ACTIONABLE,
    GRAMMAR,
    GRAMMAR_PATH,
    PAIRS,
    PAIRS_PATH,
    SYMBOLS,
    SYMBOLS_PATH,
    WORD_KINDS,
    GeneVocabulary,
    Grammar,
    vocabulary,
)
from ebmrag.vocab.variant_notation import HLA_TYPE, TRANSCRIPT_GENE

__all__ = ["ACTIONABLE", "DETACHED", "GRAMMAR", "GRAMMAR_PATH", "MAX_GAP", "NOTATIONS", "PAIRS", "PAIRS_PATH",
           "SHOWN_DRUGS", "STANDALONE", "SYMBOLS", "SYMBOLS_PATH", "GeneMention", "GeneVocabulary", "Grammar",
           "gene_mentions", "vocabulary"]

SHOWN_DRUGS = 8  # drugs a description names before "+N more"
NOTATIONS = ("hgvs", "hla", "rsid", "diplotype", "star", "exon", "protein", "codon")
STANDALONE = frozenset({"hgvs", "hla", "rsid", "diplotype", "exon", "karyotype", "repeat", "biomarker",
                        "classification", "zygosity", "phenotype"})  # a result even when no gene is named
DETACHED = frozenset({"karyotype", "biomarker"})  # results that name no gene: never given one
_ADJECTIVES = ("genetic", "zygosity", "classification")  # may stand right before their gene
_TOKEN = re.compile(r"(?<![A-Za-z0-9*])[A-Za-z][A-Za-z0-9]*(?:(?:-|::|/)[A-Za-z0-9]+)*")
_SEPARATOR = re.compile(r"::|-|/")
_NUMBERED = re.compile(r"([A-Za-z]{2,}[0-9A-Za-z]*?)-(\d{1,2})")  # a symbol written with a hyphen before its number
_FUSION_NEXT = re.compile(r"\W*(?:fusion|rearrang|transcript|融合)")  # "BCR/ABL1 fusion": a slash that fuses
_BOUNDARY = re.compile(r"[;。；!?！？\n]|\.(?:\s|$)")
_WORD = re.compile(r"[A-Za-z0-9]+(?:['-][A-Za-z0-9]+)*")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_COORDINATION = re.compile(r"\s*(?:,|/|&|、|和|或|及|与)?\s*(?:(?:and|or)\s+)?", re.IGNORECASE)
_LOCATION = re.compile(r"(?<![A-Za-z0-9])(?:exon|intron|codon)s?\s?\d+(?![A-Za-z0-9])|\d+\s?号?外显子", re.IGNORECASE)
_LOWER = re.compile(r"[a-z]")
_LEVEL = re.compile(r"[A-Z]\d{1,2}")  # C5, F8: a vertebra, a lead, a stage as often as a gene
_CD_ANTIGEN = re.compile(r"CD\d+[A-Z]?")  # the protein flow cytometry and immunohistochemistry read
_NUCLEOTIDES = re.compile(r"[ACGT]{3,}")  # CAT, TACC: a DNA sequence as often as a gene ("TACC haplotype")
MAX_GAP = 60  # characters between a gene and its notation or word


@dataclass(frozen=True)
class GeneMention:
    """One genetic result: `gene` the HGNC approved symbol ("EML4::ALK" for a fusion, "BRCA" for a family, "" when
    the result names none: "MSI-high", "*1/*2"), `variant` the notations and words as written, `kind` what they
    are (the first notation's kind, else the first word's), `drugs` the CPIC level A/B drugs of the gene."""

    gene: str
    variant: str
    kind: str
    drugs: tuple[str, ...] = ()
    start: int = 0
    end: int = 0

    def describe(self) -> str:
        """"CYP2C19 *2/*17 (CPIC: amitriptyline, citalopram, ...)": what a tier decision's finding shows."""
        text = f"{self.gene} {self.variant}".strip()
        if not self.drugs:
            return text
        more = len(self.drugs) - SHOWN_DRUGS
        shown = ", ".join(self.drugs[:SHOWN_DRUGS]) + (f" +{more} more" if more > 0 else "")
        return f"{text} (CPIC: {shown})"


@dataclass(frozen=True)
class _Gene:
    """A gene as written in a text: `symbol` its approved symbol (or fusion, family, HLA type), `kind` "symbol",
    "alias", "listed" (BRCA1/2's 2), "family", "fusion" or "hla"."""

    symbol: str
    start: int
    end: int
    kind: str
    lettered: bool = False  # letters alone: also a word or an abbreviation
    notations_only: bool = False  # C5 (a vertebra, a lead, a stage too), CD28 (the protein flow cytometry reads)
    written: str = ""  # an HLA type as written after "HLA-" ("B27"), the start of its variant


@dataclass(frozen=True)
class _Cue:
    kind: str
    start: int
    end: int
    text: str
    gene: str = ""  # the gene a notation names itself (an HLA allele)



def gene_mentions(text: str, vocabulary_: GeneVocabulary | None = None) -> list[GeneMention]:
    """The genetic and pharmacogenomic results a text states, in order (module docstring)."""
    vocab = vocabulary_ or vocabulary()
    if not vocab.worth_reading(text):
        return []
    cues = _cues(text, vocab)
    if not cues:
        return []
    reading = _Reading(text, vocab.grammar, _genes(text, vocab, cues),
                       context=vocab.grammar.context.search(text) is not None,
                       capitals=not _LOWER.search(text) and not _CJK.search(text))
    attached: dict[int, list[_Cue]] = defaultdict(list)
    mentions = []
    for index, cue in enumerate(cues):
        owners = [] if cue.kind in DETACHED or cue.gene else reading.owners(cue)
        for owner in owners:
            attached[owner].append(cue)
        if not owners and (cue.kind in STANDALONE or _named_change(cue, cues[index + 1:])):
            mentions.append(GeneMention(cue.gene, cue.text, cue.kind, vocab.drugs(cue.gene), cue.start, cue.end))
    mentions += [_mention(reading.genes[owner], found, vocab) for owner, found in attached.items()]
    return sorted(mentions, key=lambda m: (m.start, m.gene))


def _mention(gene: _Gene, cues: Sequence[_Cue], vocab: GeneVocabulary) -> GeneMention:
    """A gene with its cues: the variant as written (an HLA type's own name first), the kind of its first
    notation (else of its first word), the gene's CPIC drugs."""
    kind = next((c.kind for c in cues if c.kind in NOTATIONS), cues[0].kind)
    variant = " ".join(dict.fromkeys([gene.written] * bool(gene.written) + [c.text for c in cues]))
    return GeneMention(gene.symbol, variant, kind, vocab.drugs(gene.symbol), min(gene.start, cues[0].start),
                       max(gene.end, cues[-1].end))


def _cues(text: str, vocab: GeneVocabulary) -> list[_Cue]:
    """Every notation and word of the grammar in the text, in order; not "fusion" where the text speaks of
    joints or the spine, nor a word that is being looked for; an HLA allele and an HGVS notation with a
    transcript's gene carry their gene."""
    grammar, found = vocab.grammar, []
    surgical = None
    for match in grammar.cues.finditer(text):
        kind = match.lastgroup or ""
        if kind == "fusion":
            surgical = bool(grammar.surgical.search(text)) if surgical is None else surgical
            if surgical:
                continue
        if kind in WORD_KINDS and grammar.sought.search(text, max(0, match.start() - 40), match.start()):
            continue
        written, gene = match.group().strip(), ""
        if kind == "hla":  # HLA-B*57:01: the gene HLA-B, the allele *57:01
            gene = f"HLA-{match.group('locus')}"
            written = ("*" if "*" in written else "") + text[match.end("locus"):match.end()].strip(" *")
        elif kind == "hgvs" and (named := TRANSCRIPT_GENE.search(written)):
            gene = vocab.gene(named.group(1)) or ""
        found.append(_Cue(kind, match.start(), match.end(), written, gene))
    return found


def _genes(text: str, vocab: GeneVocabulary, cues: Sequence[_Cue]) -> list[_Gene]:
    """Every gene a text writes outside its notations: symbols, written forms, families, fusions (A::B, A-B,
    A/B before a fusion word) and HLA types (HLA-B27, not its B27: an alias of another gene)."""
    genes = [gene for token in _TOKEN.finditer(text)
             for gene in _joined(text, token, _parts(token.group(), token.start()), vocab)]
    typed = [_Gene(vocab.written.get(f"HLA-{m.group(1)}", f"HLA-{m.group(1)}"), m.start(), m.end(), "hla",
                   written=m.group(1) + m.group(2)) for m in HLA_TYPE.finditer(text)]
    spans = [(c.start, c.end) for c in cues] + [(t.start, t.end) for t in typed]
    kept = [g for g in genes if not any(start <= g.start and g.end <= end for start, end in spans)]
    return sorted(kept + typed, key=lambda g: g.start)


def _parts(token: str, offset: int) -> list[tuple[str, int]]:
    """A token's parts between "-", "::" and "/", with their offsets."""
    pieces, at = [], 0
    for piece in _SEPARATOR.split(token):
        at = token.index(piece, at)
        pieces.append((piece, offset + at))
        at += len(piece)
    return pieces


def _named(part: str, start: int, vocab: GeneVocabulary) -> _Gene | None:
    symbol = vocab.gene(part)
    if symbol is not None:
        kind = "symbol" if symbol == part else "alias"
        return _Gene(symbol, start, start + len(part), kind, lettered=part.isalpha(), notations_only=bool(
            _LEVEL.fullmatch(part) or _CD_ANTIGEN.fullmatch(symbol) or _NUCLEOTIDES.fullmatch(part)))
    if part in vocab.families and not _NUCLEOTIDES.fullmatch(part):
        return _Gene(part, start, start + len(part), "family", lettered=True)
    return None


def _joined(text: str, token: re.Match[str], parts: list[tuple[str, int]], vocab: GeneVocabulary) -> list[_Gene]:
    """Parts of one token read together: a hyphenated symbol whole (HLA-B, NKX2-1, PD-L1, BRCA-2), "BRCA1/2" as
    BRCA1 and BRCA2, two genes joined by "::" or "-" (or "/" before a fusion word) as their fusion, two forms of
    one gene (ERBB2/HER2) as that gene."""
    whole = vocab.gene(token.group())
    if whole is None and (numbered := _NUMBERED.fullmatch(token.group())):
        whole = vocab.gene(numbered.group(1) + numbered.group(2))
    if whole is not None and len(parts) > 1:
        return [_Gene(whole, token.start(), token.end(), "symbol" if whole == token.group() else "alias",
                      lettered=token.group().replace("-", "").isalpha())]
    genes: list[_Gene] = []
    previous: _Gene | None = None  # the gene the previous part named
    for part, start in parts:
        gene = _named(part, start, vocab)
        member = _member(text, part, start, previous, vocab) if gene is None else None
        partner = gene or (None if member or previous is None else _partner(part, start, vocab))
        if previous and partner and _fused(text, token, text[previous.end:partner.start], previous, partner):
            genes[-1], previous = _Gene(f"{previous.symbol}::{partner.symbol}", previous.start, partner.end,
                                        "fusion"), None
            continue
        gene = gene or member
        if gene is not None and not (genes and genes[-1].symbol == gene.symbol):
            genes.append(gene)
        previous = gene
    return genes


def _member(text: str, part: str, start: int, previous: _Gene | None, vocab: GeneVocabulary) -> _Gene | None:
    """A family member written by its number after a slash (BRCA1/2, NTRK1/2/3): listed, never fused."""
    if previous is None or previous.kind != "symbol" or not part.isdigit() or text[start - 1] != "/":
        return None
    symbol = vocab.gene(re.sub(r"\d+$", "", previous.symbol) + part)
    return _Gene(symbol, start, start + len(part), "listed") if symbol else None


def _partner(part: str, start: int, vocab: GeneVocabulary) -> _Gene | None:
    """A fusion's second gene as clinicians write it: a stem (ABL) or a symbol in other case (RARa)."""
    if part in vocab.stems:
        return _Gene(part, start, start + len(part), "family", lettered=True)
    symbol = vocab.written.get(part.upper()) if len(part) >= 3 else None
    return _Gene(symbol, start, start + len(part), "symbol", lettered=part.isalpha()) if symbol else None


def _fused(text: str, token: re.Match[str], separator: str, left: _Gene, right: _Gene) -> bool:
    if left.notations_only or right.notations_only or left.symbol == right.symbol or "listed" in (left.kind,
                                                                                                   right.kind):
        return False
    if separator in ("::", "-"):
        return True
    return separator == "/" and _FUSION_NEXT.match(text[token.end():token.end() + 30].lower()) is not None


@dataclass(frozen=True)
class _Reading:
    """One text being read: its genes, and what decides which cue is whose (module docstring)."""

    text: str
    grammar: Grammar
    genes: Sequence[_Gene]
    context: bool  # the text is about molecular testing
    capitals: bool  # the text is written in capitals: case tells nothing

    def owners(self, cue: _Cue) -> list[int]:
        """The genes a cue belongs to: the nearest gene before it within reach, else the first after it across a
        preposition ("mutation in BRCA2", "检出EGFR") or right after an adjective ("mutant KRAS"), with the genes
        listed beside that one ("BRCA1 and BRCA2 mutations"; not "EGFR, KRAS G12C")."""
        listed = cue.kind in WORD_KINDS
        before = [i for i, g in enumerate(self.genes) if g.end <= cue.start]
        if before and self._reaches(self.genes[before[-1]], cue, self.text[self.genes[before[-1]].end:cue.start]):
            return self._listed(before[-1], step=-1) if listed else [before[-1]]
        after = next((i for i, g in enumerate(self.genes) if g.start >= cue.end), None)
        if cue.kind == "star" or after is None:
            return []
        gap = self.text[cue.end:self.genes[after].start]
        leads = (self.grammar.before.fullmatch(gap) or (cue.kind in _ADJECTIVES and gap.isspace())
                 or self.grammar.chinese_before.fullmatch(self.text[cue.start:self.genes[after].start]))
        if not leads or not self._eligible(self.genes[after], cue) or (cue.kind == "status" and not self.context):
            return []  # "positive for CDX-2, D2-40" is a stain; "positive for the JAK2 mutation" a result
        return self._listed(after, step=1) if listed else [after]

    def _listed(self, index: int, step: int) -> list[int]:
        found = [index]
        while 0 <= index + step < len(self.genes):
            near, far = sorted((self.genes[index], self.genes[index + step]), key=lambda g: g.start)
            if not _COORDINATION.fullmatch(self.text[near.end:far.start]):
                break
            index += step
            found.append(index)
        return found

    def _reaches(self, gene: _Gene, cue: _Cue, gap: str) -> bool:
        """Whether a cue after a gene is that gene's: in the same clause, close enough, one the gene may take."""
        if len(gap) > MAX_GAP or _BOUNDARY.search(gap) or not self._eligible(gene, cue):
            return False
        if cue.kind == "star":
            return gap in ("", " ")
        rest = self.grammar.filler.sub(" ", _LOCATION.sub(" ", self.grammar.cues.sub(" ", gap)))
        words = [w for w in _WORD.findall(rest) if w.lower() not in ("and", "or") and not w.isdigit()]
        if cue.kind in ("ambiguous", "status"):
            limit = 0
        elif cue.kind in NOTATIONS:
            limit = 3  # a variant notation is no English: "POLE exonuclease domain mutation (P286R)"
        else:
            limit = 1 if gene.lettered or gene.kind == "family" else 2
        return len(words) <= limit and len(_CJK.findall(rest)) <= 6

    def _stated(self, gene: _Gene) -> bool:
        """Whether a status right beside the gene is the gene's whatever the text ("JAK2 positive", "ROS1-positive",
        "HER2阳性"): a symbol holding a digit, a fusion, or a written form in capitals; not a word-like symbol
        ("HR-positive" is a hormone receptor) nor a protein's name (p53, Ki-67: immunohistochemistry)."""
        written = self.text[gene.start:gene.end]
        return (gene.kind in ("symbol", "fusion") or (gene.kind == "alias" and written == written.upper())) and not (
            gene.lettered or gene.notations_only)

    def _eligible(self, gene: _Gene, cue: _Cue) -> bool:
        """Which cues a gene may take: a vertebra-like or protein-named symbol, or a word-like one in a text in
        capitals, only notations; words of other medicine beside a symbol holding a digit or in a molecular text;
        a test's status in a molecular text, beside an HLA type or as `_stated` says; an HLA type no notation."""
        if gene.notations_only or (self.capitals and gene.lettered):
            return cue.kind in NOTATIONS and cue.kind != "codon"
        if cue.kind == "status":
            return self.context or gene.kind == "hla" or self._stated(gene)
        if cue.kind == "ambiguous":
            return self.context or gene.kind == "hla" or (gene.kind in ("symbol", "listed", "fusion")
                                                          and not gene.lettered)
        return gene.kind != "hla" or cue.kind not in NOTATIONS


def _named_change(cue: _Cue, later: Sequence[_Cue]) -> bool:
    """A protein change called a mutation with no gene named ("T790M mutation", "V600E-mutant")."""
    following = later[0] if later else None
    return (cue.kind == "protein" and following is not None and following.kind in ("genetic", "classification")
            and following.start - cue.end <= 1)
