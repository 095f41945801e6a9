"""Quantities read as arithmetic: a value in one unit compared with a limit in another, a body measure checked for
a unit and a value a person can have, and a drug level judged against its therapeutic range.

A unit is parsed as UCUM writes it (rules/records/units.toml: prefixes, atoms, the spellings charts use), into the
kinds it measures and its factor, so ng/mL and ug/L compare equal and mg/dL is ten mg/L, while mmol/L and mg/L are
never compared (that needs a molar mass, which no unit carries). A unit that cannot be parsed is never guessed at:
the value is then not judged. Drug levels (rules/records/drug_levels.toml) are judged only when the laboratory sent
no interpretation: its own flag may follow a protocol's range, and the chart's word stands.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ebmrag.records.fhir.coding import codings, obj
from ebmrag.rules import rule_file

Kinds = tuple[tuple[str, int], ...]  # ("mass", 1), ("volume", -1): what a unit measures, sorted


@dataclass(frozen=True)
class Unit:
    """A parsed unit: what it measures and its factor to the base units of those kinds (g, mol, L, m, s)."""

    kinds: Kinds
    factor: float


@dataclass(frozen=True)
class UnitTable:
    prefixes: Mapping[str, float]
    atoms: Mapping[str, tuple[str, float]]  # take a prefix
    plain: Mapping[str, tuple[str, float]]  # take none
    spellings: Mapping[str, str]
    term: re.Pattern[str]


@rule_file("records/units.toml")
def units(raw: Mapping[str, Any]) -> UnitTable:
    """units.toml, compiled: one regex for a prefixed atom with its exponent ("mg", "dL", "m2")."""
    prefixes = {str(k): float(v) for k, v in raw["prefixes"].items()}
    atoms = {str(k): (str(v["kind"]), float(v["factor"])) for k, v in raw["atoms"].items()}
    plain = {str(k): (str(v["kind"]), float(v["factor"])) for k, v in raw["plain"].items()}
    longest = sorted(atoms, key=len, reverse=True)
    term = re.compile(f"^(?P<prefix>{'|'.join(map(re.escape, prefixes))})?(?P<atom>{'|'.join(map(re.escape, longest))})"
                      r"(?P<power>-?\d)?$")
    return UnitTable(prefixes, atoms, plain, {str(k): str(v) for k, v in raw["spellings"].items()}, term)


def parse_unit(written: str) -> Unit | None:
    """A unit as UCUM arithmetic ("mg/dL" -> mass/volume, 0.01 g/L), or None when any term is not a unit
    (annotations, "10*3/uL", "%", "mL/min/1.73m2": not guessed at)."""
    table = units()
    text = re.sub(r"\s+", "", written.lower().replace("µ", "u").replace("μ", "u"))
    text = table.spellings.get(text, text)
    if not text:
        return None
    powers: dict[str, int] = {}
    factor = 1.0
    for n, division in enumerate(text.split("/")):
        for term in division.split("."):
            parsed = _term(table.spellings.get(term, term), table)
            if parsed is None:
                return None
            kind, scale, power = parsed
            sign = -1 if n else 1
            powers[kind] = powers.get(kind, 0) + sign * power
            factor *= scale ** (sign * power)
    return Unit(tuple(sorted((k, p) for k, p in powers.items() if p)), factor)


def _term(term: str, table: UnitTable) -> tuple[str, float, int] | None:
    if term in table.plain:
        kind, scale = table.plain[term]
        return kind, scale, 1
    found = table.term.match(term)
    if found is None:
        return None
    kind, scale = table.atoms[found["atom"]]
    prefix = table.prefixes[found["prefix"]] if found["prefix"] else 1.0
    return kind, prefix * scale, int(found["power"] or 1)


def written_units(quantity: Any) -> list[str]:
    """The units a Quantity is written in: its UCUM `code` first (when its system is UCUM or unnamed), then the
    `unit` as displayed."""
    q = obj(quantity)
    ucum = q.get("code") if "unitsofmeasure" in str(q.get("system") or "unitsofmeasure") else None
    return [u for u in (ucum, q.get("unit")) if isinstance(u, str) and u.strip()]


def converted(value: float, written: str, target: str) -> float | None:
    """`value` in `written` expressed in `target`, or None when the two do not measure the same kind of thing (or
    either is no unit this table can read)."""
    source, goal = parse_unit(written), parse_unit(target)
    if source is None or goal is None or source.kinds != goal.kinds:
        return None
    return value * source.factor / goal.factor


def value_in(quantity: Any, unit: str, bare: bool = False, also: Mapping[str, str] | None = None) -> float | None:
    """A Quantity's value in `unit` (None: no number, or a unit not of the same kind). `bare`: a value written
    without a unit is taken as in `unit` (a BMI, which has one unit only); `also`: units that equal a unit of that
    kind for this analyte only (lithium's "meq/L" = "mmol/L")."""
    q = obj(quantity)
    value = q.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if bare and not written_units(q):
        return float(value)
    same = also or {}
    return next((v for u in written_units(q)
                 if (v := converted(float(value), same.get(re.sub(r"\s+", "", u.lower()), u), unit)) is not None), None)


def implausible(name: str, quantity: Any, limits: Mapping[str, Any]) -> str:
    """Why a body measure's unit or value is no person's ("" when it is plausible, or has no number or no readable
    unit to judge by): "cm" for a weight, grams read as kg. `limits`: drug_facts.toml [body.plausible] `name`; the
    units of its `units` that would make the value plausible are named ("perhaps g")."""
    q = obj(quantity)
    raw = q.get("value")
    readable = [u for u in written_units(q) if parse_unit(u) is not None]
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not (readable or limits.get("bare")):
        return ""
    value = value_in(q, limits["unit"], bare=bool(limits.get("bare")))
    if value is None:
        return f"the unit {readable[0]!r} is not a unit of {name}" if readable else ""
    if limits["low"] <= value <= limits["high"]:
        return ""
    other = " or ".join(shown for unit, shown in limits.get("units", {}).items()
                        if (v := converted(float(raw), unit, limits["unit"])) is not None
                        and limits["low"] <= v <= limits["high"])
    return f"not a plausible {name} in {readable[0] if readable else limits['unit']}" \
        + (f" (perhaps {other})" if other else "")


# ------------------------------------------------------------------------------------------------ drug levels
@dataclass(frozen=True)
class DrugLevel:
    """One drug_levels.toml [[level]]: limits in `unit`; `toxic`: at or above it the level is toxic."""

    drug: str
    unit: str
    low: float | None
    high: float | None
    toxic: float | None
    equivalent: Mapping[str, str]  # a unit key -> `unit`, for this drug alone

    @property
    def range_text(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low:g}–{self.high:g} {self.unit}"
        return f"up to {self.high:g} {self.unit}" if self.high is not None else ""


@rule_file("records/drug_levels.toml")
def drug_levels(raw: Mapping[str, Any]) -> dict[str, DrugLevel]:
    """drug_levels.toml by LOINC code; a level without limits, a range upside down or a unit the unit table cannot
    read is refused."""
    levels: dict[str, DrugLevel] = {}
    for entry in raw["level"]:
        low, high, toxic = (float(entry[k]) if k in entry else None for k in ("low", "high", "toxic"))
        unit = str(entry["unit"])
        if parse_unit(unit) is None or (low is None and high is None and toxic is None) or (
                low is not None and high is not None and low >= high):
            raise ValueError(f"[[level]] {entry.get('drug')!r}: needs a readable unit and low < high, or a toxic limit")
        equivalent = {re.sub(r"\s+", "", u.lower()): unit for u in entry.get("equivalent", [])}
        for code in entry["loinc"]:
            levels[str(code)] = DrugLevel(str(entry["drug"]), unit, low, high, toxic, equivalent)
    return levels


def drug_level_of(resource: Mapping[str, Any]) -> DrugLevel | None:
    return next((level for system, code, _ in codings(resource.get("code"))
                 if "loinc" in system and (level := drug_levels().get(code))), None)


def drug_level_flag(resource: Mapping[str, Any]) -> str:
    """"toxic (at or above 1.5 mmol/L)", "above therapeutic range (0.5–2 ng/mL)", "below ...", or "" (in range, not
    a drug level of the table, or a unit not comparable). A value written "<x" can only be low, ">x" only high."""
    level = drug_level_of(resource)
    if level is None:
        return ""
    quantity = obj(resource.get("valueQuantity"))
    value = value_in(quantity, level.unit, also=level.equivalent)
    if value is None:
        return ""
    value = float(f"{value:.6g}")
    comparator = str(quantity.get("comparator") or "")
    if level.toxic is not None and value >= level.toxic and "<" not in comparator:
        return f"toxic (at or above {level.toxic:g} {level.unit})"
    if level.high is not None and value > level.high and "<" not in comparator:
        return f"above therapeutic range ({level.range_text})"
    if level.low is not None and value < level.low and ">" not in comparator:
        return f"below therapeutic range ({level.range_text})"
    return ""
