"""The tables result recognition reads (`evidence/results.py`), loaded and validated.

`rules/analytes.toml` lists each analyte once (LOINC codes, English names, abbreviations, Chinese names,
accepted units with their factor to one canonical unit, a plausible range and, for some, the adult reference
interval `evidence/result_flags.py` judges a result by), the phrases that name something else, and the words
around a value that make it a dose rather than a result; `rules/critical_values.toml` holds the critical (panic)
limits in the analyte's canonical unit. A mistake a clinician can make in either file (an unknown key, a bad LOINC
check digit, a limit outside the plausible range, a reference interval outside it or around a critical limit, a
name listed twice) is a ConfigError naming the file and the entry, raised when the vocabulary is built, before it
reads any text.

`result_tables` reads the files as the rules loader hands them (`load_vocabulary()` declares both, so
`RuleBook.check()` builds it at start-up); `read_result_tables` reads a test's or a site's own files by their paths.
Either way the fingerprint digests the two files' texts, the same value as `vocabulary_fingerprint()`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.kvcache import digest
from ebmrag.rules import FOLDER, RuleBook, RuleFile, bundled, read_user_file

ANALYTES, CRITICAL = "evidence/analytes.toml", "evidence/critical_values.toml"  # in the rules folder
DEFAULT_ANALYTES_PATH, DEFAULT_CRITICAL_PATH = FOLDER / ANALYTES, FOLDER / CRITICAL


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
    reference: tuple[float, float] | None = None  # adult reference interval, canonical unit (result_flags.py)


@dataclass(frozen=True)
class Surface:
    """What a name as written in text stands for."""

    analyte: Analyte | None  # None: a phrase that names something else ("potassium chloride")
    short: bool  # one or two letters, or one Chinese character: the value must follow right after


@dataclass(frozen=True)
class ResultTables:
    """Both files, read and validated: what `ResultVocabulary` compiles into its scanning regex."""

    analytes: dict[str, Analyte]  # by name, with their critical limits
    surfaces: dict[str, Surface]  # every name, abbreviation, Chinese name and skipped phrase as written
    context: dict[str, list[str]]  # the [context] lists of analytes.toml
    spellings: dict[str, str]  # [unit_synonyms] as written: spelling -> unit
    synonyms: dict[str, str]  # the same as unit keys
    fingerprint: str  # = vocabulary_fingerprint() of the two files


@lru_cache(maxsize=4096)
def unit_key(unit: str) -> str:
    """How units are compared: case, spaces, µ/μ/u, "^", "*" and a leading "×"/"x" before 10 do not count."""
    return _TIMES.sub("", _IGNORED.sub("", unit.lower()).replace("µ", "u").replace("μ", "u"))


_IGNORED, _TIMES = re.compile(r"[\s^*]"), re.compile(r"^[×x](?=10)")


def result_tables(analytes_file: RuleFile, critical_file: RuleFile) -> ResultTables:
    """The two files read and checked; the first mistake found is a ConfigError naming its file."""
    raw, critical = analytes_file.table, critical_file.table
    analytes_path, critical_path = analytes_file.path, critical_file.path
    context = _context(analytes_path, raw)
    spellings = _synonyms(analytes_path, raw)
    synonyms = {unit_key(alias): unit_key(unit) for alias, unit in spellings.items()}
    analytes, surfaces = _analytes(analytes_path, raw, synonyms)
    for name, (unit, low, high) in _limits(critical_path, critical).items():
        analytes[name] = _limited(critical_path, analytes.get(name), name, unit, low, high)
    surfaces += [(s, None, False, s == phrase, "[context] not_results")
                 for phrase in context["not_results"] for s in _case_variants(phrase)]
    return ResultTables(analytes, _surface_table(analytes_path, analytes, surfaces), context, spellings, synonyms,
                        _fingerprint(analytes_file.source, critical_file.source))


def read_result_tables(analytes_path: Path = DEFAULT_ANALYTES_PATH,
                       critical_path: Path = DEFAULT_CRITICAL_PATH) -> ResultTables:
    """The tables of these files (a test's or a site's own), read from disk each time."""
    return result_tables(*(RuleFile(Path(path), *read_user_file(Path(path), "result vocabulary"))
                           for path in (analytes_path, critical_path)))


def vocabulary_fingerprint(book: RuleBook | None = None) -> str:
    """What results computed with the book's vocabulary (default: the bundled one) depend on, without compiling
    it (for cache keys)."""
    book = book or bundled()
    return _fingerprint(book.source(ANALYTES), book.source(CRITICAL))


def _fingerprint(analytes_source: str, critical_source: str) -> str:
    return digest("results", analytes_source, critical_source)


SurfaceRows = list[tuple[str, str | None, bool, bool, str]]  # surface, analyte name, short, listed as is, entry


def _surface_table(path: Path, analytes: Mapping[str, Analyte], surfaces: SurfaceRows) -> dict[str, Surface]:
    """Surface -> what it names. A listed surface wins over a case variant; listed twice is an error."""
    table: dict[str, Surface] = {}
    listed: dict[str, str] = {}
    for surface, name, short, explicit, where in surfaces:
        target = Surface(analytes[name] if name else None, short)
        if surface in listed and explicit and table[surface] != target:
            raise ConfigError(f"{path}: {where}: {surface!r} is already listed by {listed[surface]}")
        if surface in listed or (surface in table and not explicit):
            continue
        table[surface] = target
        if explicit:
            listed[surface] = where
    return table


def _case_variants(phrase: str) -> list[str]:
    """"hemoglobin A1c" is also written "Hemoglobin A1c", "HEMOGLOBIN A1C", "Hemoglobin A1C", "hemoglobin a1c"."""
    return list(dict.fromkeys([phrase, phrase[:1].upper() + phrase[1:], phrase.lower(), phrase.upper(),
                               phrase.capitalize(), phrase.title()]))


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


_ANALYTE_KEYS = {"name", "loinc", "unit", "range", "reference", "names", "abbreviations", "chinese", "units", "bare",
                 "note"}


def _analytes(path: Path, raw: Mapping[str, Any], synonyms: Mapping[str, str]
              ) -> tuple[dict[str, Analyte], SurfaceRows]:
    entries = raw.get("analyte")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: no [[analyte]] entries")
    analytes: dict[str, Analyte] = {}
    surfaces: SurfaceRows = []
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
    return Analyte(entry["name"], tuple(loinc), canonical, float(span[0]), float(span[1]), units, bare,
                   reference=_reference(path, where, entry.get("reference"), float(span[0]), float(span[1])))


def _reference(path: Path, where: str, interval: Any, low: float, high: float) -> tuple[float, float] | None:
    """[low, high] of the adult reference interval, inside the plausible range: an interval reaching past what
    the analyte can be is a typo (a unit's factor applied twice, a missing decimal point)."""
    if interval is None:
        return None
    if (not isinstance(interval, list) or len(interval) != 2 or not all(_is_number(v) for v in interval)
            or not interval[0] < interval[1]):
        raise ConfigError(f"{path}: {where}: reference must be [low, high] with low < high, got {interval!r}")
    if not low <= interval[0] < interval[1] <= high:
        raise ConfigError(f"{path}: {where}: reference {interval[0]:g}-{interval[1]:g} lies outside the plausible "
                          f"range {low:g}-{high:g}")
    return float(interval[0]), float(interval[1])


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
    if analyte.reference is not None and ((low is not None and low >= analyte.reference[0])
                                          or (high is not None and high <= analyte.reference[1])):
        raise ConfigError(f"{path}: [{name}]: a critical limit lies inside the reference interval "
                          f"{analyte.reference[0]:g}-{analyte.reference[1]:g} {analyte.unit} of analytes.toml")
    return replace(analyte, critical_low=low, critical_high=high)
