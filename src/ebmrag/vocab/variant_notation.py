"""The variant notations of a genetic result as regexes, after their nomenclatures: HGVS (c./g./n./m./r. and p.,
three- or one-letter amino acids, del/dup/ins/fs/*), protein or nucleotide shorthand (V600E, F508del), PharmVar
star alleles and diplotypes, WHO HLA alleles and serotypes, dbSNP rsIDs with their genotype, exons and codons,
ISCN karyotypes and chromosome bands, nucleotide repeats.

Why a module of its own: these are the nomenclatures' grammars written in code (the result words beside them,
mutation or homozygous, are data in rules/genes/grammar.toml), long patterns that change when a nomenclature is
read more fully, and a different job from deciding which gene a notation belongs to (`genes`). `gene_vocabulary`
compiles `notation_patterns` with the grammar's words into the one regex of cues; `evidence.tiers` hashes this
file with the detector's code, so a change to a notation makes stored tier decisions stale.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# Notations, after their nomenclatures (HGVS, PharmVar, WHO HLA, dbSNP, ISCN); the words are in grammar.toml.
_AA = (r"(?:Ala|Arg|Asn|Asp|Cys|Gln|Glu|Gly|His|Ile|Leu|Lys|Met|Phe|Pro|Ser|Thr|Trp|Tyr|Val|Sec|Ter"
       r"|[ACDEFGHIKLMNPQRSTVWY*X])")
_POS = r"[-*]?\d+(?:[+-]\d+)?"
_DNA_CHANGE = r"(?:[ACGTUacgu]+>[ACGTUacgu]+|delins[ACGTN]*\d*|del[ACGTN]*\d*|dup[ACGTN]*\d*|ins[ACGTN]+\d*|inv\d*|=)"
_PROTEIN_CHANGE = (rf"(?:{_AA}\d+(?:_{_AA}\d+)?(?:delins{_AA}+|del|dup|ins{_AA}+|fs(?:{_AA}|\*)?\d*|ext\S*|{_AA}|=)"
                   rf"(?:fs(?:Ter|\*)\d*)?)")
_HGVS = (rf"(?<![A-Za-z0-9])(?:(?:N[MCGRP]|X[MR]|NC|LRG|ENS[TG])_?\d+(?:\.\d+)?(?:\([A-Za-z0-9-]+\))?:)?"
         rf"(?:[cgnmr]\.(?:\({_POS}(?:_{_POS})?\)|{_POS}(?:_{_POS})?){_DNA_CHANGE}|p\.(?:\({_PROTEIN_CHANGE}\)|{_PROTEIN_CHANGE}))")
_SHORTHAND = (rf"(?<![A-Za-z0-9.*/])(?:[Δ∆]\s?{_AA}\d+|delta ?F508|{_AA}\d{{1,5}}(?:_{_AA}\d{{1,5}})?"
              rf"(?:fs(?:\*\d+)?|delins[A-Z]+|del|dup|ins[A-Z]+|{_AA}))(?![A-Za-z0-9])")
_STAR = r"\*\d{1,3}[A-Z]?(?:\.\d{3})?(?:\s?[x×]\s?(?:\d|N))?"
_RSID = r"(?<![A-Za-z0-9])[Rr]s\d{3,12}(?:\s?[(\[]?[ACGT][;/]?[ACGT]?[)\]]?(?![A-Za-z0-9])|\s?[ACGT]>[ACGT])?"
_EXON = (r"(?<![A-Za-z0-9])(?i:ex(?:on)?s?\s?\d{1,2}(?:\s?(?:-|to|and|–)\s?\d{1,2})?\s?(?:in-frame\s)?"
         r"(?:deletions?|del|insertions?|ins|duplications?|dup|skipping|mutations?|alterations?|variants?|"
         r"substitutions?|indels?|delins)|\d{1,2}-?del|\d{1,2}-?ins)(?![A-Za-z0-9])"
         r"|(?:\d{1,2}\s?号?外显子|外显子\s?\d{1,2})[^。；;]{0,6}?(?:缺失|插入|突变|跳跃|重复|变异)")
_CHROMOSOME = r"(?:1\d|2[0-2]|[1-9]|X|Y)"
_BAND = rf"{_CHROMOSOME}[pq](?:\d{{1,2}}(?:\.\d{{1,3}})*)?"
_KARYOTYPE = (rf"(?<![A-Za-z0-9])(?:4[4-9],\s?X{{1,4}}Y{{0,2}}(?![A-Za-z-])"
              rf"|(?:t|der|ins)\({_CHROMOSOME}(?:;{_CHROMOSOME})+\)(?:\([pq][\d.;pq]*\))?"
              rf"|(?:inv|del|dup|idic|i|r|der)\({_CHROMOSOME}\)\([pq][\d.;pq]*\)|(?:inv|del|dup|i)\({_BAND}\)"
              rf"|inv\({_CHROMOSOME}\)"
              rf"|{_BAND}(?:/{_BAND})?\s?(?i:co-?deletion|deletion|del|duplication|dup|gain|loss|amplification|"
              rf"microdeletion|microduplication)s?|{_BAND}(?:缺失|重复|扩增)"
              rf"|(?i:mono|tri|tetra)somy\s?{_CHROMOSOME}(?![A-Za-z0-9])"
              rf"|(?i:deletion|loss|gain|duplication)s? (?i:of )(?i:chromosome )?{_BAND})(?![A-Za-z0-9])")
_REPEAT = (r"(?<![A-Za-z0-9])(?:\([ACGT]{3,6}\)n|\d+\s?[ACGT]{3,6}\s?(?i:repeats?)|[ACGT]{3,6}\s?(?i:(?:(?:tri|hexa)?"
           r"nucleotide\s|triplet\s)?(?:repeat\s)?expansions?)|[ACGT]{3,6} (?i:repeats? (?:of |length |number |size |"
           r"count )?)[(:=]?\s?\d+|(?i:(?:tri|hexa)nucleotide repeats?(?: expansions?)?))(?![A-Za-z0-9])")
_CODON = r"(?<![A-Za-z0-9])(?i:codons?)\s?\d{1,4}(?:\s?(?:/|,|and|or)\s?\d{1,4})*(?![A-Za-z0-9])"

TRANSCRIPT_GENE = re.compile(r"\(([A-Za-z0-9-]+)\):")  # NM_007294.4(BRCA1):c.68_69del
HLA_TYPE = re.compile(r"(?<![A-Za-z0-9])HLA[- ]?(A|B|C|DR|DQ|DP|Cw|Bw)"  # serotypes: HLA-B27, HLA-DR3/4-DQ8
                      r"(\d{1,2}(?:/\d{1,2})*(?:[-/](?:DR|DQ|DP)\d{1,2})*)(?![0-9:*.])")
NOTATION_HINT = re.compile(r"[\d*]|repeat|expansion|nucleotide|\)n", re.IGNORECASE)  # in every notation


def notation_patterns(hla_loci: Sequence[str]) -> dict[str, str]:
    """Each notation's kind -> its pattern, in the order the cues try them; the HLA alleles' loci (B, DRB1, ...)
    are those the symbols file names, longest first."""
    hla = rf"(?<![A-Za-z0-9])HLA[- ]?(?P<locus>{'|'.join(hla_loci)})"
    return {
        "hgvs": _HGVS, "hla": rf"{hla}(?:\s?\*\s?\d{{2,4}}(?::\d{{2,3}}){{0,3}}[A-Z]?|\d{{4}}[A-Z]?)(?![0-9])",
        "rsid": _RSID, "diplotype": rf"{_STAR}\s?/\s?{_STAR}", "star": _STAR, "exon": _EXON,
        "karyotype": _KARYOTYPE, "repeat": _REPEAT, "codon": _CODON, "protein": _SHORTHAND,
    }
