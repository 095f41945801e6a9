"""Results and reports -> fragments: an Observation with its value of any type, a panel with each member's
analyte and value (a susceptibility panel names the organism, the drug and S/I/R), a report's conclusion,
and the notes a report or document carries (attachments decoded by records.attachments, each read once)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.records.attachments import attachment_text
from ebmrag.records.codes import text_table
from ebmrag.records.dates import as_written
from ebmrag.records.fhir.coding import codings, concepts, notes, obj, objects, text_of, without_semantic_tags
from ebmrag.records.fhir.index import ChartIndex, Resource
from ebmrag.records.fhir.measures import drug_level_flag
from ebmrag.records.fhir.rendered import Rendered, Skip, codes_of, status_code
from ebmrag.records.fhir.shapes import shape_problems
from ebmrag.records.notes import note_sections, slug
from ebmrag.rules import rule_file


@dataclass(frozen=True)
class Categories:
    """The section a result or report is packed under, by its category code (rules/records/fhir.toml)."""

    observation: Mapping[str, str]  # observation-category code -> section ("Observation" otherwise)
    report: Mapping[str, str]  # v2-0074 code -> section ("Diagnostic report" otherwise)


@rule_file("records/fhir.toml")
def categories(raw: Mapping[str, Any]) -> Categories:
    return Categories(text_table(raw.get("observation_category"), "observation_category"),
                      text_table(raw.get("report_category"), "report_category"))


@dataclass(frozen=True)
class Interpretation:
    """HL7 ObservationInterpretation codes (rules/records/interpretation.toml): the words of a code without a
    display, the susceptibility words, and which codes and words call a result abnormal or critical."""

    words: Mapping[str, str]
    susceptibility: Mapping[str, str]
    critical: frozenset[str]
    abnormal: frozenset[str]  # critical codes included
    critical_words: re.Pattern[str]
    abnormal_words: re.Pattern[str]


@rule_file("records/interpretation.toml")
def interpretation(raw: Mapping[str, Any]) -> Interpretation:
    flags = raw["flags"]
    return Interpretation(dict(raw["words"]), dict(raw["susceptibility"]), frozenset(flags["critical"]),
                          frozenset(flags["abnormal"]) | frozenset(flags["critical"]),
                          re.compile(flags["critical_words"], re.IGNORECASE),
                          re.compile(flags["abnormal_words"], re.IGNORECASE))


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


_MAX_PANEL_DEPTH = 8  # a panel of panels of ...: real ones nest two or three deep
_MAX_PANEL_MEMBERS = 500  # members read under one top-level result: panels that share members cannot fan out
_NUMBER = re.compile(r"\s*[<>]?=?\s*[+-]?(\d+([.,]\d*)?|[.,]\d+)([eE][+-]?\d+)?\s*")


def quantity(q: Any) -> str:
    """"5.4 mmol/L"; "" when there is no value, or the value is words ("Test Not Performed" is no measurement)."""
    q = obj(q)
    value = q.get("value")
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not _NUMBER.fullmatch(value)):
        return ""
    unit = q.get("unit") or q.get("code") or ""
    unit = unit if isinstance(unit, str) and unit != "1" else ""  # UCUM "1": a count or ratio, no unit to say
    return f"{q.get('comparator', '')}{_number(q['value'])} {unit}".strip()


def value_of(resource: Resource) -> str:
    """An Observation's (or component's) value[x], whatever its type, as a reader would say it."""
    if "valueQuantity" in resource:
        return quantity(resource["valueQuantity"])
    if "valueCodeableConcept" in resource:
        return text_of(resource["valueCodeableConcept"])
    if isinstance(low_high := resource.get("valueRange"), Mapping):
        return "-".join(q for q in (quantity(low_high.get("low")), quantity(low_high.get("high"))) if q)
    if isinstance(ratio := resource.get("valueRatio"), Mapping):
        return f"{quantity(ratio.get('numerator'))}/{quantity(ratio.get('denominator'))}"
    if isinstance(period := resource.get("valuePeriod"), Mapping):
        return " to ".join(as_written(period.get(k)) for k in ("start", "end") if period.get(k))
    for key in ("valueString", "valueBoolean", "valueInteger", "valueDateTime", "valueTime"):
        value = resource.get(key)
        if isinstance(value, (str, int, float, bool)) and value != "":
            return as_written(value) if key == "valueDateTime" else _number(value)
    return ""


def _interpretation(r: Resource) -> str:
    """The interpretation in words: the chart's own display, else the HL7 code's meaning ("H" -> "high"). With
    none of the chart's own, a drug level outside its therapeutic range says so (records.fhir.measures:
    "above therapeutic range (0.5–2 ng/mL)", "toxic (...)"); the laboratory's own word, when it sent one, stands."""
    words = []
    for concept in concepts(r.get("interpretation")):
        code = status_code(concept).upper()
        named = bool(concept.get("text")) or any(display for _, _, display in codings(concept))
        words.append(interpretation().susceptibility.get(code) or (text_of(concept) if named else "")
                     or interpretation().words.get(code) or text_of(concept))
    if not words:
        return drug_level_flag(r)
    return ", ".join(w for w in words if w)


def _susceptibility(r: Resource) -> str:
    """'resistant' when the interpretation is a susceptibility (S/I/R), the result such a panel reports."""
    table = interpretation().susceptibility
    words = [table[code] for concept in concepts(r.get("interpretation"))
             if (code := status_code(concept).upper()) in table]
    return ", ".join(words)


def reference_range(rr: Mapping[str, Any]) -> str:
    """"3.5-5.0 mmol/L"; a range with one bound as "≤80 mm[Hg]" or "≥60 mL/min" (never "-80", which reads as a
    negative number); the range's own text when it has one."""
    text = rr.get("text")
    if isinstance(text, str) and text.strip():
        return text.strip()
    low, high = quantity(rr.get("low")), quantity(rr.get("high"))
    return f"{low}-{high}" if low and high else f"≤{high}" if high else f"≥{low}" if low else ""


def _measurement(r: Resource, index: ChartIndex, seen: frozenset[int] = frozenset(),
                 budget: list[int] | None = None) -> str:
    """'1.2 mg/dL (flag high)', a blood pressure's components, a susceptibility ('resistant'), the members of an
    Observation panel, or '' when nothing was measured. A panel that lists itself, directly or through its
    members (real exports do), is read once: `seen` holds the panels above this one. Panels nested deeper
    than `_MAX_PANEL_DEPTH` (a chain of thousands would exhaust the stack) are not opened further, and at most
    `_MAX_PANEL_MEMBERS` members are read under one result (`budget`): panels whose members all list the same
    next panels would otherwise be read a number of times exponential in their depth."""
    budget = budget if budget is not None else [_MAX_PANEL_MEMBERS]
    value = value_of(r)
    components = ", ".join(said for c in objects(r.get("component")) if (said := component_text(c)))
    inside = seen | {id(r)}
    links = objects(r.get("hasMember")) if len(inside) <= _MAX_PANEL_DEPTH else []
    members = []
    for link in links:
        member = index.resolve(link)
        if member is None or id(member) in inside or budget[0] <= 0:
            continue
        budget[0] -= 1
        if read := _measurement(member, index, inside, budget):
            members.append(f"{text_of(member.get('code')) or 'result'} {read}")
    flags = _interpretation(r)
    measured = value or components or "; ".join(members)
    if not measured:
        return _susceptibility(r)  # a susceptibility given only as its interpretation: "resistant"
    ranges = "; ".join(said for rr in objects(r.get("referenceRange")) if (said := reference_range(rr)))
    measured += (f" (flag {flags})" if flags and flags.lower() not in measured.lower() else "") \
        + (f" (reference {ranges})" if ranges else "")
    return f"{measured}; {components}" if value and components else measured  # the flag and range are the value's


def component_text(c: Mapping[str, Any], name: str = "") -> str:
    """One Observation.component as "name: value" ("Systolic blood pressure: 120 mmHg (flag high)"), whatever
    the value's type; a component that says why it has no value says so; "" for a component that says nothing.
    `name` replaces the component's own when the caller knows a better one (a code without a display)."""
    name = name or text_of(c.get("code")) or "component"
    value = value_of(c) or _susceptibility(c)
    if not value:
        absent = text_of(c.get("dataAbsentReason"))
        return f"{name}: not recorded ({absent})" if absent else ""
    flags = _interpretation(c)
    ranges = "; ".join(said for rr in objects(c.get("referenceRange")) if (said := reference_range(rr)))
    return f"{name}: {value}" + (f" (flag {flags})" if flags and flags.lower() not in value.lower() else "") \
        + (f" (reference {ranges})" if ranges else "")


def observation(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    if id(r) in index.in_panel:
        return Skip("read as part of their panel (DiagnosticReport or Observation.hasMember)")
    return [observation_line(r, index)]


def observation_line(r: Resource, index: ChartIndex) -> Rendered:
    """An Observation's line ("Creatinine (Serum): 1.2 mg/dL (flag high)."), read whether or not a panel holds it
    (a genomic report reads its members' lines itself: records/fhir/genomics.py)."""
    codes = codes_of(r.get("category"))
    sections = categories().observation
    section = next((sections[c] for c in codes if c in sections), "Observation")
    absent = text_of(r.get("dataAbsentReason"))
    flags = _interpretation(r)
    measured = _measurement(r, index) or (
        "a value in a form that could not be read" + (f" (flag {flags})" if flags else "") if _value_is_broken(r)
        else "no value recorded" + (f" ({absent})" if absent else ""))
    specimen = index.resolve(r.get("specimen"))
    where = f" ({text_of(specimen.get('type'))})" if specimen is not None and text_of(specimen.get("type")) else ""
    site, method, said = text_of(r.get("bodySite")), text_of(r.get("method")), notes(r.get("note"))
    how = "".join(f"; {label}: {words}" for label, words in (("site", site), ("method", method), ("note", said))
                  if words)  # a laboratory's comment ("haemolysed", "repeat advised") belongs to its result
    return Rendered(section, f"{text_of(r.get('code')) or 'Unnamed observation'}{where}: {measured}{how}.")


def _value_is_broken(r: Resource) -> bool:
    """A value[x] of the wrong JSON shape (`valueQuantity: "x"`): a value was sent, so "no value recorded"
    would be false."""
    return any(problem.split(".", 1)[1].startswith("value") for problem in shape_problems(r))


def report(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    """A report's conclusion, its results (each with its analyte: a susceptibility panel names the organism,
    drug and S/I/R) and its note."""
    codes = codes_of(r.get("category"))
    sections = categories().report
    section = next((sections[c] for c in codes if c in sections), "Diagnostic report")
    results = [o for ref in objects(r.get("result")) if (o := index.resolve(ref)) is not None]
    return report_parts(r, index, results, section) or Skip("no conclusion, results or readable note")


def conclusion_of(r: Resource) -> str:
    """`conclusion` with the coded conclusions (`conclusionCode`) it does not already say beside it."""
    written = r.get("conclusion")
    said = written.strip() if isinstance(written, str) else ""
    coded = [t for c in concepts(r.get("conclusionCode")) if (t := text_of(c)) and t.lower() not in said.lower()]
    coded = list(dict.fromkeys(coded))
    if said and coded:
        return f"{said} ({', '.join(coded)})"
    return said or ", ".join(coded)


def report_parts(r: Resource, index: ChartIndex, observations: Sequence[Resource], section: str,
                 name: str = "") -> list[Rendered]:
    """The report's line (its conclusion and the given results, each measured) and its notes; [] when it says
    nothing. `observations`: the results to read into the line (a genomic report reads its genomic results as
    lines of their own and passes the rest)."""
    name = name or text_of(r.get("code")) or "Report"
    parts: list[Rendered] = []
    conclusion = conclusion_of(r)
    members = [(text_of(o.get("code")) or "result", m) for o in observations if (m := _measurement(o, index))]
    names, shared = _without_shared_suffix([n for n, _ in members])
    if shared:
        name = f"{name} ({shared.strip()})"
    results = [f"{n} {m}" for n, (_, m) in zip(names, members, strict=True)]
    comments = "; ".join(dict.fromkeys(said for o in [r, *observations] if (said := notes(o.get("note")))))
    if results or conclusion or comments:  # a report that is only its comment ("phoned to the ward") still says it
        body = "; ".join(results) + (". " if results and conclusion else "") + (f"Conclusion: {conclusion}"
                                                                                 if conclusion else "")
        comment = f"Note: {comments}" if comments else ""
        parts.append(Rendered(section, f"{name}: " + (f"{body}. {comment}" if body and comment else body or comment)
                              + "."))
    attached, unread = _notes(objects(r.get("presentedForm")), index)
    parts += attached
    index.unread.update(unread)
    return parts


def _without_shared_suffix(names: Sequence[str], least: int = 20) -> tuple[list[str], str]:
    """A panel's result names often end alike ("... in Respiratory system specimen by NAA with probe
    detection"): say it once, after the panel's name, instead of once per result."""
    if len(names) < 2:
        return list(names), ""
    suffix = names[0]
    for name in names[1:]:
        while suffix and not name.endswith(suffix):
            suffix = suffix[1:]
    suffix = suffix[suffix.find(" "):] if " " in suffix else ""  # whole words only
    if len(suffix.strip()) < least or any(len(n) <= len(suffix) for n in names):
        return list(names), ""
    return [n[: len(n) - len(suffix)] for n in names], suffix


def document(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    if r.get("status") == "entered-in-error" or r.get("docStatus") == "entered-in-error":
        return Skip("refuted or entered in error")
    attachments = [_inline(obj(c.get("attachment")), index) for c in objects(r.get("content"))]
    parts, unread = _notes(attachments, index)
    if parts:
        index.unread.update(unread)  # a second attachment that could not be read is still worth a line
        return parts
    if attachments and not unread:
        return Skip("the same note as another report or section (read once)")
    return Skip(unread[0] if unread else "no attachment")


def _inline(attachment: Mapping[str, Any], index: ChartIndex) -> Mapping[str, Any]:
    """An attachment whose `url` names a Binary in the chart ("Binary/7", a urn:uuid) reads that Binary's
    data; a URL to anywhere else is never fetched."""
    url = attachment.get("url")
    if attachment.get("data") or not isinstance(url, str) or not (url.startswith("urn:") or "Binary/" in url):
        return attachment
    found = index.resolve({"reference": url})
    if found is None or found.get("resourceType") != "Binary" or not found.get("data"):
        return attachment
    return {**attachment, "data": found["data"], "contentType": found.get("contentType") or attachment.get(
        "contentType")}


def _notes(attachments: Sequence[Mapping[str, Any]], index: ChartIndex) -> tuple[list[Rendered], list[str]]:
    """The notes' sections, each note read once, and why any attachment could not be read (for the trace)."""
    parts: list[Rendered] = []
    unread: list[str] = []
    for attachment in (_inline(a, index) for a in attachments):
        text, why = attachment_text(attachment, index.patient)
        unread += [why] if why else []
        whole = " ".join((text or "").split())
        if not whole or whole in index.notes_seen:
            continue
        for section in note_sections(text or ""):
            heading = section.heading or "note"
            parts.append(Rendered(f"Clinical note > {heading}", without_semantic_tags(section.text),
                                  f"#{slug(heading)}"))
        index.notes_seen.add(whole)
    return parts, unread


def imaging_study(r: Resource, index: ChartIndex) -> Sequence[Rendered] | Skip:
    modalities = ", ".join(str(m.get("code", "")) for m in objects(r.get("modality")))
    description = r.get("description") if isinstance(r.get("description"), str) else ""
    description = description or "; ".join(str(s.get("description", "")) for s in objects(r.get("series")))
    return [Rendered("Imaging study", f"Imaging study ({modalities or 'modality not stated'}): {description}".strip()
                     + ".")]
