"""Laboratory results recognised from their parts: an analyte name, a value and (usually) a unit.

`rules/analytes.toml` lists each analyte once (LOINC codes, English names, abbreviations, Chinese names,
accepted units with their factor to one canonical unit, a plausible range); `rules/critical_values.toml`
holds the critical (panic) limits in that canonical unit. No example sentence is encoded anywhere: one
compiled regex (a trie of every name, then an optional value and unit) scans the text once, and each hit
is judged here:

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
import tomllib
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.kvcache import digest

RULES = Path(__file__).parent / "rules"
DEFAULT_ANALYTES_PATH = RULES / "analytes.toml"
DEFAULT_CRITICAL_PATH = RULES / "critical_values.toml"


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


@dataclass(frozen=True)
class Unit:
    written: str  # as listed in analytes.toml
    factor: float = 1.0
    offset: float = 0.0

    def canonical(self, value: float) -> float:
        return float(f"{self.factor * value + self.offset:.10g}")

    @property
    def identity(self) -> bool:
        return (self.factor, self.offset) == (1.0, 0.0)


@dataclass(frozen=True)
class Analyte:
    name: str
    loinc: tuple[str, ...]
    unit: str  # canonical
    low: float  # plausible range, canonical unit
    high: float
    units: Mapping[str, Unit]  # unit_key(written) -> Unit
    bare: tuple[str, ...]  # keys of the units a value written without one may be in
    critical_low: float | None = None
    critical_high: float | None = None


@dataclass(frozen=True)
class _Surface:
    analyte: Analyte | None  # None: a phrase that names something else ("potassium chloride")
    short: bool  # one or two letters, or one Chinese character: the value must follow right after


@lru_cache(maxsize=4096)
def unit_key(unit: str) -> str:
    """How units are compared: case, spaces, µ/μ/u, "^", "*" and a leading "×"/"x" before 10 do not count."""
    return _TIMES.sub("", _IGNORED.sub("", unit.lower()).replace("µ", "u").replace("μ", "u"))


_IGNORED, _TIMES = re.compile(r"[\s^*]"), re.compile(r"^[×x](?=10)")
_DIGIT = re.compile(r"\d")
_CLAUSE_STOP = re.compile(r"[,;，；。\n]|\.(?!\d)")
_TIGHT = re.compile(r"[ \t]*[:=|]?[ \t]*")  # all a short name may have before its value
_CONTINUES = re.compile(r"\s*[-–~/:]\s*\d|[A-Za-z]")  # "120/80", "3.5-5.0", "12:30", "3x", "19del"
_SUPERSCRIPTS = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹]+")
_BELOW, _ABOVE = ("<", "≤", "≦"), (">", "≥", "≧")


class ResultVocabulary:
    """The analytes, their units and critical limits, compiled once into one scanning regex."""

    def __init__(self, analytes_path: Path = DEFAULT_ANALYTES_PATH,
                 critical_path: Path = DEFAULT_CRITICAL_PATH) -> None:
        raw, analytes_source = _read(analytes_path)
        critical, critical_source = _read(critical_path)
        self.fingerprint = digest("results", analytes_source, critical_source)  # = vocabulary_fingerprint()
        context = _context(analytes_path, raw)
        spellings = _synonyms(analytes_path, raw)
        self._synonyms = {unit_key(alias): unit_key(unit) for alias, unit in spellings.items()}
        self.analytes, surfaces = _analytes(analytes_path, raw, self._synonyms)
        for name, (unit, low, high) in _limits(critical_path, critical).items():
            self.analytes[name] = _limited(critical_path, self.analytes.get(name), name, unit, low, high)
        surfaces += [(s, None, False, s == phrase, "[context] not_results")
                     for phrase in context["not_results"] for s in _case_variants(phrase)]
        self._surfaces = self._surface_table(analytes_path, surfaces)

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

    def _surface_table(self, path: Path, surfaces: list[tuple[str, str | None, bool, bool, str]]
                       ) -> dict[str, _Surface]:
        """Surface -> what it names. A listed surface wins over a case variant; listed twice is an error."""
        table: dict[str, _Surface] = {}
        listed: dict[str, str] = {}
        for surface, name, short, explicit, where in surfaces:
            target = _Surface(self.analytes[name] if name else None, short)
            if surface in listed and explicit and table[surface] != target:
                raise ConfigError(f"{path}: {where}: {surface!r} is already listed by {listed[surface]}")
            if surface in listed or (surface in table and not explicit):
                continue
            table[surface] = target
            if explicit:
                listed[surface] = where
        return table

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


@cache
def load_vocabulary(analytes_path: Path = DEFAULT_ANALYTES_PATH,
                    critical_path: Path = DEFAULT_CRITICAL_PATH) -> ResultVocabulary:
    """The vocabulary of these two files, read, validated and compiled once per process."""
    return ResultVocabulary(Path(analytes_path), Path(critical_path))


@cache
def vocabulary_fingerprint(analytes_path: Path = DEFAULT_ANALYTES_PATH,
                           critical_path: Path = DEFAULT_CRITICAL_PATH) -> str:
    """What results computed with this vocabulary depend on, without compiling it (for cache keys)."""
    return digest("results", _read(Path(analytes_path))[1], _read(Path(critical_path))[1])


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


def _case_variants(phrase: str) -> list[str]:
    """"hemoglobin A1c" is also written "Hemoglobin A1c", "HEMOGLOBIN A1C", "Hemoglobin A1C", "hemoglobin a1c"."""
    return list(dict.fromkeys([phrase, phrase[:1].upper() + phrase[1:], phrase.lower(), phrase.upper(),
                               phrase.capitalize(), phrase.title()]))


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
    if other:
        parts.append("|".join(re.escape(w) for w in other))
    return "|".join(parts) or "(?!)"


# ------------------------------------------------------------------------------------------ loading, validation
def _read(path: Path) -> tuple[dict[str, Any], str]:
    try:
        source = path.read_text(encoding="utf-8")
        return tomllib.loads(source), source
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: could not be read: {exc}") from exc


def _strings(path: Path, where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{path}: {where}: must be a list of non-empty strings, got {value!r}")
    return value


def _context(path: Path, raw: Mapping[str, Any]) -> dict[str, list[str]]:
    table = raw.get("context")
    keys = ("connectors", "dose_units", "other_units", "dose_after", "dose_before", "not_results")
    if not isinstance(table, dict) or set(table) - set(keys):
        raise ConfigError(f"{path}: [context] must be a table of the lists {list(keys)}")
    return {key: _strings(path, f"[context] {key}", table.get(key)) for key in keys}


def _synonyms(path: Path, raw: Mapping[str, Any]) -> dict[str, str]:
    table = raw.get("unit_synonyms", {})
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ConfigError(f"{path}: [unit_synonyms] must map unit spellings to units (strings)")
    return table


def _loinc_ok(code: str) -> bool:
    """Form 12345-6 with LOINC's mod-10 check digit (double the digits in odd places from the right)."""
    found = re.fullmatch(r"(\d{1,7})-(\d)", code)
    if not found:
        return False
    digits = found[1][::-1]
    total = sum(int(d) for d in str(2 * int(digits[0::2][::-1]))) + sum(int(d) for d in digits[1::2])
    return (10 - total % 10) % 10 == int(found[2])


_ANALYTE_KEYS = {"name", "loinc", "unit", "range", "names", "abbreviations", "chinese", "units", "bare", "note"}
Surfaces = list[tuple[str, str | None, bool, bool, str]]  # surface, analyte name, short, listed as is, entry


def _analytes(path: Path, raw: Mapping[str, Any], synonyms: Mapping[str, str]) -> tuple[dict[str, Analyte], Surfaces]:
    entries = raw.get("analyte")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: no [[analyte]] entries")
    analytes: dict[str, Analyte] = {}
    surfaces: Surfaces = []
    for number, entry in enumerate(entries, 1):
        where = f"[[analyte]] #{number}"
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{path}: {where}: must be a table with a name")
        where = f"{where} ({name})"
        if name in analytes:
            raise ConfigError(f"{path}: {where}: the name is listed twice")
        analytes[name] = _analyte(path, where, entry, synonyms)
        names, abbreviations, chinese = (_strings(path, f"{where} {key}", entry.get(key, []))
                                         for key in ("names", "abbreviations", "chinese"))
        if not names and not abbreviations and not chinese:
            raise ConfigError(f"{path}: {where}: lists no names, abbreviations or chinese names")
        surfaces += [(s, name, False, s == n, where) for n in names for s in _case_variants(n)]
        surfaces += [(a, name, sum(c.isalpha() for c in a) <= 2, True, where) for a in abbreviations]
        surfaces += [(s, name, len(c) == 1, s == c, where) for c in chinese for s in _case_variants(c)]
    return analytes, surfaces


def _analyte(path: Path, where: str, entry: Mapping[str, Any], synonyms: Mapping[str, str]) -> Analyte:
    unknown = set(entry) - _ANALYTE_KEYS
    if unknown:
        raise ConfigError(f"{path}: {where}: unknown keys {sorted(unknown)}")
    loinc = _strings(path, f"{where} loinc", entry.get("loinc", []))
    bad = [code for code in loinc if not _loinc_ok(code)]
    if bad:
        raise ConfigError(f"{path}: {where}: {bad[0]!r} is not a LOINC code (form 12345-6, valid check digit)")
    canonical, span = entry.get("unit"), entry.get("range")
    if not isinstance(canonical, str):
        raise ConfigError(f"{path}: {where}: unit must be a string ('' for a ratio)")
    if (not isinstance(span, list) or len(span) != 2 or not all(_is_number(v) for v in span)
            or not span[0] < span[1]):
        raise ConfigError(f"{path}: {where}: range must be [low, high] with low < high, got {span!r}")
    units = {unit_key(canonical): Unit(canonical)}
    for written, spec in (entry.get("units") or {}).items():
        factor, offset = _conversion(spec)
        if factor <= 0:
            raise ConfigError(f"{path}: {where}: unit {written!r} needs a factor > 0 or [factor, offset]")
        key = synonyms.get(unit_key(written), unit_key(written))
        if key == unit_key(canonical):
            if (factor, offset) != (1, 0):
                raise ConfigError(f"{path}: {where}: the canonical unit {canonical!r} must have factor 1")
            continue
        if key in units:
            raise ConfigError(f"{path}: {where}: unit {written!r} is listed twice (spellings are compared without "
                              f"case, spaces, µ/u and ^)")
        units[key] = Unit(written, factor, offset)
    bare = tuple(synonyms.get(unit_key(u), unit_key(u)) for u in _strings(path, f"{where} bare", entry["bare"])) \
        if "bare" in entry else (unit_key(canonical),)
    if any(b not in units for b in bare):
        raise ConfigError(f"{path}: {where}: bare units {[b for b in bare if b not in units]} are not its units")
    return Analyte(entry["name"], tuple(loinc), canonical, float(span[0]), float(span[1]), units, bare)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _conversion(spec: Any) -> tuple[float, float]:
    """A factor, or [factor, offset]; (0, 0) for anything else (reported by the caller)."""
    if _is_number(spec):
        return float(spec), 0.0
    if isinstance(spec, list) and len(spec) == 2 and all(_is_number(v) for v in spec):
        return float(spec[0]), float(spec[1])
    return 0.0, 0.0


def _limits(path: Path, raw: Mapping[str, Any]) -> dict[str, tuple[str, float | None, float | None]]:
    limits = {}
    for name, table in raw.items():
        if name == "version":
            continue
        if not isinstance(table, dict) or set(table) - {"unit", "low", "high", "note"} \
                or not isinstance(table.get("unit"), str):
            raise ConfigError(f"{path}: [{name}]: must be a table of unit, low and/or high (and note), got {table!r}")
        low, high = table.get("low"), table.get("high")
        if any(limit is not None and not _is_number(limit) for limit in (low, high)):
            raise ConfigError(f"{path}: [{name}]: limits must be numbers, got low={low!r}, high={high!r}")
        if (low is None and high is None) or (low is not None and high is not None and not low < high):
            raise ConfigError(f"{path}: [{name}]: needs low and/or high, with low < high")
        limits[name] = (table["unit"], None if low is None else float(low), None if high is None else float(high))
    return limits


def _limited(path: Path, analyte: Analyte | None, name: str, unit: str, low: float | None,
             high: float | None) -> Analyte:
    if analyte is None:
        raise ConfigError(f"{path}: [{name}]: no analyte of that name in analytes.toml")
    if unit_key(unit) != unit_key(analyte.unit):
        raise ConfigError(f"{path}: [{name}]: unit {unit!r} is not the analyte's canonical unit {analyte.unit!r}")
    for limit in (low, high):
        if limit is not None and not analyte.low <= limit <= analyte.high:
            raise ConfigError(f"{path}: [{name}]: limit {limit:g} lies outside the plausible range "
                              f"{analyte.low:g}-{analyte.high:g} {analyte.unit}")
    return replace(analyte, critical_low=low, critical_high=high)
