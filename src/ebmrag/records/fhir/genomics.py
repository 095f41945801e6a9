"""Genomic results (HL7 FHIR Genomics Reporting IG) -> one line per finding: a variant with its gene, HGVS,
zygosity and classification; a genotype or haplotype; a diagnostic or therapeutic implication that names the
variant or genotype it derives from and the drugs it affects.

Why a reader of its own: a genomic Observation's value is only "Present"; what a clinician needs (the gene, the
variant, the drug) sits in `Observation.component` under LOINC codes, and in Observations that point at each other
(`derivedFrom`, `hasMember`). Read as an ordinary result, a tumour report became "Genetic variant assessment:
Present" twelve times. Which codes and profiles make an Observation genomic, and what role each component plays,
are data (rules/records/genomics.toml); the shape of each line is here. Every component is said once: the ones a
line is built from in their place, every other one after them as "name: value", so nothing a report sends is lost.

The sections all say "Genomic", which the tier rule section.genetic (rules/evidence/tiers.toml) ranks T1.

`observation` and `report` are the chart reader's renderers for every Observation and DiagnosticReport: what is not
genomic goes on to the ordinary result reader (records/fhir/results.py), which knows nothing of this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.records.fhir import results as ordinary
from ebmrag.records.fhir.coding import codings, concepts, obj, objects, strings, text_of, without_semantic_tags
from ebmrag.records.fhir.index import ChartIndex, Resource
from ebmrag.records.fhir.rendered import Rendered, Skip, codes_of
from ebmrag.records.fhir.results import component_text, observation_line, report_parts, value_of
from ebmrag.rules import rule_file

ROLES = frozenset({"gene", "variation", "c_hgvs", "p_hgvs", "g_hgvs", "transcript", "dbsnp", "ref_allele",
                   "alt_allele", "allelic_state", "source_class", "significance", "condition", "medication",
                   "effect", "evidence"})
_CONTAINER = "grouper"
_MAX_DEPTH = 8  # groupers of groupers of ...: real reports nest two or three deep
_MAX_MEMBERS = 500  # results read under one report or panel: members shared between panels cannot fan out
_IMPLICATIONS = ("diagnostic_implication", "therapeutic_implication", "prognostic_implication",
                 "molecular_consequence")


@dataclass(frozen=True)
class Kind:
    """One kind of genomic Observation: the codes and profiles that say it, and how its line opens."""

    name: str
    codes: frozenset[tuple[str, str]]  # ("loinc" | "ig", code)
    profiles: frozenset[str]
    label: str
    section: str


@dataclass(frozen=True)
class Genomics:
    """rules/records/genomics.toml, read."""

    kinds: tuple[Kind, ...]
    ig_system: str
    report_codes: frozenset[str]
    report_profiles: frozenset[str]
    report_categories: frozenset[str]
    report_section: str
    roles: Mapping[str, str]  # component code -> role
    names: Mapping[str, str]  # code -> name, for codes sent without a display
    recommendation_profiles: frozenset[str]
    recommendation_extensions: frozenset[str]
    drug_systems: tuple[str, ...]


def _words(raw: Mapping[str, Any], key: str, where: str) -> frozenset[str]:
    found = raw.get(key, [])
    if not isinstance(found, list) or not all(isinstance(x, str) and x for x in found):
        raise ValueError(f"[{where}] {key} must be a list of non-empty strings")
    return frozenset(found)


@rule_file("records/genomics.toml")
def genomics(raw: Mapping[str, Any]) -> Genomics:
    kinds = []
    for name, spec in raw["kind"].items():
        codes = {("loinc", c) for c in _words(spec, "loinc", f"kind.{name}")} | {
            ("ig", c) for c in _words(spec, "ig", f"kind.{name}")}
        if not codes:
            raise ValueError(f"[kind.{name}] needs `loinc` or `ig` codes")
        kinds.append(Kind(name, frozenset(codes), _words(spec, "profiles", f"kind.{name}"), str(spec["label"]),
                          str(spec["section"])))
    if _CONTAINER not in {k.name for k in kinds}:
        raise ValueError(f"[kind.{_CONTAINER}] is needed: a panel of genomic results is read member by member")
    roles = dict(raw["role"])
    if unknown := sorted(set(roles.values()) - ROLES):
        raise ValueError(f"[role] names unknown roles {unknown}; known: {sorted(ROLES)}")
    report, recommendation = raw["report"], raw["recommendation"]
    return Genomics(tuple(kinds), str(raw["ig_system"]), _words(report, "loinc", "report"),
                    _words(report, "profiles", "report"), _words(report, "categories", "report"),
                    str(report["section"]), roles, {str(k): str(v) for k, v in raw["names"].items()},
                    _words(recommendation, "profiles", "recommendation"),
                    _words(recommendation, "extensions", "recommendation"),
                    tuple(sorted(_words(recommendation, "drug_systems", "recommendation"))))


# ---------------------------------------------------------------- recognising

def profiles_of(r: Resource) -> set[str]:
    """The names of the profiles a resource declares: the last part of each URL, without its version."""
    return {url.split("|", 1)[0].rstrip("/").rsplit("/", 1)[-1] for url in strings(obj(r.get("meta")).get("profile"))}


def _coded_as(concept: Any) -> set[tuple[str, str]]:
    table = genomics()
    found = set()
    for system, code, _ in codings(concept):
        if "loinc" in system:
            found.add(("loinc", code))
        elif table.ig_system in system:
            found.add(("ig", code))
    return found


def kind_of(r: Resource) -> Kind | None:
    """The kind of genomic Observation `r` is, by its code first and its declared profile second; None when it
    is not one."""
    if r.get("resourceType") != "Observation":
        return None
    kinds = genomics().kinds
    coded = _coded_as(r.get("code"))
    by_code = next((k for k in kinds if k.codes & coded), None)
    if by_code is not None:
        return by_code
    declared = profiles_of(r)
    return next((k for k in kinds if k.profiles & declared), None)


def is_genomic(r: Resource | None) -> bool:
    """A genomic Observation or report."""
    if r is None:
        return False
    if r.get("resourceType") == "DiagnosticReport":
        return _report_says_genomic(r)
    return kind_of(r) is not None


def _report_says_genomic(r: Resource) -> bool:
    table = genomics()
    return bool({c for s, c in _coded_as(r.get("code")) if s == "loinc"} & table.report_codes
                or profiles_of(r) & table.report_profiles
                or set(codes_of(r.get("category"))) & table.report_categories)


# ---------------------------------------------------------------- reading components

def name_of(concept: Any) -> str:
    """A concept's words; a genomic code sent without a display by its LOINC or IG name; else `text_of`."""
    concept = obj(concept)
    if (isinstance(concept.get("text"), str) and concept["text"].strip()) or any(d for _, _, d in codings(concept)):
        return text_of(concept)
    names = genomics().names
    return next((names[code] for _, code, _ in codings(concept) if code in names), "") or text_of(concept)


def said(element: Mapping[str, Any]) -> str:
    """A genomic value as written: a coded value's text or display, else its LOINC answer's name, else its bare
    code; any other type as results.value_of reads it. Not `text_of`: an HGVS expression, a dbSNP id or a star
    allele is its own name, so a display that repeats the code, or has the shape of an identifier, is the value
    itself here, never a placeholder to pass over."""
    concept = element.get("valueCodeableConcept")
    if not isinstance(concept, Mapping):
        return value_of(element)
    text = concept.get("text")
    display = next((d.strip() for _, _, d in codings(concept) if d.strip()), "")
    if (isinstance(text, str) and text.strip()) or display:
        return without_semantic_tags(text.strip() if isinstance(text, str) and text.strip() else display)
    names = genomics().names
    codes = [code for _, code, _ in codings(concept) if code]
    return next((names[c] for c in codes if c in names), "") or (codes[0] if codes else "")


@dataclass
class _Parts:
    """An Observation's components sorted by role, and the rest in their order, each to be said once."""

    by_role: dict[str, list[str]]
    rest: list[str]

    def first(self, role: str) -> str:
        return next(iter(self.by_role.get(role, [])), "")

    def all(self, role: str) -> list[str]:
        return list(dict.fromkeys(self.by_role.get(role, [])))


def _parts(r: Resource) -> _Parts:
    roles = genomics().roles
    by_role: dict[str, list[str]] = {}
    rest: list[str] = []
    for component in objects(r.get("component")):
        role = next((roles[code] for _, code, _ in codings(component.get("code")) if code in roles), "")
        value = said(component)
        if role and value:
            by_role.setdefault(role, []).append(value)
        elif value:
            rest.append(f"{name_of(component.get('code')) or 'component'}: {value}")
        elif (absent := component_text(component, name_of(component.get("code")))):
            rest.append(absent)  # "Allelic state: not recorded (unknown)"
    return _Parts(by_role, rest)


def _join_new(words: Sequence[str], sep: str = " ") -> str:
    """The words in order, each left out when what is already said contains it ("NM_014049.4(ACAD9):c.1249C>T"
    already says "ACAD9" and "c.1249C>T")."""
    line = ""
    for word in words:
        if word and word.strip("()").lower() not in line.lower():
            line = f"{line}{sep}{word}" if line else word
    return line


_VARIANT_ROLES = ("gene", "variation", "c_hgvs", "p_hgvs", "g_hgvs", "transcript", "dbsnp", "ref_allele",
                  "alt_allele")
_ROLE_LABELS = {"significance": "clinical significance", "condition": "condition", "evidence": "evidence",
                "medication": "medication assessed", "transcript": "transcript", "gene": "gene",
                "dbsnp": "dbSNP", "ref_allele": "ref allele", "alt_allele": "alt allele", "variation": "variant",
                "c_hgvs": "c.HGVS", "p_hgvs": "p.HGVS", "g_hgvs": "g.HGVS", "allelic_state": "", "source_class": "",
                "effect": ""}


def variant_name(r: Resource, parts: _Parts | None = None) -> str:
    """"CYP2C9 NM_000771.4:c.1075A>C (p.Ile359Leu)", "JAK2 9:g.5073770G>T (p.Val617Phe)", "CYP2C9 rs12345 T>G":
    the gene and the variant from whatever the components give; a variant's full name (ClinVar style) first
    when it has one, then only what that name does not already say."""
    parts = parts or _parts(r)
    variation, coding, transcript = parts.first("variation"), parts.first("c_hgvs"), parts.first("transcript")
    if coding and transcript and ":" not in coding and coding.lower() not in variation.lower():
        coding = f"{transcript}:{coding}"  # a transcript and its change are one expression, unless already said
    protein = parts.first("p_hgvs")
    ref, alt = parts.first("ref_allele"), parts.first("alt_allele")
    alleles = f"{ref or '?'}>{alt or '?'}" if ref or alt else ""
    return _join_new([variation, ", ".join(parts.all("gene")), coding, parts.first("g_hgvs"),
                      f"({protein})" if protein else "", parts.first("dbsnp"), alleles])


def _rest(parts: _Parts, used: Sequence[str]) -> list[str]:
    """What a line has not said yet: the components of the roles it did not use ("evidence: AMP guidelines"),
    then every component of no known role ("Allelic read depth: 208")."""
    left = []
    for role, values in parts.by_role.items():
        if role not in used:
            label = _ROLE_LABELS.get(role, role)
            left += [f"{label}: {v}" if label else v for v in dict.fromkeys(values)]
    return left + parts.rest


# ---------------------------------------------------------------- one finding

def _with_genes(value: str, parts: _Parts) -> str:
    """A genotype's value with the genes studied it does not name ("CYP2C9 *2/*5 (genes studied: CYP2C9,
    VKORC1)")."""
    genes = parts.all("gene")
    if not value:
        return ", ".join(genes)
    if any(g.lower() not in value.lower() for g in genes):
        return f"{value} (genes studied: {', '.join(genes)})"
    return value


def summary(r: Resource, index: ChartIndex) -> str:
    """What a genomic Observation is, in a few words, for a line that derives from it or acts on it: a variant's
    name, a genotype's value with its genes, an implication's finding."""
    kind = kind_of(r)
    parts = _parts(r)
    if kind is None:
        return " ".join(w for w in (name_of(r.get("code")), said(r)) if w)
    if kind.name == "variant":
        return variant_name(r, parts) or _members_named(r, index) or said(r)
    if kind.name in ("genotype", "haplotype"):
        return _with_genes(said(r), parts)
    if kind.name in _IMPLICATIONS:
        return _implication(r, index, kind, parts)[0]
    return _join_new([said(r), *parts.rest], "; ")


def _members_named(r: Resource, index: ChartIndex) -> str:
    """A complex variant named by its parts (hasMember): "CYP2D6 c.886C>T + CYP2D6 c.1457G>C"."""
    members = [m for link in objects(r.get("hasMember")) if (m := index.resolve(link)) is not None and m is not r]
    return " + ".join(n for m in members if (n := variant_name(m)))


def _sources(r: Resource, index: ChartIndex) -> str:
    """What an implication derives from (`derivedFrom`), each named by its summary: a variant, a genotype."""
    names = []
    for link in objects(r.get("derivedFrom")):
        found = index.resolve(link)
        kind = kind_of(found) if found is not None and found is not r else None
        if found is not None and kind is not None:
            names.append(name_of(found.get("code")) if kind.name in _IMPLICATIONS else summary(found, index))
        elif isinstance(link.get("display"), str) and link["display"].strip():
            names.append(link["display"].strip())
    return "; ".join(dict.fromkeys(n for n in names if n))


def medications_assessed(r: Resource) -> list[str]:
    """The drugs a (therapeutic) implication is about: its "medication assessed" components."""
    return _parts(r).all("medication")


def _implication(r: Resource, index: ChartIndex, kind: Kind, parts: _Parts) -> tuple[str, list[str]]:
    """"CYP2C9 *2/*5 — Rapid metabolizer for warfarin" (therapeutic); "<variant> — Pathogenic for <condition>"
    (diagnostic): what it derives from, then what it means and for what; and the roles that says."""
    own = variant_name(r, parts) if any(parts.by_role.get(role) for role in _VARIANT_ROLES) else ""
    source = _join_new([own, _sources(r, index)], "; ")
    if kind.name == "therapeutic_implication":
        effects, topic = ", ".join(parts.all("effect")) or said(r), ", ".join(parts.all("medication"))
        meaning = f"{effects} for {topic}" if effects and topic else effects or (
            f"medication assessed: {topic}" if topic else "")
        used = [*_VARIANT_ROLES, "effect", "medication"]
    else:
        effects = ", ".join(parts.all("significance") + parts.all("effect")) or said(r)
        topic = ", ".join(parts.all("condition"))
        meaning = f"{effects} for {topic}" if effects and topic else effects or topic
        used = [*_VARIANT_ROLES, "significance", "effect", "condition"]
    return (f"{source} — {meaning}" if source and meaning else source or meaning), used


def finding(r: Resource, index: ChartIndex, members: Sequence[Resource] = ()) -> Rendered | None:
    """The line of one genomic Observation; None for one that is not genomic, a panel that says nothing of its
    own, or a result entered in error. `members`: a complex variant's parts (hasMember), named in its line."""
    kind = kind_of(r)
    if kind is None or r.get("status") in ("entered-in-error", "cancelled"):
        return None
    parts = _parts(r)
    value = said(r)
    if kind.name == "variant":
        name = variant_name(r, parts)
        inside = " + ".join(n for m in members if (n := variant_name(m)))
        name = f"{name} of {inside}" if name and inside else name or inside
        details = ", ".join([*parts.all("allelic_state"), *parts.all("source_class"),
                             *(f"clinical significance {s}" for s in parts.all("significance"))])
        used = [*_VARIANT_ROLES, "allelic_state", "source_class", "significance"]
        body = "; ".join(w for w in (name, details, *_rest(parts, used)) if w)
        text = kind.label + (f" ({value})" if value else "") + f": {body or 'not described'}"
    elif kind.name in ("genotype", "haplotype"):
        body = "; ".join(w for w in (_with_genes(value, parts), *_rest(parts, ["gene"])) if w)
        derived = _sources(r, index) if not parts.all("gene") else ""
        text = f"{kind.label}: {body or 'not stated'}" + (f" (from {derived})" if derived else "")
    elif kind.name in _IMPLICATIONS:
        head, used = _implication(r, index, kind, parts)
        text = f"{kind.label}: " + ("; ".join(w for w in (head, *_rest(parts, used)) if w) or "not stated")
    elif value or parts.by_role or parts.rest:
        text = f"{kind.label}: " + "; ".join(w for w in (value, *_rest(parts, ())) if w)
    else:
        return None  # a panel of genomic results: its members are the findings
    notes = "; ".join(n["text"].strip() for n in objects(r.get("note")) if isinstance(n.get("text"), str)
                      and n["text"].strip())
    flags = ", ".join(t for c in concepts(r.get("interpretation")) if (t := text_of(c)))
    text += (f"; interpretation: {flags}" if flags else "") + (f"; note: {notes}" if notes else "")
    return Rendered(kind.section, text.rstrip(". ") + ".", timestamp=_when(r))


def _when(r: Resource) -> str | None:
    return next((str(r[k]) for k in ("effectiveDateTime", "issued") if isinstance(r.get(k), str) and r[k]), None)


# ---------------------------------------------------------------- panels and reports

def _tree(roots: Sequence[Resource], index: ChartIndex) -> Iterator[tuple[Resource, list[Resource]]]:
    """Every Observation under `roots` (through hasMember, depth first), each once, with its members. A panel
    that lists itself (real exports do) is read once; at most `_MAX_MEMBERS`, at most `_MAX_DEPTH` deep."""
    seen: set[int] = set()
    stack: list[tuple[Resource, int]] = [(r, 0) for r in reversed(roots)]
    while stack and len(seen) < _MAX_MEMBERS:
        r, depth = stack.pop()
        if id(r) in seen or r.get("resourceType") != "Observation":
            continue
        seen.add(id(r))
        members = [m for link in objects(r.get("hasMember")) if (m := index.resolve(link)) is not None
                   and id(m) not in seen] if depth < _MAX_DEPTH else []
        yield r, members
        stack.extend((m, depth + 1) for m in reversed(members))


def _holds_genomic(r: Resource, index: ChartIndex) -> bool:
    """A genomic Observation, or a panel with one among its members at any depth."""
    return any(kind_of(o) is not None for o, _ in _tree([r], index))


def _read(roots: Sequence[Resource], index: ChartIndex) -> list[Rendered | Resource]:
    """In order, the line of each genomic Observation under `roots`, and each Observation that holds nothing
    genomic (a plain result, or a plain panel read whole), for the ordinary result reader. A plain panel that
    holds genomic results is opened; what it says itself (a value, components) is kept, without its members."""
    found: list[Rendered | Resource] = []
    for r, members in _tree(roots, index):
        kind = kind_of(r)
        if kind is not None:
            line = finding(r, index, members if kind.name == "variant" else ())
            found += [_suffixed(line, r)] if line is not None else []
        elif not any(_holds_genomic(m, index) for m in members):
            found.append(r)
        elif value_of(r) or objects(r.get("component")):
            found.append({k: v for k, v in r.items() if k != "hasMember"})
    return _without_parts_of_plain(found, index)


def _without_parts_of_plain(found: list[Rendered | Resource], index: ChartIndex) -> list[Rendered | Resource]:
    """A plain panel is read whole (its members inside its line): its members are not read again on their own."""
    inside = {id(o) for r in found if not isinstance(r, Rendered) for o, _ in _tree([r], index) if o is not r}
    return [r for r in found if isinstance(r, Rendered) or id(r) not in inside]


def _suffixed(line: Rendered, r: Resource) -> Rendered:
    """A line read under a report or panel is told apart by the id of the Observation it came from."""
    rid = r.get("id")
    return Rendered(line.section, line.text, f"#{rid}" if isinstance(rid, str) and rid else "", line.timestamp)


def observation(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """Every Observation: a genomic one (or a panel holding genomic results) as its genomic lines, any other by
    the ordinary result reader."""
    if id(r) in index.in_panel or not _holds_genomic(r, index):
        return ordinary.observation(r, index)
    own = f"#{r.get('id')}"
    lines = [x if isinstance(x, Rendered) else _suffixed(observation_line(x, index), x) for x in _read([r], index)]
    lines = [Rendered(x.section, x.text, "", x.timestamp) if x.id_suffix == own else x for x in lines]
    return lines or Skip("a genomic result entered in error, or a panel that holds nothing to read")


def report(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """Every DiagnosticReport: a genomic report as its genomic findings, one line each, and a line for its
    conclusion and its other results (tumour mutational burden, MSI status); any other by the ordinary reader."""
    results = [o for ref in objects(r.get("result")) if (o := index.resolve(ref)) is not None]
    if not _report_says_genomic(r) and not any(_holds_genomic(o, index) for o in results):
        return ordinary.report(r, index)
    found = _read(results, index)
    plain = [x for x in found if not isinstance(x, Rendered)]
    head = report_parts(r, index, plain, genomics().report_section, name_of(r.get("code")) or "Genomic report")
    return [*head, *(x for x in found if isinstance(x, Rendered))] or Skip(
        "a genomic report with no finding, conclusion or readable note")
