"""One order for a chart's resources, whatever order the package delivered them in.

The same chart arrives as a document Bundle in its author's order, as a FHIR server's `Patient/$everything`
pages (grouped by type, in the server's storage order), as one search per resource type, or as Bulk Data files
(one per type). The reader's output depends on resource order in many small ways: the fragments' order (which
numbers each context line and so changes its token cost), the order of the face sheet's problem, allergy and
medication lists, which Observation of a cycle is the panel, which of two resources with one id keeps it. So the
reader first puts the resources in a canonical order that none of those packagings can change:

1. by clinical time (the renderer's date of the resource, else the start of its period: an Encounter, a
   `performedPeriod`, an `effectivePeriod`; undated ones first), oldest first: a chart reads as a timeline, and
   the face sheet's lists run from the oldest entry to the newest;
2. then by resource type, and by what the resource is coded as (its `code`);
3. then by the rest of its content, with what a packaging changes left out: the resource's `id` and `meta` (a
   server assigns both), and every reference replaced by the content of what it points at (a `urn:uuid:` in a
   file is a `Type/id` on a server, but it points at the same Medication).

Resources equal in all three render the same text, so their remaining order (the delivered one) is invisible.
Versions of one resource (a history Bundle holds several under one id) keep the places the three keys give them,
newest version (`meta.lastUpdated`, then `meta.versionId`) first among them: the reader gives the plain id to the
first, and the plain id must name the current version. A version updated after the present (records.dates.Today:
a server clock ahead, a mistyped year) is never the newest: it ranks below every version updated before it.

A resource dated in the future keeps its place by its date (last, after today's): the order is a timeline, and the
fragments made from it carry the flag that keeps it from being taken as the newest (records.fragment).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from itertools import groupby

from ebmrag.records.dates import Today, partial_timestamp
from ebmrag.records.fhir.index import ChartIndex, Entry, Resource

_PACKAGING = ("id", "meta")  # what a server assigns or rewrites at the top level of a resource
_REFERENCE = re.compile(r'"reference": "([^"#][^"]*)"')  # a Reference's target, as json.dumps writes it


def canonical_order(entries: Sequence[Entry], time_of: Callable[[Resource], datetime | None], *,
                    today: Today | None = None) -> list[Entry]:
    """`entries` sorted by (time, type, content without ids or reference spellings): see the module doc. Content is
    compared only within a run of equal time and type (most resources are told apart before it). `today`: the
    present versions are ranked against (default: the wall clock now)."""
    ranked = sorted(((_time_and_type(e.resource, time_of), n, e) for n, e in enumerate(entries)),
                    key=lambda item: (item[0], item[1]))
    tie = _TieBreak(entries)
    ordered: list[Entry] = []
    for _, run in groupby(ranked, key=lambda item: item[0]):
        group = [entry for _, _, entry in run]
        ordered += sorted(group, key=tie.content) if len(group) > 1 else group
    return _newest_version_first(ordered, today or Today.wall_clock())


def _time_and_type(resource: Resource, time_of: Callable[[Resource], datetime | None]
                   ) -> tuple[bool, float, str, str]:
    """(dated, when, type, what it is coded as): the code goes first because it holds no reference, so it is cheap
    and already tells apart most resources of one time and type (a panel's results)."""
    moment = time_of(resource) or period_start(resource)
    return (moment is not None, moment.timestamp() if moment else 0.0, str(resource.get("resourceType")),
            json.dumps(resource.get("code"), sort_keys=True, ensure_ascii=False, default=str))


def period_start(resource: Resource) -> datetime | None:
    """The start (else the end) of the resource's `period` or `<x>Period` element: the time of an Encounter, a
    CarePlan or a procedure written as a period, which its renderer may not read as a date."""
    for name, value in resource.items():
        if (name == "period" or name.endswith("Period")) and isinstance(value, Mapping):
            moment = partial_timestamp(value.get("start") or value.get("end"))
            if moment is not None:
                return moment
    return None


def _newest_version_first(ordered: list[Entry], today: Today) -> list[Entry]:
    """Entries sharing a (type, id) swapped among their own places so the newest version comes first."""
    places: dict[tuple[str, str], list[int]] = defaultdict(list)
    for place, entry in enumerate(ordered):
        rid = entry.resource.get("id")
        if isinstance(rid, str) and rid:
            places[(str(entry.resource.get("resourceType")), rid)].append(place)
    result = list(ordered)
    for group in places.values():
        if len(group) > 1:
            versions = sorted((ordered[p] for p in group), key=lambda e: _version(e, today), reverse=True)
            for place, entry in zip(group, versions, strict=True):
                result[place] = entry
    return result


def _version(entry: Entry, today: Today) -> tuple[bool, float, int]:
    """(not updated in the future, meta.lastUpdated, meta.versionId as a number): what tells a resource's versions
    apart."""
    meta = entry.resource.get("meta")
    meta = meta if isinstance(meta, Mapping) else {}
    updated = partial_timestamp(meta.get("lastUpdated"))
    version = str(meta.get("versionId") or "")
    return (not today.is_future(updated), updated.timestamp() if updated else 0.0,
            int(version) if version.isdigit() and len(version) < 12 else 0)


class _TieBreak:
    """Content keys: the resource's JSON (keys sorted, packaging left out) with each reference replaced by a digest
    of its target's JSON (whose own references are blanked), computed once per target. A contained "#id" is kept:
    it is the same in every packaging."""

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.entries = entries
        self._index: ChartIndex | None = None
        self._plain: dict[int, str] = {}

    def content(self, entry: Entry) -> str:
        return _REFERENCE.sub(lambda m: f'"reference": "{self._target(m.group(1))}"', _json(entry.resource))

    def _target(self, reference: str) -> str:
        if self._index is None:  # built on the first tie that holds a reference
            self._index = ChartIndex()
            for entry in self.entries:
                self._index.add(entry)
        found = self._index.resolve({"reference": reference})
        if found is None:
            return ""
        if id(found) not in self._plain:
            plain = _REFERENCE.sub('"reference": ""', _json(found))
            self._plain[id(found)] = hashlib.sha256(plain.encode()).hexdigest()
        return self._plain[id(found)]


def _json(resource: Resource) -> str:
    return json.dumps({k: v for k, v in resource.items() if k not in _PACKAGING}, sort_keys=True, ensure_ascii=False,
                      default=str)
