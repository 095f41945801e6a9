"""Which drug an order or an allergy names, in the chart's own words and codes: ingredients, classes, families.

A CDS card may only say "amoxicillin is a penicillin" when a clinician-readable file says so: the classes are
WHO ATC level-4 groups with their members' INN names (data/drug_classes.toml), the renally cleared drugs a list
of their own (data/renal_drugs.toml). A coded value is read by its code (an RxNorm ingredient id, an ATC code) and
by every display and text it carries, because real orders code the clinical drug ("amoxicillin 500 MG Oral
Capsule", an RxNorm code no table lists) and real allergies often carry only words ("Penicillin",
"Medikamentenunverträglichkeit: Penicillin"). Names are matched as whole words, the longest phrase first, on
NFKC lower-cased text with punctuation read as spaces; beside the classes, the drug lexicon (evidence.lexicon)
finds the same drug named on both sides when no class table lists it ("perazine" allergy, "perazine" order).
"""

from __future__ import annotations

import re
import tomllib
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.evidence.lexicon import DRUG_CLASSES, drug_mentions
from ebmrag.records.fhir.coding import codings, obj

DATA = Path(__file__).parent / "data"
CLASSES_PATH = DATA / "drug_classes.toml"
RENAL_PATH = DATA / "renal_drugs.toml"
_WORD = re.compile(r"[^\W_]+")
_ATC = re.compile(r"^[A-Z](\d\d([A-Z]([A-Z](\d\d)?)?)?)?$")
_MAX_PHRASE = 6  # words in the longest name or class word


@dataclass(frozen=True)
class DrugClass:
    id: str
    label: str  # "penicillin class": what a card names
    family: str  # "" or a family id ("beta-lactams")
    atc: tuple[str, ...]  # the ATC groups (or level-5 codes) that make up the class
    members: frozenset[str]  # INN names


@dataclass(frozen=True)
class Identity:
    """What a coded value names: INN ingredients, class ids, families named as such ("beta-lactam allergy"),
    ATC codes given, and the drug names of the lexicon (for a drug no class table lists)."""

    ingredients: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()
    families: frozenset[str] = frozenset()
    atc: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.ingredients or self.classes or self.families or self.atc or self.names)


@dataclass(frozen=True)
class Relation:
    """How an ordered drug relates to an allergy's substance. `kind`: "ingredient" (the same drug), "class" (the
    same class, or a family the allergy names), "name" (the same drug name, no class table needed), "related"
    (another class of the same family). `shared`: what a card names ("amoxicillin", "penicillin class")."""

    kind: str
    shared: str
    allergy_class: str = ""  # for "related": the allergy's class label ("cephalosporin class")
    order_class: str = ""  # for "related" and "class": the ordered drug's class label

    @property
    def same(self) -> bool:
        """The allergy covers the ordered drug itself, not only a relative of it."""
        return self.kind != "related"


@dataclass(frozen=True)
class RenalGroup:
    name: str  # "biguanide"
    ingredient: str  # the ordered ingredient that put the drug on the list ("metformin"), or an ATC code


@dataclass
class _Tables:
    phrases: dict[tuple[str, ...], tuple[str, str]] = field(default_factory=dict)  # words -> (kind, value)
    rxnorm: dict[str, str] = field(default_factory=dict)  # RXCUI -> INN


class DrugVocabulary:
    """The class and renal tables, read and checked once; `identify` reads a coded value, `relation` compares an
    order with an allergy, `renal_group` says whether an ordered drug is on the renal list."""

    def __init__(self, classes_path: Path = CLASSES_PATH, renal_path: Path = RENAL_PATH) -> None:
        raw = _read(classes_path)
        self.families: dict[str, tuple[str, frozenset[str]]] = {}  # id -> (label, class ids)
        self.classes: dict[str, DrugClass] = {}
        self.salts = frozenset(_norm(s) for s in _strings(raw, "salts", classes_path))
        self._tables = _Tables()
        self._read_families(raw, classes_path)
        self._read_classes(raw, classes_path)
        renal = _read(renal_path)
        self.renal: list[tuple[str, tuple[str, ...], frozenset[str]]] = []
        self._read_renal(renal, renal_path)
        for path, table in ((classes_path, raw), (renal_path, renal)):
            self._read_spellings(table, path)

    # ---------------------------------------------------------------------------------------------- reading
    def _phrase(self, text: str, kind: str, value: str, where: str) -> None:
        words = tuple(_WORD.findall(_norm(text)))
        if not words or len(words) > _MAX_PHRASE:
            raise ConfigError(f"{where}: {text!r} must be 1 to {_MAX_PHRASE} words")
        known = self._tables.phrases.get(words)
        if known is not None and known != (kind, value) and kind != "spelling":
            raise ConfigError(f"{where}: {text!r} already names {known[0]} {known[1]!r}")
        self._tables.phrases.setdefault(words, (kind, value))

    def _read_families(self, raw: Mapping[str, Any], path: Path) -> None:
        for entry in _tables(raw, "family", path):
            family_id = _string(entry, "id", path)
            members = frozenset(c["id"] for c in _tables(raw, "class", path) if c.get("family") == family_id)
            self.families[family_id] = (_string(entry, "label", path), members)
            for word in _strings(entry, "words", path):
                self._phrase(word, "family", family_id, f"{path.name} [[family]] {family_id}")

    def _read_classes(self, raw: Mapping[str, Any], path: Path) -> None:
        owner: dict[str, str] = {}
        for entry in _tables(raw, "class", path):
            class_id, where = _string(entry, "id", path), f"{path.name} [[class]] {entry.get('id')}"
            family = str(entry.get("family") or "")
            if family and family not in self.families:
                raise ConfigError(f"{where}: family {family!r} is not a [[family]]")
            groups = entry.get("atc")
            if not isinstance(groups, dict) or not groups:
                raise ConfigError(f"{where}: needs [class.atc.<ATC code>] tables")
            members: set[str] = set()
            for code, names in groups.items():
                if not _ATC.match(code) or code in owner:
                    raise ConfigError(f"{where}: {code!r} is not an ATC code, or belongs to {owner.get(code)}")
                owner[code] = class_id
                members |= self._ingredients(names, f"{where} atc.{code}")
            self.classes[class_id] = DrugClass(class_id, _string(entry, "label", path), family, tuple(groups),
                                               frozenset(members))
            for word in _strings(entry, "words", path):
                self._phrase(word, "class", class_id, where)

    def _ingredients(self, names: Any, where: str) -> set[str]:
        """INN -> RXCUI table: each name becomes a phrase, each RXCUI a code."""
        if not isinstance(names, dict):
            raise ConfigError(f"{where}: must be a table of INN = \"RXCUI\"")
        found = set()
        for name, cui in names.items():
            if not isinstance(cui, str) or (cui and not cui.isdigit()):
                raise ConfigError(f"{where}: {name!r} = {cui!r}: an RXCUI is digits, or \"\"")
            inn = _norm(name)
            self._phrase(name, "ingredient", inn, where)
            if cui and self._tables.rxnorm.setdefault(cui, inn) != inn:
                raise ConfigError(f"{where}: RXCUI {cui} is already {self._tables.rxnorm[cui]!r}")
            found.add(inn)
        return found

    def _read_renal(self, raw: Mapping[str, Any], path: Path) -> None:
        for entry in _tables(raw, "group", path):
            name, where = _string(entry, "name", path), f"{path.name} [[group]] {entry.get('name')}"
            codes = tuple(_strings(entry, "atc", path))
            if not all(_ATC.match(code) for code in codes):
                raise ConfigError(f"{where}: atc holds a value that is not an ATC code")
            self.renal.append((name, codes, frozenset(self._ingredients(entry.get("ingredients"), where))))

    def _read_spellings(self, raw: Mapping[str, Any], path: Path) -> None:
        spellings = raw.get("spellings", {})
        if not isinstance(spellings, dict):
            raise ConfigError(f"{path}: [spellings] must be a table")
        for spelling, means in spellings.items():
            targets = [means] if isinstance(means, str) else means
            if not isinstance(targets, list) or not all(isinstance(t, str) and t for t in targets):
                raise ConfigError(f"{path}: spelling {spelling!r} must map to a name or a list of names")
            self._phrase(spelling, "spelling", "|".join(_norm(t) for t in targets), f"{path.name} [spellings]")

    # ---------------------------------------------------------------------------------------------- reading charts
    def identify(self, concepts: Iterable[Any]) -> Identity:
        """What these CodeableConcepts (or plain strings) name, by code and by every word they carry."""
        ingredients: set[str] = set()
        classes: set[str] = set()
        families: set[str] = set()
        atc: set[str] = set()
        texts: list[str] = []
        for concept in concepts:
            if isinstance(concept, str):
                texts.append(concept)
                continue
            text = obj(concept).get("text")
            texts += [text] if isinstance(text, str) else []
            for system, code, display in codings(concept):
                texts.append(display)
                if "rxnorm" in system.lower() and code in self._tables.rxnorm:
                    ingredients.add(self._tables.rxnorm[code])
                elif "atc" in system.lower() and _ATC.match(code.strip().upper()):
                    atc.add(code.strip().upper())
        for text in texts:
            self._words(text, ingredients, classes, families)
        classes |= {c.id for c in self.classes.values() if c.members & ingredients
                    or any(code.startswith(group) for code in atc for group in c.atc)}
        for family in families:
            classes |= self.families[family][1]
        names = {n for text in texts for n in drug_mentions(text) if n not in _GENERIC and n not in self.salts}
        return Identity(frozenset(ingredients), frozenset(classes), frozenset(families), frozenset(atc),
                        frozenset(names))

    def _words(self, text: str, ingredients: set[str], classes: set[str], families: set[str]) -> None:
        """The longest known phrase at each word, left to right, without overlaps."""
        words = _WORD.findall(_norm(text))
        at = 0
        while at < len(words):
            for size in range(min(_MAX_PHRASE, len(words) - at), 0, -1):
                found = self._tables.phrases.get(tuple(words[at:at + size]))
                if found is not None:
                    kind, value = found
                    if kind in ("ingredient", "spelling"):
                        ingredients.update(value.split("|"))
                    elif kind == "class":
                        classes.add(value)
                    else:
                        families.add(value)
                    at += size
                    break
            else:
                at += 1

    def relation(self, order: Identity, allergy: Identity) -> Relation | None:
        """How the ordered drug relates to the allergy's substance, the closest relation first; None when the
        tables and the lexicon know of none."""
        if shared := sorted(order.ingredients & allergy.ingredients):
            return Relation("ingredient", shared[0])
        if shared := sorted(order.classes & allergy.classes):
            named = sorted(allergy.families & {self.classes[c].family for c in shared})
            label = self.families[named[0]][0] if named else self.classes[shared[0]].label
            return Relation("class", label, order_class=self.classes[shared[0]].label)
        if shared := sorted(order.names & allergy.names):
            return Relation("name", shared[0])
        for ordered in sorted(order.classes):
            family = self.classes[ordered].family
            related = sorted(c for c in allergy.classes if family and self.classes[c].family == family)
            if related:
                return Relation("related", self.families[family][0], self.classes[related[0]].label,
                                self.classes[ordered].label)
        return None

    def renal_group(self, order: Identity) -> RenalGroup | None:
        """The renal list's group of the ordered drug (by ingredient, else by ATC code), or None."""
        for name, codes, members in self.renal:
            if shared := sorted(order.ingredients & members):
                return RenalGroup(name, shared[0])
            if hit := sorted(code for code in order.atc if any(code.startswith(c) for c in codes)):
                return RenalGroup(name, hit[0])
        return None

    def class_labels(self, identity: Identity) -> list[str]:
        return sorted(self.classes[c].label for c in identity.classes)


_GENERIC = frozenset(DRUG_CLASSES)  # "medication", "antibiotic", class words: no drug of their own


def _norm(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower().replace("β", "beta")


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"drug vocabulary {path} could not be read: {exc}") from exc
    if raw.get("version") != 1:
        raise ConfigError(f"{path}: version must be 1")
    return raw


def _tables(raw: Mapping[str, Any], key: str, path: Path) -> list[dict[str, Any]]:
    found = raw.get(key, [])
    if not isinstance(found, list) or not all(isinstance(t, dict) for t in found):
        raise ConfigError(f"{path}: [[{key}]] must be an array of tables")
    return found


def _string(table: Mapping[str, Any], key: str, path: Path) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{path}: every table needs a non-empty {key!r} (got {value!r})")
    return value


def _strings(table: Mapping[str, Any], key: str, path: Path) -> list[str]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{path}: {key!r} must be a list of non-empty strings")
    return value


@cache
def vocabulary(classes_path: Path = CLASSES_PATH, renal_path: Path = RENAL_PATH) -> DrugVocabulary:
    """The bundled tables, read once per process."""
    return DrugVocabulary(Path(classes_path), Path(renal_path))
