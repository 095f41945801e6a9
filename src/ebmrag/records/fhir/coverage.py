"""Whether every populated element of a chart's resources reaches a fragment: the coverage audit.

A renderer reads the elements it knows; one it does not know (a component's interpretation, a note on an allergy, a
producer's extension) would be dropped without a word. The audit walks each resource's JSON, lists its populated
elements by path ("Observation.component.valueCodeableConcept", list positions left out) and decides each one:

- documented: an element kind that carries no clinical content (ids, identifiers, links to who recorded it, statuses
  the reader decides by, narrative the structured elements repeat): rules/records/coverage.toml lists each with why;
- rendered: its words are in the text of the resource's fragments, or of those of a resource that points at it (a
  panel reads its members, a medication order its Medication): a concept by its text, a display or its code, a
  number as a number (however many digits a renderer kept), a date by its day or the fragment's date, a reference by
  its display or the name of what it points at, free text by its words;
- otherwise clinical and not yet said: returned, so the reader appends it to the resource in words (fhir.generic),
  and checked again against that line (`Audit.confirm`): what even the line does not say is counted unrendered.

The audit matches words, not what a renderer is known to read: renderers change, and the audit must not follow them.
A resource its renderer chose not to pack (entered in error, refuted, a visit that only groups its records, a note
already read) is withheld whole: that decision is the renderer's, and the trace names it (`record.skipped`).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ebmrag.records.fhir.coding import objects, text_of, without_semantic_tags
from ebmrag.records.fhir.index import ChartIndex, Resource, reference_of, type_id
from ebmrag.records.fragment import Coverage, Fragment
from ebmrag.rules import rule_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Element:
    """One populated element: a data type read whole (a CodeableConcept, a Quantity, a Reference, a Period) or a
    primitive. `about` names the coded element it sits in ("Gene studied" for a component's value), `depth` how many
    names of the path lead to that element (so a line can say "component Gene studied: BRCA1"), and `owner` is
    that element (id() of its JSON object; the resource's for an element outside any), whose `code` names it."""

    path: str
    shape: str  # concept, coding, reference, quantity, period, range, ratio, note, attachment, narrative, identifier,
    # uri (a primitive that is a link), value (any other primitive)
    value: Any
    about: str = ""
    depth: int = 0
    owner: int = 0

    @property
    def names_owner(self) -> bool:
        """The `code` that names its resource or its coded element (a component's, a reaction's)."""
        return self.path.endswith(".code") and self.shape == "concept"


@dataclass(frozen=True)
class Rule:
    name: str
    why: str
    paths: tuple[str, ...]
    shapes: frozenset[str]
    pattern: re.Pattern[str]  # the paths as one expression (`*`: any run of characters, dots included)


@dataclass(frozen=True)
class Rules:
    """rules/records/coverage.toml: the documented non-clinical element kinds, and the generic renderer's words."""

    documented: tuple[Rule, ...]
    datatypes: tuple[str, ...]  # longest first, so "DateTime" is dropped before "Time"
    time_keys: tuple[str, ...]
    taken_back: frozenset[str]  # statuses that keep a resource no renderer reads from being said
    defaults: tuple[tuple[re.Pattern[str], Any], ...]  # (element paths, the value FHIR gives them when missing)

    def stated_default(self, element: Element) -> bool:
        """Whether the element states what FHIR means when it is missing ("doNotPerform": false): it says nothing
        its absence would not."""
        return element.shape == "value" and any(
            type(element.value) is type(value) and element.value == value and pattern.match(element.path)
            for pattern, value in self.defaults)

    def documented_as(self, element: Element) -> str:
        """The name of the rule that documents this element as non-clinical, or ""."""
        for rule in self.documented:
            if element.shape in rule.shapes or rule.pattern.match(element.path):
                return rule.name
        return ""


EMPTY = "empty"  # the rule an element with no words is counted under
DEFAULT = "stated default"  # the rule an element that states its meaning-when-missing is counted under
HEADING = "panel heading"  # the rule a panel's unsaid name alone is counted under
_MEMBERS = ("hasMember", "result")  # the elements a panel lists its members in


def _translate(path: str) -> str:
    """A documented path as an expression: `*` any run of characters (dots included); a path covers the elements
    inside it too ("*.status" covers "Observation.status.extension:code-specification.valueCodeableConcept")."""
    return "(?:" + ".*".join(re.escape(part) for part in path.split("*")) + r")(?:\..*)?\Z"


@rule_file("records/coverage.toml")
def coverage_rules(raw: Mapping[str, Any]) -> Rules:
    rules = []
    for n, entry in enumerate(raw["documented"], 1):
        name, why, paths = entry["name"], entry["why"], entry.get("paths", [])
        if not isinstance(name, str) or not name or not isinstance(why, str) or not why.strip():
            raise ValueError(f"[[documented]] {n} needs a `name` and a one-line `why`")
        if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
            raise ValueError(f"[[documented]] {name!r}: `paths` must be a list of element paths")
        pattern = re.compile("|".join(_translate(p) for p in paths) or r"(?!)")
        rules.append(Rule(name, why, tuple(paths), frozenset(entry.get("shapes", [])), pattern))
    for needed in (EMPTY, HEADING):
        if needed not in {r.name for r in rules}:
            raise ValueError(f"[[documented]] needs the rule {needed!r} (the audit counts elements under it)")
    generic = raw["generic"]
    datatypes = tuple(sorted((str(d) for d in generic["datatypes"]), key=len, reverse=True))
    defaults = raw["defaults"]
    if not isinstance(defaults.get("why"), str) or not isinstance(defaults.get("elements"), Mapping):
        raise ValueError("[defaults] needs a one-line `why` and an `elements` table of path = value")
    return Rules(tuple(rules), datatypes, tuple(str(k) for k in generic["time_keys"]),
                 frozenset(str(s) for s in generic["taken_back"]),
                 tuple((re.compile(_translate(path)), value) for path, value in defaults["elements"].items()))


# ------------------------------------------------------------------ the walk: a resource -> its elements
_ALWAYS = frozenset({"id", "extension"})
# (shape, the keys it may have besides id and extension, the keys one of which it must have), first match wins.
_SHAPES: tuple[tuple[str, frozenset[str], frozenset[str]], ...] = (
    ("narrative", frozenset({"status", "div"}), frozenset({"div"})),
    ("concept", frozenset({"coding", "text", "originalText"}), frozenset({"coding", "text"})),
    ("coding", frozenset({"system", "version", "code", "display", "userSelected"}), frozenset({"code", "display"})),
    ("reference", frozenset({"reference", "display", "type", "identifier"}), frozenset({"reference", "display"})),
    ("period", frozenset({"start", "end"}), frozenset({"start", "end"})),
    ("range", frozenset({"low", "high"}), frozenset({"low", "high"})),
    ("ratio", frozenset({"numerator", "denominator"}), frozenset({"numerator", "denominator"})),
    ("note", frozenset({"text", "time", "authorString", "authorReference"}), frozenset({"text"})),
    ("attachment", frozenset({"contentType", "language", "data", "url", "size", "hash", "title", "creation", "height",
                              "width", "frames", "duration", "pages"}), frozenset({"data", "url"})),
)
_QUANTITY = frozenset({"value", "unit", "system", "code", "comparator"})
_IDENTIFIER = frozenset({"use", "type", "system", "value", "period", "assigner"})
_NUMBER = re.compile(r"(?:(?<![\w)\]/%])[-+])?(?:\d+(?:[.,]\d*)?|[.,]\d+)(?:[eE][-+]?\d+)?")  # "3.5-5.5": two
_URI = re.compile(r"^(?:https?|urn|ftp|oid):\S+$", re.IGNORECASE)
_DATE = re.compile(r"^\d{4}(?:-\d{2}(?:-\d{2})?)?(?:T[\d:.]+(?:Z|[+-]\d{2}:?\d{2})?)?$")


def _shape(key: str, node: Mapping[str, Any]) -> str:
    keys = set(node) - _ALWAYS
    if not keys:
        return ""
    if key == "identifier" or key.endswith("Identifier"):
        return "identifier"
    for shape, allowed, needed in _SHAPES:
        if keys <= allowed and keys & needed and all(_typed(shape, k, node[k]) for k in keys & needed):
            return shape
    if "value" in keys and keys <= _QUANTITY and _is_number(node["value"]):
        return "quantity"
    if "value" in keys and keys <= _IDENTIFIER:
        return "identifier"
    return ""


def _typed(shape: str, key: str, value: Any) -> bool:
    """Whether `value` has the type its key has in the data type: a condition's {"code": CodeableConcept} is no
    Coding, a reaction's {"note": [...]} no Annotation."""
    if shape in ("range", "ratio") or (shape == "concept" and key == "coding"):
        return isinstance(value, (Mapping, list))
    return not isinstance(value, (Mapping, list))


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or (isinstance(value, str) and bool(_NUMBER.fullmatch(value.strip())))


def elements(resource: Resource) -> list[Element]:
    """Every populated element of the resource, its contained resources' included (named from their own type)."""
    found: list[Element] = []
    _walk(resource, str(resource.get("resourceType") or "Resource"), found, _Place("", 0, id(resource)), top=True)
    return found


@dataclass(frozen=True)
class _Place:
    """Where the walk is: the coded element it is inside (its words, the path depth it starts at, its id())."""

    about: str
    depth: int
    owner: int


def _walk(node: Any, path: str, found: list[Element], place: _Place, top: bool = False) -> None:
    if isinstance(node, list):
        for item in node:
            _walk(item, path, found, place)
        return
    if isinstance(node, Mapping):
        shape = "" if top else _shape(path.rsplit(".", 1)[-1], node)
        if shape:
            found.append(Element(path, shape, node, place.about, place.depth, place.owner))
            return
        inner = place
        if not top and isinstance(node.get("code"), Mapping):  # a component, a reaction, a relative's condition
            inner = _Place(_concept_words(node["code"]), path.count("."), id(node))
        for key, value in node.items():
            # the code that names an element is said under the element's parent, not under its own name
            _walk_key(str(key), value, path, found, _Place(place.about, place.depth, inner.owner)
                      if key == "code" else inner, top)
        return
    if node is not None and node != "":
        shape = "uri" if isinstance(node, str) and _URI.match(node.strip()) else "value"
        found.append(Element(path, shape, node, place.about, place.depth, place.owner))


def _walk_key(key: str, value: Any, path: str, found: list[Element], place: _Place, top: bool) -> None:
    if key == "resourceType" and top:
        return
    if key == "contained":
        for resource in objects(value):
            found += elements(resource)
        return
    if key in ("extension", "modifierExtension"):
        for extension in objects(value):
            url = extension.get("url")
            slug = url.rstrip("/").rsplit("/", 1)[-1] if isinstance(url, str) and url else "unnamed"
            _walk({k: v for k, v in extension.items() if k != "url"}, f"{path}.{key}:{slug}", found, place)
        return
    name = key[1:] if key.startswith("_") else key  # "_birthDate": the primitive's own extensions
    _walk(value, f"{path}.{name}", found, place)


def _concept_words(concept: Mapping[str, Any]) -> str:
    text = concept.get("text")
    if isinstance(text, str) and text.strip():
        return without_semantic_tags(text.strip())
    for coding in objects(concept.get("coding")):
        if isinstance(coding.get("display"), str) and coding["display"].strip():
            return without_semantic_tags(coding["display"].strip())
    return ""


# ------------------------------------------------------------------ what the fragments say
@dataclass(frozen=True)
class Said:
    """The words of some fragments, ready to be searched: text (case-folded, spaces collapsed), numbers, days."""

    text: str
    words: frozenset[str]
    numbers: tuple[float, ...]
    days: frozenset[str]

    @classmethod
    def of(cls, fragments: Iterable[Fragment]) -> Said:
        fragments = list(fragments)
        text = _norm(" \n ".join(f.text for f in fragments))
        return cls(text, frozenset(re.findall(r"\w+", text)), tuple(_numbers(text)),
                   frozenset(f.timestamp.date().isoformat() for f in fragments if f.timestamp is not None))

    def says(self, words: str) -> bool:
        """The words appear, as whole words; a long text (a note reflowed into sections) when nine in ten of its
        words do."""
        wanted = _norm(without_semantic_tags(words))
        if not wanted:
            return False
        if re.search(rf"(?<!\w){re.escape(wanted)}(?!\w)", self.text):
            return True
        tokens = re.findall(r"\w+", wanted)
        return len(tokens) >= 8 and sum(t in self.words for t in tokens) >= 0.9 * len(tokens)

    def says_number(self, value: Any) -> bool:
        try:
            number = float(str(value).strip().replace(",", "."))
        except ValueError:
            return False
        return any(abs(n - number) <= max(1e-9, 5e-4 * abs(number)) for n in self.numbers)

    def says_day(self, value: str) -> bool:
        day = value.strip()[:10]
        return day in self.text or any(d.startswith(day) for d in self.days)


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _numbers(text: str) -> Iterable[float]:
    for match in _NUMBER.finditer(text):
        try:
            yield float(match.group().replace(",", "."))
        except ValueError:
            continue


# A member every report of a chart lists (real exports repeat panels) is checked against the first of them: they say
# the same member, and checking against all would make the audit cubic in the chart's size.
_MAX_READER_FRAGMENTS = 16

Names = Callable[[Mapping[str, Any]], list[str]]  # a Reference -> the words that name what it points at


def rendered(element: Element, said: Said, names: Names) -> bool:
    """Whether the fragments say this element (see the module's docstring for how each kind is matched)."""
    value = element.value
    shape = element.shape
    if shape == "concept":
        return any(said.says(w) for w in _concept_candidates(value))
    if shape == "coding":
        return any(said.says(w) for w in _coding_candidates(value))
    if shape == "reference":
        display = value.get("display")
        return any(said.says(w) for w in [display if isinstance(display, str) else "", *names(value)])
    if shape == "quantity":
        return said.says_number(value.get("value"))
    if shape in _PARTS:
        parts = [value[k] for k in _PARTS[shape] if value.get(k) not in (None, "", [], {})]
        return bool(parts) and all(_part_said(p, said) for p in parts)
    if shape == "note":
        return said.says(str(value.get("text") or ""))
    if value is True and said.says(_flag_words(element.path)):
        return True  # "doNotPerform": true is said by "do not give ...", "asNeededBoolean" by "as needed"
    return _part_said(value, said)


def _flag_words(path: str) -> str:
    """A boolean element's first two words: "MedicationRequest.doNotPerform" -> "do not"."""
    words = re.findall(r"[a-z]+|[A-Z][a-z]*", path.rsplit(".", 1)[-1])
    return " ".join(w.lower() for w in words[:2])


_PARTS = {"period": ("start", "end"), "range": ("low", "high"), "ratio": ("numerator", "denominator")}


def _part_said(value: Any, said: Said) -> bool:
    if isinstance(value, Mapping):
        return said.says_number(value["value"]) if "value" in value else False
    if isinstance(value, bool):
        return said.says("true" if value else "false") or said.says("yes" if value else "no")
    if isinstance(value, (int, float)):
        return said.says_number(value)
    text = str(value)
    if _DATE.match(text.strip()):
        return said.says_day(text)
    if _is_number(text):
        return said.says_number(text)
    return said.says(text)


def _concept_candidates(concept: Mapping[str, Any]) -> list[str]:
    """The words that say a concept: the reader's own (text_of: its text, original text or display, what is not
    clinical language passed over), its text, each coding's display and code."""
    text = concept.get("text")
    return [text_of(concept), text if isinstance(text, str) else "",
            *(w for c in objects(concept.get("coding")) for w in _coding_candidates(c))]


def _coding_candidates(coding: Mapping[str, Any]) -> list[str]:
    return [str(coding[k]) for k in ("display", "code") if isinstance(coding.get(k), (str, int)) and coding[k] != ""]


def has_words(element: Element, names: Names) -> bool:
    """Whether the element has anything to say: a coding without a code or display, a reference to nothing that
    names nothing, a period without dates, does not."""
    value = element.value
    if element.shape == "concept":  # the reader's words: a display that is not clinical language says nothing
        return bool(text_of(value))
    if element.shape == "coding":
        return bool(text_of({"coding": [value]}))
    if element.shape == "reference":
        return bool((isinstance(value.get("display"), str) and value["display"].strip()) or names(value))
    if element.shape == "value":
        return str(value).strip() != ""
    return True


# ------------------------------------------------------------------ the audit of one chart
class Leftover(NamedTuple):
    """A resource's clinical elements no fragment says, and the fragment its line joins (its own first, else the
    first of a resource that reads it; None: it has none, and the line is its only one)."""

    items: list[Element]
    like: Fragment | None


WITHHELD = "withheld by its reader (named in the trace)"
UNREAD_PARTY = "read through the resources that point at it; no clinical record of this chart does"


@dataclass
class Read:
    """One resource as the reader left it: its fragments, and whether its renderer chose to pack nothing."""

    resource: Resource
    fragments: Sequence[Fragment]
    withheld: bool = False
    through_others: bool = False  # read only through the resources that point at it (a Medication, a Device)


@dataclass
class Audit:
    """The coverage of one chart, counted as its resources are checked (`leftovers`, then `confirm`)."""

    index: ChartIndex
    rules: Rules = field(default_factory=coverage_rules)
    elements: int = 0
    rendered: int = 0
    documented: Counter[str] = field(default_factory=Counter)
    generic: Counter[str] = field(default_factory=Counter)
    unrendered: Counter[str] = field(default_factory=Counter)
    _kinds: dict[tuple[str, str], str] = field(default_factory=dict)  # (path, shape) -> the rule documenting it

    def leftovers(self, reads: Sequence[Read]) -> dict[int, Leftover]:
        """id(resource) -> its clinical elements that no fragment says, for every resource that has any. A resource
        is checked against its own fragments and those of the resources that point at it (`_Readers`)."""
        walked = [(read, self._elements(read.resource)) for read in reads]
        readers = _Readers(walked, self.target)
        found: dict[int, Leftover] = {}
        for read, items in walked:
            try:
                left = self._left(read, items, readers)
            except Exception as exc:  # a shape nothing foresaw costs this resource's audit, never the chart
                self._not_audited(read.resource, exc)
                continue
            if left is not None:
                found[id(read.resource)] = left
        return found

    def _elements(self, resource: Resource) -> list[Element]:
        try:
            return elements(resource)
        except Exception as exc:  # as in `leftovers`
            self._not_audited(resource, exc)
            return []

    def _not_audited(self, resource: Resource, exc: Exception) -> None:
        kind = resource.get("resourceType")
        log.debug("the coverage audit of a %s failed: %s", kind, type(exc).__name__)
        self.unrendered[f"{kind} (could not be audited)"] += 1

    def _left(self, read: Read, items: list[Element], readers: _Readers) -> Leftover | None:
        """One resource's leftover, or None when every element is said or documented."""
        why = WITHHELD if read.withheld and id(read.resource) not in self.index.in_panel else \
            UNREAD_PARTY if read.through_others and not readers.any(read.resource) else ""
        if why:  # withheld by its renderer; an authoring system, a device no record names
            self.elements += len(items)
            self.documented[why] += len(items)
            return None
        clinical = self._clinical(items)
        if not clinical:
            return None
        others = readers.of(read.resource)[:_MAX_READER_FRAGMENTS]
        left = self._unsaid(clinical, Said.of([*read.fragments, *others]))
        if _heading_only(read.resource, left):
            self.documented[HEADING] += 1
            return None
        if not left:
            return None
        main = [f for f in [*read.fragments, *others] if "#" not in f.id]  # a line, not a note's section
        return Leftover(left, next(iter([*main, *read.fragments, *others]), None))

    def confirm(self, items: Sequence[Element], line: Sequence[Fragment]) -> None:
        """Count the leftovers the generic line says (`generic`) and those even it does not (`unrendered`)."""
        said = Said.of(line)
        for element in items:
            (self.generic if rendered(element, said, self.names) else self.unrendered)[element.path] += 1

    def report(self) -> Coverage:
        return Coverage(self.elements, self.rendered, _sorted(self.documented), _sorted(self.generic),
                        _sorted(self.unrendered))

    def names(self, link: Mapping[str, Any]) -> list[str]:
        """The words that name what a Reference points at (its code's text or displays), without recording it as
        dangling: the audit only looks."""
        target = self.target(link)
        if target is None:
            return []
        words: list[str] = []
        for key in ("code", "vaccineCode", "medicationCodeableConcept", "type"):
            if isinstance(target.get(key), Mapping):
                words += [w for w in _concept_candidates(target[key]) if w]
        return words

    def target(self, link: Mapping[str, Any], within: Resource | None = None) -> Resource | None:
        """What a Reference points at in the chart (a `#id` in `within`'s contained resources), or None."""
        reference = reference_of(link)
        if not reference:
            return None
        if reference.startswith("#"):
            return next((c for c in objects((within or {}).get("contained")) if c.get("id") == reference[1:]), None)
        return self.index.resources.get(reference) or self.index.resources.get(type_id(reference))

    def _clinical(self, items: Sequence[Element]) -> list[Element]:
        """The elements that carry clinical content; the others counted under the rule that documents them."""
        clinical = []
        for element in items:
            self.elements += 1
            key = (element.path, element.shape)  # a chart repeats its paths: each is matched once
            if key not in self._kinds:
                self._kinds[key] = self.rules.documented_as(element)
            rule = self._kinds[key] or (DEFAULT if self.rules.stated_default(element) else "") \
                or ("" if has_words(element, self.names) else EMPTY)
            if rule:
                self.documented[rule] += 1
            else:
                clinical.append(element)
        return clinical

    def _unsaid(self, items: Sequence[Element], said: Said) -> list[Element]:
        """The clinical elements `said` does not say, the rest counted. A `code` that names something of which
        other elements are said counts as said: the renderer named it in its own words ("Variant: c.35G>A" for a
        component coded "Discrete genetic variant")."""
        left: list[Element] = []
        named: set[int] = set()  # owners of which something is said
        for element in items:
            if rendered(element, said, self.names):
                self.rendered += 1
                if not element.names_owner:
                    named.add(element.owner)
            else:
                left.append(element)
        unsaid = [e for e in left if not (e.names_owner and e.owner in named)]
        self.rendered += len(left) - len(unsaid)
        return unsaid


_MAX_CHAIN = 8  # report -> panel -> panel -> member: real ones nest two or three deep (fhir.results reads eight)


def _heading_only(resource: Resource, left: Sequence[Element]) -> bool:
    """Whether all that is unsaid of a panel is its own name."""
    return len(left) == 1 and left[0].path == f"{resource.get('resourceType')}.code" \
        and any(objects(resource.get(key)) for key in _MEMBERS)


class _Readers:
    """Which resources read a resource: those whose references point at it, directly or through resources that
    point at it in turn (a report reads a panel that reads its members; `_MAX_CHAIN` links up at most). Their
    fragments are gathered only for a resource that has clinical elements to check."""

    def __init__(self, walked: Sequence[tuple[Read, list[Element]]],
                 target: Callable[[Mapping[str, Any], Resource], Resource | None]) -> None:
        self.fragments = {id(read.resource): read.fragments for read, _ in walked}
        self.pointed: dict[int, list[int]] = {}  # id(resource) -> id() of the resources that point at it
        for read, items in walked:
            for element in items:
                if element.shape == "reference" and (found := target(element.value, read.resource)) is not None \
                        and found is not read.resource:
                    self.pointed.setdefault(id(found), []).append(id(read.resource))

    def of(self, resource: Resource, first_only: bool = False) -> list[Fragment]:
        seen, layer, found = {id(resource)}, [id(resource)], []
        for _ in range(_MAX_CHAIN):
            layer = list(dict.fromkeys(r for t in layer for r in self.pointed.get(t, ()) if r not in seen))
            seen.update(layer)
            found += [f for r in layer for f in self.fragments.get(r, ())]
            if (found and first_only) or not layer:
                break
        return found

    def any(self, resource: Resource) -> bool:
        return bool(self.of(resource, first_only=True))


def _sorted(counts: Counter[str]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
