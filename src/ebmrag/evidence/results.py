"""Laboratory results recognised from their parts: an analyte name, a value and (usually) a unit.

The analytes, their units and critical limits come from `rules/evidence/analytes.toml` and
`rules/evidence/critical_values.toml`, read and validated by `evidence/result_tables.py`; `load_vocabulary()`
declares both with the rules loader (ebmrag.rules), so `RuleBook.check()` compiles them at start-up. No example
sentence is encoded anywhere: one compiled regex (a trie of every name, then an optional value and unit) scans the
text once, and each hit is judged here:

- a short name ("K", "Na", "Hb", 钾) needs its value right after it (only spaces, ":", "=" or "|" between);
- the value must be plausible for the analyte in its unit. A bare value is read in each unit the analyte is
  commonly written in without one ("Cr 2.1" can only be mg/dL); when several fit, the canonical value is
  unknown (None) rather than guessed;
- a dose unit ("K 20 mEq"), a unit of another quantity ("%", "years"), a route or frequency after the value
  ("PO bid") or a giving verb just before the name ("replete K") means it is not a result;
- a phrase such as "potassium chloride", "urine sodium" or 氯化钾 names something else and is skipped whole.

Input is read as NFKC (full-width digits, letters and colons, superscripts, the micro sign), one character
for one wherever it can be, so spans index the text as given.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ebmrag.evidence.result_tables import (
    ANALYTES,
    CRITICAL,
    DEFAULT_ANALYTES_PATH,
    DEFAULT_CRITICAL_PATH,
    Analyte,
    ResultTables,
    Unit,
    read_result_tables,
    result_tables,
    unit_key,
)
from ebmrag.rules import RuleFile, rule_file


@dataclass(frozen=True)
class ResultMention:
    analyte: str  # canonical English name from analytes.toml, e.g. "potassium"
    loinc: str  # first LOINC code of the analyte ("" for a troponin the text does not name)
    value: float  # as written, in the written unit
    unit: str  # as written, read as NFKC ("" when none)
    canonical_value: float | None  # in the canonical unit; None when the unit is unknown or ambiguous
    start: int  # span in the text: analyte start ..
    end: int  # .. value/unit end
    critical: str  # "" or a short reason, e.g. "potassium 6.8 mmol/L ≥ 6.0 (critical high)"


_DIGIT = re.compile(r"\d")
_CLAUSE_STOP = re.compile(r"[,;，；。\n]|\.(?!\d)")
_TIGHT = re.compile(r"[ \t]*[:=|]?[ \t]*")  # all a short name may have before its value
_CONTINUES = re.compile(r"\s*[-–~/:]\s*\d|[A-Za-z]")  # "120/80", "3.5-5.0", "12:30", "3x", "19del"
_SUPERSCRIPTS = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹]+")
_BELOW, _ABOVE = ("<", "≤", "≦"), (">", "≥", "≧")


class ResultVocabulary:
    """The analytes, their units and critical limits, compiled once into one scanning regex. `critical` holds,
    by LOINC code, the analytes that have a critical limit (what CDS compares a coded result with)."""

    def __init__(self, tables: ResultTables) -> None:
        self.fingerprint = tables.fingerprint  # = vocabulary_fingerprint()
        context, spellings = tables.context, tables.spellings
        self._synonyms = tables.synonyms
        self.analytes, self._surfaces = tables.analytes, tables.surfaces
        self.critical = {code: a for a in self.analytes.values()
                         if a.critical_low is not None or a.critical_high is not None for code in a.loinc}
        units = {u for a in self.analytes.values() for unit in a.units.values() for u in _unit_variants(unit.written)}
        units |= {u for w in (*context["dose_units"], *context["other_units"], *spellings) for u in _unit_variants(w)}
        gap = (r"(?:[\s:=|]|\([A-Za-z ]{1,15}\))*"
               rf"(?:(?:{_words(context['connectors'])})(?![A-Za-z])[\s:=|]*){{0,3}}")
        self._pattern = re.compile(
            rf"(?P<name>{_names(self._surfaces)})"
            rf"(?:(?P<gap>{gap})(?P<cmp>[<>≤≥≦≧]=?\s*)?(?P<num>\d+(?:[.,]\d+)*)"
            rf"(?:[ \t]*\|?[ \t]*(?P<unit>{'|'.join(_unit_regex(u) for u in sorted(units, key=len, reverse=True))})"
            r"(?![A-Za-z]|/[A-Za-z]))?)?"
        )
        self._dose_after = re.compile(_words(context["dose_after"]))
        verbs = context["dose_before"]
        self._dose_before = re.compile(rf"(?:(?:{_words(w for w in verbs if w.isascii())})\s+(?:(?i:iv|po)\s+)?"
                                       rf"|(?:{_words(w for w in verbs if not w.isascii())})\s*)$")

    @classmethod
    def from_files(cls, analytes_path: Path = DEFAULT_ANALYTES_PATH,
                   critical_path: Path = DEFAULT_CRITICAL_PATH) -> ResultVocabulary:
        """The vocabulary of these files (a test's or a site's own), read each time; `load_vocabulary()` gives
        the bundled one, built once."""
        return cls(read_result_tables(analytes_path, critical_path))

    def mentions(self, text: str) -> list[ResultMention]:
        """Every laboratory result in `text`, in order."""
        normal, index = _normalise(text)
        if not _DIGIT.search(normal):  # every result has a number: most sentences end here
            return []
        found = []
        for match in self._pattern.finditer(normal):
            written = match["unit"] or ""
            if written and not text.isascii():  # as written: '×10⁹/L' reads '×10^9/L', not '×109/L'
                start, end = match.span("unit")
                original = text[index[start]:index[end - 1] + 1] if index else text[start:end]
                written = unicodedata.normalize("NFKC", _SUPERSCRIPTS.sub(lambda m: "^" + m.group(), original))
            mention = self._mention(normal, match, written)
            if mention is not None and index:
                mention = replace(mention, start=index[mention.start], end=index[mention.end - 1] + 1)
            if mention is not None:
                found.append(mention)
        return found

    def names(self, text: str) -> list[tuple[int, int]]:
        """Where `text` names an analyte, with or without a value: what a statement such as "potassium low" or
        "血红蛋白下降" is about. A short name ("K", 钾) counts only with its value, a skipped phrase never."""
        normal, index = _normalise(text)
        spans = []
        for match in self._pattern.finditer(normal):
            surface = self._surfaces.get(match["name"])
            if surface is None or surface.analyte is None or (surface.short and match["num"] is None):
                continue
            start, end = match.span("name")
            spans.append((index[start], index[end - 1] + 1) if index else (start, end))
        return spans

    def _mention(self, text: str, match: re.Match[str], written: str) -> ResultMention | None:
        surface, number = self._surfaces.get(match["name"]), match["num"]
        if number is None or surface is None or surface.analyte is None:
            return None
        analyte, start, end = surface.analyte, match.start(), match.end()
        value = _number(number)
        if (value is None or (surface.short and not _TIGHT.fullmatch(match["gap"] or ""))
                or (not written and _CONTINUES.match(text, match.end("num"))) or self._dose(text, start, end)):
            return None
        if written:
            read_as = analyte.units.get(self._key(match["unit"] or ""))
            if read_as is None:  # a dose, another quantity, or another analyte's unit
                return None
            fits = {read_as.canonical(value): read_as}
        else:
            fits = {unit.canonical(value): unit for unit in (analyte.units[key] for key in analyte.bare)}
        fits = {c: unit for c, unit in fits.items() if analyte.low <= c <= analyte.high}
        if not fits:
            return None
        canonical, unit = next(iter(fits.items())) if len(fits) == 1 else (None, None)
        comparator = (match["cmp"] or "").strip()
        critical = _critical(analyte, comparator, number, written, canonical, unit) if canonical is not None \
            and unit is not None else ""
        return ResultMention(analyte.name, analyte.loinc[0] if analyte.loinc else "", value, written, canonical,
                             start, end, critical)

    def _key(self, unit: str) -> str:
        key = unit_key(unit)
        return self._synonyms.get(key, key)

    def _dose(self, text: str, start: int, end: int) -> bool:
        after = text[end:end + 30]
        stop = _CLAUSE_STOP.search(after)
        if self._dose_after.search(after[:stop.start()] if stop else after):
            return True
        return bool(self._dose_before.search(_CLAUSE_STOP.split(text[max(0, start - 25):start])[-1]))


@rule_file(ANALYTES, CRITICAL, as_files=True)
def load_vocabulary(analytes: RuleFile, critical: RuleFile) -> ResultVocabulary:
    """The vocabulary of the two files, read, validated and compiled once per book (default: the bundled one)."""
    return ResultVocabulary(result_tables(analytes, critical))


def result_mentions(text: str) -> list[ResultMention]:
    """Every laboratory result (analyte, value, unit) in `text`, in order, by the bundled vocabulary."""
    return load_vocabulary().mentions(text)


def critical_results(text: str) -> list[ResultMention]:
    """The results in `text` at or beyond a critical limit of rules/critical_values.toml."""
    return [m for m in result_mentions(text) if m.critical]


def _critical(analyte: Analyte, comparator: str, number: str, written: str, canonical: float, unit: Unit) -> str:
    """'potassium 6.8 mmol/L ≥ 6.0 (critical high)', or '' when the value is not beyond a limit.

    A converted value is compared as a report would show it (3 significant digits: 500 mg/dL glucose is
    27.8 mmol/L); "<" can only make a value critically low, ">" only critically high.
    """
    compared = canonical if unit.identity else float(f"{canonical:.3g}")
    if analyte.critical_high is not None and compared >= analyte.critical_high and not comparator.startswith(_BELOW):
        limit, side = f"≥ {_fmt(analyte.critical_high)}", "high"
    elif analyte.critical_low is not None and compared <= analyte.critical_low and not comparator.startswith(_ABOVE):
        limit, side = f"≤ {_fmt(analyte.critical_low)}", "low"
    else:
        return ""
    shown = f"{analyte.name} {comparator}{number}"
    if written:
        shown += f" {written}"
    elif not unit.identity:
        shown += f" (read as {unit.written})"
    if not unit.identity:
        shown += f" = {canonical:.3g} {analyte.unit}"
    elif analyte.unit and (not written or unit is not analyte.units[unit_key(analyte.unit)]):
        limit += f" {analyte.unit}"
    return f"{shown} {limit} (critical {side})"


# ------------------------------------------------------------------------------------------ text and regex
def _nfkc_one_to_one() -> dict[int, str]:
    """NFKC of the characters that map to exactly one character (full-width forms, super/subscripts, µ)."""
    table = {}
    for cp in (*range(0xA0, 0x100), *range(0x2070, 0x20A0), 0x3000, *range(0xFF01, 0xFF5F)):
        normal = unicodedata.normalize("NFKC", chr(cp))
        if len(normal) == 1 and normal != chr(cp):
            table[cp] = normal
    return table


_NFKC = _nfkc_one_to_one()


def _normalise(text: str) -> tuple[str, list[int] | None]:
    """NFKC text and, only when a character expanded (℃ -> °C), the index in `text` of each character."""
    if text.isascii():
        return text, None
    normal = text.translate(_NFKC)
    if normal.isascii() or unicodedata.is_normalized("NFKC", normal):
        return normal, None
    pieces, index = [], []
    for i, char in enumerate(text):
        piece = unicodedata.normalize("NFKC", char)
        pieces.append(piece)
        index.extend([i] * len(piece))
    return "".join(pieces), index


_THOUSANDS, _DECIMAL_COMMA = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?"), re.compile(r"\d+,\d+")


def _number(text: str) -> float | None:
    """'6.8', '6,8' (decimal comma), '150,000' (thousands); None for '12.06.2023' or '1,2,3'."""
    if "," in text:
        if _THOUSANDS.fullmatch(text):
            text = text.replace(",", "")
        elif _DECIMAL_COMMA.fullmatch(text):
            text = text.replace(",", ".")
        else:
            return None
    return float(text) if text.count(".") <= 1 else None


def _fmt(number: float) -> str:
    return f"{number:.1f}" if number == int(number) and abs(number) < 10 else f"{number:g}"


_END = "\x00"
_TRAILING = r"(?![A-Za-z0-9]|-[A-Za-z0-9])"  # "K" but not "KCl", "K2" or "K-Dur"; "CK" but not "CK-MB"


def _trie(surfaces: Iterable[str]) -> str:
    """One alternation over all surfaces, shaped as a trie; a longer surface is tried before its prefix."""
    root: dict[str, Any] = {}
    for surface in surfaces:
        node = root
        for char in surface:
            node = node.setdefault(char, {})
        latin_end = (surface[-1].isascii() and surface[-1].isalnum()) or surface[-1] in "+-#"
        node[_END] = _TRAILING if latin_end else ""

    def build(node: dict[str, Any]) -> str:
        alternatives = [re.escape(char) + build(child) for char, child in sorted(node.items()) if char != _END]
        if _END in node:
            alternatives.append(node[_END])
        return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"

    return build(root)


def _names(surfaces: Iterable[str]) -> str:
    """Latin names only at a word start, others anywhere. A class of first characters turns most positions
    away before a trie is tried (about 2x faster on English text than one plain trie)."""
    parts = []
    for latin, before in ((True, "(?<![A-Za-z0-9_])"), (False, "")):
        group = [s for s in surfaces if s[0].isascii() == latin]
        if group:
            first = "".join(sorted({re.escape(s[0]) for s in group}))
            parts.append(f"{before}(?=[{first}]){_trie(group)}")
    return "|".join(parts)


def _unit_regex(unit: str) -> str:
    """A unit as charts write it: 'x 10^9 /L', '×10⁹/L' (read as ×109/L), 'mL/min/1.73m2' all match."""
    parts = []
    if re.match(r"[×x*]?\s*10\^", unit):
        parts.append(r"(?:[×xX*]\s*)?")
        unit = re.sub(r"^[×x*]\s*", "", unit)
    for i, char in enumerate(unit):
        if char == " ":
            parts.append(r"\s*")
        elif char == "/":
            parts.append(r"\s*/\s*")
        elif char == "^":
            parts.append(r"[\^*]?")
        elif char in "µμΜ":
            parts.append("[µμuU]")
        else:
            if char.isdigit() and i and unit[i - 1].isalpha():
                parts.append(r"\^?")
            parts.append(re.escape(char))
    return "".join(parts)


def _unit_variants(unit: str) -> set[str]:
    """As listed and lower case; upper case only for compound units ("MG/DL", but "MG" is magnesium)."""
    return ({unit, unit.lower()} | ({unit.upper()} if "/" in unit else set())) - {""}


def _words(words: Iterable[str]) -> str:
    """Case-insensitive alternation, longest first: Latin words at word boundaries, Chinese anywhere."""
    words = list(words)
    latin = sorted({w for w in words if w.isascii()}, key=len, reverse=True)
    other = sorted({w for w in words if not w.isascii()}, key=len, reverse=True)
    parts = []
    if latin:
        alternation = "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in latin)
        parts.append(rf"(?<![A-Za-z0-9])(?i:{alternation})(?![A-Za-z0-9])")
    if other:  # "×1" (once) must not match inside "×10^9/L": a word ending in a Latin letter or digit ends there
        parts.append("|".join(re.escape(w) + ("(?![A-Za-z0-9])" if w[-1].isascii() and w[-1].isalnum() else "")
                              for w in other))
    return "|".join(parts) or "(?!)"

