"""Which drug an order or an allergy names, in the chart's own words and codes: ingredients, classes, families.

A CDS card may only say "amoxicillin is a penicillin" when a clinician-readable file says so: the classes are
WHO ATC level-4 groups with their members' INN names (rules/drugs/drug_classes.toml), the renally cleared drugs a
list of their own (rules/drugs/renal_drugs.toml), brand names and other names of their ingredients a generated
list (rules/drugs/drug_names.toml), the SNOMED CT and RxNorm codes whose names name one of them another
(rules/drugs/drug_codes.toml), and the Chinese names of drugs and classes a table of their own
(rules/drugs/drug_terms.toml: "阿莫西林" is amoxicillin, "头孢" the cephalosporin class). A coded value is read by
its code and by every display and text it carries, because real orders code the clinical drug ("amoxicillin
500 MG Oral Capsule", an RxNorm code no table lists) and real allergies often carry only words ("Penicillin",
"Medikamentenunverträglichkeit: Penicillin", "Pénicillines"). Words are compared by vocab.drug_words (folded,
then by spelling key), Chinese names by substring; beside the classes, the drug lexicon (vocab.lexicon) finds the
same drug named on both sides when no class table lists it ("perazine" allergy, "perazine" order). A value that
carries only codes no table knows is "opaque": `uncomparable` says so, so that a card can say the chart entry
could not be compared rather than stay silent.

The vocabulary sits below the chart readers (records): it reads a FHIR CodeableConcept's text and codings itself
(`concept_parts`), so that the cards and medication reconciliation hand it what they hold.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.vocab._files import DRUGS, read_toml
from ebmrag.vocab.drug_words import MAX_PHRASE, PhraseIndex, acid_forms, fold, words
from ebmrag.vocab.lexicon import TERMS_PATH, ChineseName, drug_mentions, terms

CLASSES_PATH = DRUGS / "drug_classes.toml"
RENAL_PATH = DRUGS / "renal_drugs.toml"
NAMES_PATH = DRUGS / "drug_names.toml"
CODES_PATH = DRUGS / "drug_codes.toml"
CODE_SYSTEMS = {"snomed": "SNOMED CT", "rxnorm": "RxNorm"}  # the code tables of drug_codes.toml
_SYSTEM_LABELS = {**CODE_SYSTEMS, "atc": "ATC", "ndc": "NDC"}
_ATC_LETTERS = frozenset("ABCDGHJLMNPRSV")


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
    ATC codes given, and the drug names of the lexicon (for a drug no class table lists); `unread` holds the
    codes no table knows ((system, code)), `worded` whether the value carried any text or display."""

    ingredients: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()
    families: frozenset[str] = frozenset()
    atc: frozenset[str] = frozenset()
    names: frozenset[str] = frozenset()
    unread: tuple[tuple[str, str], ...] = ()
    worded: bool = False

    def __bool__(self) -> bool:
        return bool(self.ingredients or self.classes or self.families or self.atc or self.names)

    @property
    def opaque(self) -> bool:
        """Named only by codes no table knows, with no word to read: nothing can be said of what it is."""
        return not self and bool(self.unread) and not self.worded


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
class Uncompared:
    """An order and an allergy that could not be compared: `side` ("order", "allergy" or "both") carries only
    codes no table knows and no words; `codes` are those codes as (system label, code), for the card to cite."""

    side: str
    codes: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class RenalGroup:
    name: str  # "biguanide"
    ingredient: str  # the ordered ingredient that put the drug on the list ("metformin"), or an ATC code


@dataclass(frozen=True)
class _Named:
    """What a name of the tables names (a code's name resolved once)."""

    ingredients: frozenset[str] = frozenset()
    classes: frozenset[str] = frozenset()
    families: frozenset[str] = frozenset()


@dataclass
class _Pending:
    phrase: tuple[str, ...]
    value: tuple[str, str]  # (kind, value): ingredient, spelling ("a|b"), brand ("a|b"), class, family, none
    keyed: bool
    where: str


@dataclass
class _Tables:
    pending: list[_Pending] = field(default_factory=list)
    names: PhraseIndex = field(default_factory=PhraseIndex)
    rxnorm: dict[str, str] = field(default_factory=dict)  # ingredient RXCUI -> INN
    coded: dict[tuple[str, str], _Named] = field(default_factory=dict)  # (system key, code) -> what it names


class DrugVocabulary:
    """The class, renal, name and code tables, read and checked once; `identify` reads a coded value,
    `relation` compares an order with an allergy, `uncomparable` says when they could not be compared, and
    `renal_group` says whether an ordered drug is on the renal list."""

    def __init__(self, classes_path: Path = CLASSES_PATH, renal_path: Path = RENAL_PATH,
                 names_path: Path | None = NAMES_PATH, codes_path: Path | None = CODES_PATH,
                 terms_path: Path = TERMS_PATH) -> None:
        raw = _read(classes_path)
        self.families: dict[str, tuple[str, frozenset[str]]] = {}  # id -> (label, class ids)
        self.classes: dict[str, DrugClass] = {}
        self.salts = frozenset(fold(s) for s in _strings(raw, "salts", classes_path))
        self._tables = _Tables()
        self._read_families(raw, classes_path)
        self._read_classes(raw, classes_path)
        for inn in _strings(raw, "other_ingredients", classes_path):
            self._ingredient(_inn(inn), f"{classes_path.name} other_ingredients")
        for name in _strings(raw, "not_drugs", classes_path):
            self._phrase(name, "none", "", f"{classes_path.name} not_drugs")
        renal = _read(renal_path)
        self.renal: list[tuple[str, tuple[str, ...], frozenset[str]]] = []
        self._read_renal(renal, renal_path)
        for path, table in ((classes_path, raw), (renal_path, renal)):
            self._read_spellings(table, "spellings", path, keyed=True)
            self._read_spellings(table, "brands", path, keyed=False)
        if names_path is not None:
            self._read_spellings(_read(names_path), "names", names_path, keyed=False)
        self._index()
        drug_terms = terms(terms_path)
        self._generic = drug_terms.general | drug_terms.chinese_general  # "medication", "药物": no drug of their own
        self._chinese = {name: self._chinese_name(name, means, terms_path) for name, means in drug_terms.chinese.items()
                         if means.kind != "general"}
        self._chinese_names = re.compile("|".join(map(re.escape, sorted(self._chinese, key=len, reverse=True))))
        if codes_path is not None:
            self._read_codes(_read(codes_path), codes_path)

    # ---------------------------------------------------------------------------------------------- reading
    def _phrase(self, text: str, kind: str, value: str, where: str, keyed: bool = True) -> None:
        phrase = tuple(words(text))
        if not phrase or len(phrase) > MAX_PHRASE:
            raise ConfigError(f"{where}: {text!r} must be 1 to {MAX_PHRASE} words")
        known = self._tables.names.exact.get(phrase)
        if known is not None and known != (kind, value) and kind not in ("spelling", "brand"):
            raise ConfigError(f"{where}: {text!r} already names {known[0]} {known[1]!r}")
        self._tables.names.exact.setdefault(phrase, (kind, value))
        self._tables.pending.append(_Pending(phrase, (kind, value), keyed, where))

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
                if not _is_atc(code) or len(code) < 5 or code in owner:
                    raise ConfigError(f"{where}: {code!r} is not an ATC code of level 4 or 5, or belongs to "
                                      f"{owner.get(code)}")
                owner[code] = class_id
                members |= self._ingredients(names, f"{where} atc.{code}")
            self.classes[class_id] = DrugClass(class_id, _string(entry, "label", path), family, tuple(groups),
                                               frozenset(members))
            for word in _strings(entry, "words", path):
                self._phrase(word, "class", class_id, where)

    def _ingredients(self, names: Any, where: str) -> set[str]:
        """INN -> RXCUI table: each name (and its other forms, for an acid) becomes a phrase, each RXCUI a code."""
        if not isinstance(names, dict):
            raise ConfigError(f"{where}: must be a table of INN = \"RXCUI\"")
        found = set()
        for name, cui in names.items():
            if not isinstance(cui, str) or (cui and not cui.isdigit()):
                raise ConfigError(f"{where}: {name!r} = {cui!r}: an RXCUI is digits, or \"\"")
            inn = _inn(name)
            self._ingredient(inn, where)
            if cui and self._tables.rxnorm.setdefault(cui, inn) != inn:
                raise ConfigError(f"{where}: RXCUI {cui} is already {self._tables.rxnorm[cui]!r}")
            found.add(inn)
        return found

    def _ingredient(self, inn: str, where: str) -> None:
        self._phrase(inn, "ingredient", inn, where)
        for form in acid_forms(inn):
            self._phrase(form, "spelling", inn, where)

    def _read_renal(self, raw: Mapping[str, Any], path: Path) -> None:
        for entry in _tables(raw, "group", path):
            name, where = _string(entry, "name", path), f"{path.name} [[group]] {entry.get('name')}"
            codes = tuple(_strings(entry, "atc", path))
            if not all(_is_atc(code) and len(code) >= 5 for code in codes):
                raise ConfigError(f"{where}: atc holds a value that is not an ATC code of level 4 or 5")
            self.renal.append((name, codes, frozenset(self._ingredients(entry.get("ingredients"), where))))

    def _read_spellings(self, raw: Mapping[str, Any], key: str, path: Path, *, keyed: bool) -> None:
        """Other names of ingredients: each maps to one INN or a list (a combination product); an INN named
        here and in no class table ("tazobactam") becomes an ingredient of its own."""
        spellings = raw.get(key, {})
        if not isinstance(spellings, dict):
            raise ConfigError(f"{path}: [{key}] must be a table")
        kind = "spelling" if keyed else "brand"
        for spelling, means in spellings.items():
            targets = [means] if isinstance(means, str) else means
            if not isinstance(targets, list) or not all(isinstance(t, str) and t.strip() for t in targets):
                raise ConfigError(f"{path}: {spelling!r} must map to a name or a list of names")
            inns = [_inn(t) for t in targets]
            for inn in inns:
                if tuple(words(inn)) not in self._tables.names.exact:
                    self._ingredient(inn, f"{path.name} [{key}]")
            self._phrase(spelling, kind, "|".join(inns), f"{path.name} [{key}]", keyed=keyed)

    def _index(self) -> None:
        """Spelling keys for the tables' names, after every class is read (a key shared by a class and one of
        its own members stays the class's; any other shared key is an error in the tables)."""
        names = self._tables.names
        where = {(p.phrase, p.value): p.where for p in self._tables.pending}
        for pending in self._tables.pending:
            names.add(pending.phrase, pending.value, keyed=pending.keyed, prefer=self._prefer)
        if names.clashes:
            phrase, old, new = names.clashes[0]
            raise ConfigError(f"{where.get((tuple(words(phrase)), new), 'drug tables')}: {phrase!r} ({new[0]} "
                              f"{new[1]!r}) is spelled like {old[0]} {old[1]!r}; write one of them otherwise")
        self._tables.pending.clear()

    def _prefer(self, old: tuple[str, str], new: tuple[str, str]) -> tuple[str, str] | None:
        a, b = self._named(old), self._named(new)
        if a == b:
            return old
        for broad, narrow, value in ((a, b, old), (b, a, new)):
            if broad.classes and not broad.ingredients and not narrow.families and narrow.classes <= broad.classes \
                    and all(self._classes_of(i) & broad.classes for i in narrow.ingredients):
                return value
        return None

    def _read_codes(self, raw: Mapping[str, Any], path: Path) -> None:
        """SNOMED CT and RxNorm codes with the name that says what they are; each name must name a drug of
        the tables, and is resolved once here."""
        for system in CODE_SYSTEMS:
            table = raw.get(system, {})
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: [{system}] must be a table of code = \"name\"")
            for code, name in table.items():
                if not code.isdigit() or not isinstance(name, str):
                    raise ConfigError(f"{path}: [{system}] {code!r} = {name!r}: a code is digits, a name text")
                named = self._read_words(name)
                if named == _Named():
                    raise ConfigError(f"{path}: [{system}] {code} = {name!r} names no drug of the tables")
                self._tables.coded[(system, code)] = named

    def _chinese_name(self, name: str, means: ChineseName, path: Path) -> _Named:
        """What a Chinese name of drug_terms.toml names; it must name an ingredient or a class of the tables."""
        if means.kind == "class" and means.value in self.classes:
            return _Named(classes=frozenset({means.value}))
        inn = _inn(means.value)
        if means.kind == "ingredient" and self._tables.names.exact.get(tuple(words(inn))) == ("ingredient", inn):
            return _Named(ingredients=frozenset({inn}))
        raise ConfigError(f"{path}: [chinese] {name!r} names {means.kind} {means.value!r}, which the drug tables "
                          f"do not hold")

    # ---------------------------------------------------------------------------------------------- reading charts
    def identify(self, concepts: Iterable[Any]) -> Identity:
        """What these CodeableConcepts (or plain strings) name, by code and by every word they carry."""
        found: list[_Named] = []
        atc: set[str] = set()
        unread: list[tuple[str, str]] = []
        texts: list[str] = []
        for concept in concepts:
            if isinstance(concept, str):
                texts.append(concept)
                continue
            text, codings = concept_parts(concept)
            texts += text
            for system, code, display in codings:
                texts.append(display)
                code = code.strip()
                if not code:
                    continue
                if (known := self._code(system, code)) is not None:
                    found.append(known)
                elif "atc" in system.lower() and _is_atc(code.upper()):
                    atc.add(code.upper())
                else:
                    unread.append((system, code))
        found += [self._read_words(text) for text in texts]
        ingredients = frozenset(i for n in found for i in n.ingredients)
        families = frozenset(f for n in found for f in n.families)
        classes = {c for n in found for c in n.classes} | {c for i in ingredients for c in self._classes_of(i)}
        classes |= {c.id for c in self.classes.values() if any(code.startswith(g) for code in atc for g in c.atc)}
        for family in families:
            classes |= self.families[family][1]
        names = {n for text in texts for n in drug_mentions(text) if n not in self._generic and n not in self.salts}
        return Identity(ingredients, frozenset(classes), families, frozenset(atc), frozenset(names),
                        tuple(dict.fromkeys(unread)), any(t.strip() for t in texts))

    def _code(self, system: str, code: str) -> _Named | None:
        lowered = system.lower()
        if "rxnorm" in lowered and code in self._tables.rxnorm:
            return _Named(ingredients=frozenset({self._tables.rxnorm[code]}))
        return next((self._tables.coded.get((name, code)) for name in CODE_SYSTEMS if name in lowered), None)

    def _read_words(self, text: str) -> _Named:
        """The ingredients, classes and families a text names (the longest known name at each word, and each
        Chinese name, the longest first)."""
        ingredients: set[str] = set()
        classes: set[str] = set()
        families: set[str] = set()
        for match in (self._chinese_names.finditer(text) if self._chinese else ()):
            named = self._chinese[match.group()]
            ingredients |= named.ingredients
            classes |= named.classes
        for hit in self._tables.names.find(text):
            kind, value = hit.value
            if kind == "none":
                continue
            if kind == "class":
                classes.add(value)
            elif kind == "family":
                families.add(value)
            else:
                ingredients.update(value.split("|"))
        return _Named(frozenset(ingredients), frozenset(classes), frozenset(families))

    def _named(self, value: tuple[str, str]) -> _Named:
        kind, name = value
        if kind == "none":
            return _Named()
        if kind == "class":
            return _Named(classes=frozenset({name}))
        if kind == "family":
            return _Named(families=frozenset({name}), classes=self.families[name][1])
        inns = frozenset(name.split("|"))
        return _Named(inns, frozenset(c for i in inns for c in self._classes_of(i)))

    def _classes_of(self, ingredient: str) -> frozenset[str]:
        return frozenset(c.id for c in self.classes.values() if ingredient in c.members)

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

    def uncomparable(self, order: Identity, allergy: Identity) -> Uncompared | None:
        """Why an order and a recorded allergy could not be compared: one of them (or both) is opaque, named
        only by codes no table knows. None when both were read, whether or not they relate; a card then says
        the chart entry could not be compared instead of staying silent."""
        opaque = [(side, identity) for side, identity in (("order", order), ("allergy", allergy)) if identity.opaque]
        if not opaque:
            return None
        side = opaque[0][0] if len(opaque) == 1 else "both"
        codes = tuple((system_label(system), code) for _, identity in opaque for system, code in identity.unread)
        return Uncompared(side, codes)

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


def concept_parts(concept: Any) -> tuple[list[str], list[tuple[str, str, str]]]:
    """A FHIR CodeableConcept's text (a list of one, or none) and its codings as (system, code, display), read
    leniently: a missing or malformed part is empty, a lone coding object is a list of one."""
    concept = concept if isinstance(concept, Mapping) else {}
    text, coding = concept.get("text"), concept.get("coding")
    listed = [coding] if isinstance(coding, Mapping) else coding if isinstance(coding, list) else []
    return [text] if isinstance(text, str) else [], [
        (str(c.get("system") or ""), str(c.get("code") or ""), str(c.get("display") or ""))
        for c in listed if isinstance(c, Mapping)]


def system_label(system: str) -> str:
    """A code system as a card names it: "RxNorm", "SNOMED CT", "ATC", else the system's URI as written."""
    lowered = system.lower()
    return next((label for part, label in _SYSTEM_LABELS.items() if part in lowered), system or "no system")


def _inn(name: str) -> str:
    return " ".join(words(name))


def _is_atc(code: str) -> bool:
    """An ATC code of any level: A, A01, A01A, A01AA, A01AA01."""
    shapes = {1: "L", 3: "LDD", 4: "LDDL", 5: "LDDLL", 7: "LDDLLDD"}
    shape = shapes.get(len(code))
    return shape is not None and code[0] in _ATC_LETTERS and all(
        (c.isdigit() if s == "D" else c.isascii() and c.isupper()) for c, s in zip(code, shape, strict=True))


def _read(path: Path) -> dict[str, Any]:
    return read_toml(path, "drug vocabulary")


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
