"""Where a chart's resources come from and how they point at each other.

Real exports package resources every way FHIR allows: Bundles of type document, collection, batch,
transaction, searchset, message or history (with `request`/`search` envelopes), Bulk Data NDJSON (one
resource per line), resources without ids, and references written as `urn:uuid:`, `Type/id`, absolute
URLs to a server, versioned `/_history/n`, or `#id` into a resource's `contained` list. The index resolves
all of them; a reference that resolves to nothing is counted (a dangling reference costs that link, not
the chart).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ebmrag.errors import RecordError
from ebmrag.records.fhir.coding import objects
from ebmrag.records.limits import load_json

Resource = Mapping[str, Any]
_TYPE_ID = re.compile(r"(?:^|/)([A-Z][A-Za-z]+)/([A-Za-z0-9\-.]{1,64})$")
_HISTORY = re.compile(r"/_history/[^/]*$")
_MAX_NESTING = 3


@dataclass(frozen=True)
class Entry:
    """One resource as the package delivered it, with the name other resources may use for it."""

    resource: Resource
    full_url: str
    where: str  # "entry[3]", "Observation.ndjson:12": named in every report about this resource


def bundle_entries(bundle: Mapping[str, Any], where: str, problems: list[str], depth: int = 0) -> list[Entry]:
    """Every resource of a Bundle of any type; a Bundle nested in a Bundle (a message's document) is opened."""
    raw = bundle.get("entry")
    if raw is None:
        return []
    if isinstance(raw, Mapping):  # FHIR XML with one entry
        raw = [raw]
    if not isinstance(raw, list):
        raise RecordError(f"{where}.entry", f"must be a list of entries, got {type(raw).__name__}")
    entries: list[Entry] = []
    for position, entry in enumerate(raw):
        at = f"{where}.entry[{position}]" if depth else f"entry[{position}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{at}: not an object; skipped")
            continue
        resource = entry.get("resource")
        if not isinstance(resource, Mapping) or not isinstance(resource.get("resourceType"), str):
            if resource is not None or not entry.get("request"):  # a DELETE in a transaction carries no resource
                problems.append(f"{at}: no resource with a resourceType; skipped")
            continue
        if resource["resourceType"] == "Bundle" and depth < _MAX_NESTING:
            entries += bundle_entries(resource, at, problems, depth + 1)
            continue
        entries.append(Entry(_with_request_id(resource, entry), str(entry.get("fullUrl") or ""), at))
    return entries


def _with_request_id(resource: Resource, entry: Mapping[str, Any]) -> Resource:
    """A transaction's `PUT Patient/123` names the id a resource without one will have on the server."""
    if resource.get("id"):
        return resource
    request = entry.get("request")
    url = str(request.get("url") or "") if isinstance(request, Mapping) else ""
    match = _TYPE_ID.search(url.split("?")[0])
    if match and match.group(1) == resource.get("resourceType"):
        return {**resource, "id": match.group(2)}
    return resource


def ndjson_entries(lines: Sequence[str], where: str, problems: list[str]) -> Iterator[Entry]:
    """Bulk Data export files: one resource per line; a line that is not a resource is reported and skipped."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            resource = load_json(line, f"{where}:{number}")  # depth-bounded: a deep line is skipped, not a crash
        except RecordError as exc:
            problems.append(f"{where}:{number}: {exc.problem}; line skipped")
            continue
        if not isinstance(resource, Mapping) or not isinstance(resource.get("resourceType"), str):
            problems.append(f"{where}:{number}: not a FHIR resource; line skipped")
            continue
        yield Entry(resource, "", f"{where}:{number}")


def reference_of(link: Any) -> str:
    """The reference string of a Reference element, or "" (a display-only or malformed reference)."""
    value = link.get("reference") if isinstance(link, Mapping) else None
    return _HISTORY.sub("", value.strip()) if isinstance(value, str) else ""


def type_id(reference: str) -> str:
    """"https://server/fhir/Patient/7/_history/2" -> "Patient/7"; "" when the reference names no Type/id."""
    match = _TYPE_ID.search(_HISTORY.sub("", reference))
    return f"{match.group(1)}/{match.group(2)}" if match else ""


@dataclass
class ChartIndex:
    """References -> resources, plus what one resource consumed of others (read once, never twice)."""

    resources: dict[str, Resource] = field(default_factory=dict)
    in_panel: set[int] = field(default_factory=set)  # id() of Observations a panel reads
    notes_seen: set[str] = field(default_factory=set)  # note texts already read (a report = its DocumentReference)
    medication_state: dict[int, tuple[str, str]] = field(default_factory=dict)  # id() -> (active|not active|..., why)
    dangling: set[str] = field(default_factory=set)  # references that resolve to nothing in the chart
    patient: Resource | None = None  # the chart's Patient: an attached document about someone else is not read
    unread: Counter[str] = field(default_factory=Counter)  # why an attachment of a packed resource was not read

    def add(self, entry: Entry) -> None:
        resource = entry.resource
        kind, rid = resource.get("resourceType"), resource.get("id")
        names = [entry.full_url] if entry.full_url else []
        if isinstance(rid, str) and rid:
            names.append(f"{kind}/{rid}")
        if entry.full_url and (short := type_id(entry.full_url)) and short.startswith(f"{kind}/"):
            names.append(short)
        for name in names:
            self.resources.setdefault(name, resource)

    def resolve(self, link: Any, within: Resource | None = None) -> Resource | None:
        """The resource a Reference points at: `#id` in `within.contained`, then the exact name, then Type/id."""
        reference = reference_of(link)
        if not reference:
            return None
        if reference.startswith("#"):
            contained = within.get("contained") if within is not None else None
            found = next((c for c in objects(contained) if c.get("id") == reference[1:]), None)
        else:
            found = self.resources.get(reference) or self.resources.get(type_id(reference))
        if found is None:
            self.dangling.add(reference)
        return found

    def unique(self) -> list[Resource]:
        """Every indexed resource once (a resource is indexed under several names)."""
        return list({id(r): r for r in self.resources.values()}.values())
