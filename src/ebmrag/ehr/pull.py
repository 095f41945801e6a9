"""`pull_patient`: one patient's chart from a FHIR server into the store, whole or as a `_since` refresh.

The server's CapabilityStatement decides how: `Patient/$everything` where it offers the operation, else one
`patient=` search per resource type it can search that way (plus the Patient itself). Either way every page is
followed, and what the pulled resources refer to but the compartment does not hold (a Medication, an
Organization, a panel's member Observations) is fetched by id, `[ehr] reference_depth` rounds deep, so the chart
resolves its references as the same chart read from a file does.

A refresh asks only for what changed since the last pull (`_since` on $everything, `_lastUpdated=gt` on
searches), merges it into the resources kept from before by (type, id, versionId), and rebuilds the whole chart
from them with the lenient reader (records.fhir.bundle); the store then rewrites only fragments whose text
changed, so the service prepares only those. A deletion on the server is not seen by `_since`: `full` re-reads
everything and replaces what was kept.

A pull is atomic: everything is fetched first, and only then one store transaction writes the resources, the sync
point and the chart; a refusal, a timeout or a stop before that leaves the store as it was.

What a server hands over is kept only when it is this patient's by the strict compartment rule of
`ehr.compartment` (a reference that resolves to this patient on this server), or shared (a Medication), or names
nobody at all and this patient's own kept resources refer to it (an eCR Composition's subject-less reportability
Observation: a file's reader takes it in the same way); the rest (another patient's, one named by identifier or
display only, another server's, a nobody's that nothing of the patient's refers to) is dropped and counted in the
chart's skipped parts, never silently. A store patient holds one pulled source: a pull from another is a
`ChartSourceConflictError` unless `replace_source`.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

import httpx

from ebmrag.ehr.chart import WATCHED_TYPES, as_patient, chart_record, has_nul
from ebmrag.ehr.compartment import belongs_to, names_nobody
from ebmrag.ehr.fhir import EhrError, FhirClient
from ebmrag.ehr.ids import fhir_id as fhir_id_of
from ebmrag.ehr.params import EhrConnection, EhrParams
from ebmrag.ehr.scopes import scope_reads
from ebmrag.ehr.smart import connect
from ebmrag.protocols import Progress, checkpoint, no_progress
from ebmrag.records.fhir.bundle import DEFAULT_STALE_AFTER
from ebmrag.records.fhir.index import type_id
from ebmrag.records.fragment import PatientRecord
from ebmrag.store.access import valid_name
from ebmrag.store.patients import PatientStore
from ebmrag.store.pulled import ChartSourceConflictError, PulledResource, PulledWrite

log = logging.getLogger(__name__)
T = TypeVar("T")
Resource = Mapping[str, Any]
Key = tuple[str, str]  # (resource type, id)
ID_BATCH = 50  # ids per `_id=` search when fetching referenced resources
NOT_FETCHED = frozenset({"Patient", "Group", "Bundle"})  # references never followed: other patients, cohorts


class StepRunner(Protocol):
    """Runs a pull's CPU-bound step (reading what was kept, building and storing the chart) where its host keeps
    CPU work: the service puts it on an engine slot in the tenant's turn, while the network waits run elsewhere."""

    def __call__(self, step: Callable[[], T], /) -> T: ...


def inline(step: Callable[[], T], /) -> T:
    """The default StepRunner: the step on the pull's own thread."""
    return step()


@dataclass(frozen=True)
class PullReport:
    """What a pull did; no patient text (ids of fragments only, for the audit)."""

    patient: str
    connection: str
    mode: str  # "$everything", "search" or "bulk"
    incremental: bool
    requests: int
    fetched: int  # resources the server sent (a refresh: the changed ones)
    kept: int  # resources the chart was built from
    written: PulledWrite
    skipped: tuple[str, ...]  # what the reader did not turn into fragments, and why
    since: str  # the next refresh asks for changes from here
    fragment_ids: tuple[str, ...]
    fhir_patient: str = ""  # the patient's id on the server (default: the store's)

    @property
    def audited(self) -> tuple[str, ...]:
        """What the access log keeps of the pull: where it came from (`source:<connection>`, `fhir:<id on the
        server>`, pseudo-ids as CDS keeps `card:<uuid>`), then the fragment ids it stored."""
        return (f"source:{self.connection}", f"fhir:{self.fhir_patient or self.patient}", *self.fragment_ids)

    def to_json(self) -> dict[str, Any]:
        w = self.written
        return {"patient": self.patient, "connection": self.connection, "mode": self.mode,
                "incremental": self.incremental, "requests": self.requests, "resources_fetched": self.fetched,
                "resources_kept": self.kept, "fragments": len(self.fragment_ids), "added": w.added,
                "changed": w.changed, "removed": w.removed, "unchanged": w.unchanged,
                "record_skipped": list(self.skipped), "since": self.since}


def source_of(connection: EhrConnection, fhir_patient: str) -> str:
    """Where a chart comes from: one patient on one server (its sync state and kept resources are per source)."""
    return f"{connection.base}/Patient/{fhir_patient}"


def pull_patient(store: PatientStore, connection: EhrConnection, patient: str, *, params: EhrParams,
                 full: bool = False, fhir_patient: str = "", replace_source: bool = False,
                 stale_after: timedelta = DEFAULT_STALE_AFTER, http: httpx.Client | None = None,
                 progress: Progress = no_progress, on_stored: Callable[[PullReport], None] | None = None,
                 compute: StepRunner = inline) -> PullReport:
    """Pull `patient` (the store's id, in the connection's tenant; on the server `fhir_patient`, by default the
    same) and store the chart; a refresh unless `full` or there is no earlier pull. `replace_source`: a chart
    pulled into this store id from another source is erased in the same transaction (otherwise that is a
    ChartSourceConflictError, raised before anything is fetched). `on_stored` hears the report right after the
    store's commit (the service audits there, whether or not its request is still waited for). `compute` runs the
    CPU-bound steps. Raises EhrError (the server refused or could not be reached), ConfigError (the connection's
    key), RecordError (no chart) or PatientErasedError (the patient was erased meanwhile: nothing stored)."""
    valid_name(patient, "patient id")
    erasures = store.erasure_mark(connection.tenant)  # an erasure after this outlasts the pull (put_pulled)
    fhir_id = fhir_id_of(fhir_patient or patient, "FHIR patient id")  # it goes into the URL: Patient/<id>
    source = source_of(connection, fhir_id)
    if not replace_source and any(s != source for s in store.pulled_sources(connection.tenant, patient)):
        raise ChartSourceConflictError("the patient already holds a chart pulled from another source (another FHIR "
                                       "server or patient id); nothing fetched (replace erases that chart and "
                                       "stores this one)")
    state = None if full else store.pulled_state(connection.tenant, patient, source)
    started = datetime.now(UTC)
    with OwnedClient(params, http) as client_http:
        client, capability = connect(connection, params, http=client_http)
        fetcher = ChartFetcher(client, capability, fhir_id, params, progress)
        fetched, server_time = fetcher.compartment(state.since if state else None)
        kept = compute(lambda: _kept(store, connection.tenant, patient, source)) if state else {}
        merged, changed = merge(kept, fetched)
        adopted = fetcher.adopt(merged)  # what names nobody and the patient's resources refer to
        merged.update(adopted)
        changed.update(adopted)
        extra = fetcher.referenced(merged, changed)
        extra.update(fetcher.adopt({**merged, **extra}))  # fetched by reference: a chart's subject-less Encounter
        extra.update(adopted)
        merged.update(extra)
        changed.update(extra)
    checkpoint()  # the last moment a stopped pull leaves the store untouched
    since = next_since(min(server_instant(server_time) or started, started), params)  # an EHR clock ahead: ours
    unread = fetcher.unread_in_all()
    if unread:  # a `_since` refresh would not ask again for what was not read: the next pull reads everything
        since = ""
    record, written = compute(lambda: store_chart(
        store, connection.tenant, patient, source, merged, changed, since, replace_all=state is None,
        origin=f"FHIR pull ({connection.name})", stale_after=stale_after, dropped=fetcher.dropped_in_all(),
        replace_source=replace_source, erased_after=erasures, unread=unread))
    mode = "$everything" if fetcher.everything else "search"
    report = PullReport(patient, connection.name, mode, state is not None, client.requests,
                        len(fetched) + len(extra), len(merged), written, record.skipped, since,
                        tuple(f.id for f in record.fragments), fhir_id)
    if on_stored is not None:
        on_stored(report)
    log.info("pull from %s (%s): %d requests, %d resources fetched, %d fragments (+%d ~%d -%d)", connection.name,
             mode, client.requests, len(fetched) + len(extra), len(record.fragments), written.added,
             written.changed, written.removed)
    return report


class OwnedClient:
    """The caller's httpx client, or one of our own that is closed afterwards."""

    def __init__(self, params: EhrParams, given: httpx.Client | None) -> None:
        self.given, self.params = given, params
        self.client = given or httpx.Client(timeout=params.timeout_seconds, follow_redirects=False)

    def __enter__(self) -> httpx.Client:
        return self.client

    def __exit__(self, *exc: object) -> None:
        if self.given is None:
            self.client.close()


class ChartFetcher:
    """The requests of one patient's pull on one server."""

    def __init__(self, client: FhirClient, capability: Mapping[str, Any], fhir_id: str, params: EhrParams,
                 progress: Progress) -> None:
        self.client, self.fhir_id, self.params, self.progress = client, fhir_id, params, progress
        self.everything = offers_everything(capability)
        self.searchable = searchable_types(capability)
        self.known_types = set(self.searchable) | _listed_types(capability)
        self.received = 0
        self.dropped: Counter[str] = Counter()  # resource type -> how many were not this patient's
        self.refused: set[Key] = set()  # dropped ones: never asked for again by reference
        self.orphans: dict[Key, Resource] = {}  # naming nobody: kept only where the patient's resources refer to them
        self.unread: dict[str, str] = {}  # the kinds of record the chart cannot hold whole: type -> why
        if not self.everything:  # a kind the server holds but cannot search by patient is not "none"; a server
            listed = _listed_types(capability)  # that lists no type at all says nothing of what it holds
            self.unread.update((kind, "are not searchable by patient on this FHIR server, so none were read")
                               for kind in WATCHED_TYPES
                               if kind not in self.searchable and (kind in listed or not listed))

    def compartment(self, since: str | None) -> tuple[dict[Key, Resource], str]:
        """The patient's resources (changed after `since`, when given), and the server's time of the first page
        (its `Bundle.meta.lastUpdated`, when it says)."""
        found: dict[Key, Resource] = {}
        server_time = ""
        for bundle in self._compartment_pages(since):
            server_time = server_time or _bundle_time(bundle)
            for resource in bundle_resources(bundle):
                if self._is_ours(resource):
                    found[key_of(resource)] = resource
        return found, server_time

    def _compartment_pages(self, since: str | None) -> Iterator[Mapping[str, Any]]:
        count = str(self.params.page_size)
        if self.everything:
            query = {"_count": count, **({"_since": since} if since else {})}
            yield from self._pages(f"Patient/{self.fhir_id}/$everything", query, "Patient $everything")
            return
        changed = {"_lastUpdated": f"gt{since}"} if since else {}
        yield from self._pages("Patient", {"_id": self.fhir_id, "_count": count, **changed}, "search Patient")
        for kind, parameter in self.searchable.items():
            value = self.fhir_id if parameter == "patient" else f"Patient/{self.fhir_id}"
            yield from self._pages(kind, {parameter: value, "_count": count, **changed}, f"search {kind}")

    def _pages(self, path: str, query: Mapping[str, str], operation: str) -> Iterator[Mapping[str, Any]]:
        for bundle in self.client.pages(path, query, operation=operation):
            self.received += len(bundle_resources(bundle))
            self.progress("resources received", self.received, 0)
            yield bundle

    def referenced(self, held: Mapping[Key, Resource], new: Mapping[Key, Resource]) -> dict[Key, Resource]:
        """What the `new` resources refer to on this server and is not held, by id, a few rounds deep (a
        statement's Medication, then the Medication's manufacturer). What kept resources refer to was fetched
        when they were (or is not on the server: a refresh does not ask again; a full pull does)."""
        fetched: dict[Key, Resource] = {}
        following: Mapping[Key, Resource] = new
        for _ in range(self.params.reference_depth):
            wanted = sorted(self._missing(following.values(), {*held, *fetched, *self.refused, *self.orphans}))
            if not wanted:
                break
            before = set(fetched)
            for kind, ids in _by_type(wanted).items():
                for start in range(0, len(ids), ID_BATCH):
                    query = {"_id": ",".join(ids[start:start + ID_BATCH]), "_count": str(self.params.page_size)}
                    for bundle in self._pages(kind, query, f"read referenced {kind}"):
                        for resource in bundle_resources(bundle):
                            if self._is_ours(resource):
                                fetched[key_of(resource)] = resource
            following = {k: v for k, v in fetched.items() if k not in before}
        return fetched

    def _missing(self, resources: Iterable[Resource], held: set[Key]) -> set[Key]:
        wanted: set[Key] = set()
        for resource in resources:
            for reference in references_in(resource):
                target = self._local_key(reference)
                if target is not None and target not in held:
                    wanted.add(target)
        return wanted

    def _local_key(self, reference: str) -> Key | None:
        """`local_key`, for a type this server serves."""
        found = local_key(reference, self.client.base)
        if found is None or (self.known_types and found[0] not in self.known_types):
            return None
        return found

    def _is_ours(self, resource: Resource) -> bool:
        """A resource of this patient (`ehr.compartment.belongs_to`) or of nobody (a Medication); anything else
        is not kept, even where a server's $everything or a reference hands it over, and is counted."""
        if not isinstance(resource.get("id"), str) or not isinstance(resource.get("resourceType"), str):
            kind = resource.get("resourceType")
            self.dropped[kind if isinstance(kind, str) else "(a resource without id or type)"] += 1
            if isinstance(kind, str):  # an allergy without an id is still an allergy the chart does not hold
                self.unread[kind] = "were not all read (one has no id)"
            return False
        if has_nul(resource):  # no store can hold it (PostgreSQL text), and it is not the patient's "none"
            self.unread[str(resource["resourceType"])] = "were not all read (one holds a NUL character)"
            self.refused.add(key_of(resource))
            return False
        if belongs_to(resource, self.fhir_id, self.client.base) is not False:
            return True
        if names_nobody(resource):
            self.orphans[key_of(resource)] = resource  # adopt() decides
        else:
            self.dropped[str(resource["resourceType"])] += 1
            self.refused.add(key_of(resource))
        return False

    def adopt(self, held: Mapping[Key, Resource]) -> dict[Key, Resource]:
        """The resources naming nobody that `held` (this patient's) refers to, and what those refer to of them in
        turn; they leave `orphans`."""
        adopted: dict[Key, Resource] = {}
        following: Iterable[Resource] = held.values()
        while self.orphans:
            found = {k for k in self._missing(following, set()) if k in self.orphans}
            if not found:
                break
            adopted.update((k, self.orphans.pop(k)) for k in found)
            following = [adopted[k] for k in found]
        return adopted

    def unread_in_all(self) -> dict[str, str]:
        """The kinds not read whole: as found, and those the access token's granted scopes leave out (a server
        may answer $everything with only what the token may see, the rest silently missing)."""
        granted = str(getattr(self.client.auth, "scope", "") or "")
        unread = dict(self.unread)
        for kind in WATCHED_TYPES:
            if granted and kind not in unread and not scope_reads(granted, kind):
                unread[kind] = "are outside the access token's granted scopes, so none could be read"
        return unread

    def dropped_in_all(self) -> Counter[str]:
        """What was not kept, by type: the refused, and the resources naming nobody that nothing adopted."""
        return self.dropped + Counter(kind for kind, _ in self.orphans)


def local_key(reference: str, base: str) -> Key | None:
    """(type, id) of a reference to the server at `base` ("Medication/7", "<base>/Medication/7/_history/2"); None
    for a contained one ("#x"), a urn:uuid, another server's, or a type never followed (a Patient, a Group)."""
    if reference.startswith(("#", "urn:")):
        return None
    if "://" in reference and not reference.startswith(base.rstrip("/") + "/"):
        return None
    found = type_id(reference)
    if not found:
        return None
    kind, _, rid = found.partition("/")
    return None if kind in NOT_FETCHED else (kind, rid)


def offers_everything(capability: Mapping[str, Any]) -> bool:
    patient = next((r for r in _resources(capability) if r.get("type") == "Patient"), None)
    operations = patient.get("operation") if patient else None
    return any(isinstance(o, Mapping) and (o.get("name") in ("everything", "$everything")
                                           or str(o.get("definition", "")).endswith("/Patient-everything"))
               for o in (operations if isinstance(operations, list) else []))


def searchable_types(capability: Mapping[str, Any]) -> dict[str, str]:
    """Resource type -> the search parameter naming its patient ("patient", else "subject"), for every type the
    server can search by patient (its part of the patient compartment), in name order."""
    found: dict[str, str] = {}
    for resource in _resources(capability):
        kind = resource.get("type")
        params = resource.get("searchParam")
        names = {p.get("name") for p in params if isinstance(p, Mapping)} if isinstance(params, list) else set()
        if not isinstance(kind, str) or kind in NOT_FETCHED:
            continue
        if "patient" in names:
            found[kind] = "patient"
        elif "subject" in names:
            found[kind] = "subject"
    return dict(sorted(found.items()))


def _listed_types(capability: Mapping[str, Any]) -> set[str]:
    return {str(r["type"]) for r in _resources(capability) if isinstance(r.get("type"), str)}


def _resources(capability: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rests = capability.get("rest")
    found: list[Mapping[str, Any]] = []
    for rest in rests if isinstance(rests, list) else []:
        listed = rest.get("resource") if isinstance(rest, Mapping) else None
        found += [r for r in listed if isinstance(r, Mapping)] if isinstance(listed, list) else []
    return found


def bundle_resources(bundle: Mapping[str, Any]) -> list[Resource]:
    """The resources of a searchset page; `search.mode = outcome` entries (an OperationOutcome of warnings) are not
    the chart's."""
    entries = bundle.get("entry")
    found: list[Resource] = []
    for entry in entries if isinstance(entries, list) else []:
        resource = entry.get("resource") if isinstance(entry, Mapping) else None
        search = entry.get("search") if isinstance(entry, Mapping) else None
        if isinstance(search, Mapping) and search.get("mode") == "outcome":
            continue
        if isinstance(resource, Mapping) and resource.get("resourceType") != "OperationOutcome":
            found.append(resource)
    return found


def references_in(value: Any) -> Iterator[str]:
    """Every `reference` string anywhere in a resource (contained resources included)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            reference = item.get("reference")
            if isinstance(reference, str):
                yield reference
            stack.extend(v for v in item.values() if isinstance(v, Mapping | list))
        elif isinstance(item, list):
            stack.extend(v for v in item if isinstance(v, Mapping | list))


def key_of(resource: Resource) -> Key:
    return str(resource["resourceType"]), str(resource["id"])


def version_of(resource: Resource) -> str:
    meta = resource.get("meta")
    if isinstance(meta, Mapping):
        return str(meta.get("versionId") or meta.get("lastUpdated") or "")
    return ""


def merge(kept: Mapping[Key, Resource], fetched: Mapping[Key, Resource]) -> tuple[dict[Key, Resource],
                                                                                  dict[Key, Resource]]:
    """(everything the chart now holds, what of it is new or another version than kept)."""
    merged = dict(kept)
    changed: dict[Key, Resource] = {}
    for key, resource in fetched.items():
        old = kept.get(key)
        if old is None or version_of(old) != version_of(resource) or (not version_of(resource) and old != resource):
            changed[key] = resource
        merged[key] = resource
    return merged, changed


def store_chart(store: PatientStore, tenant: str, patient: str, source: str, resources: Mapping[Key, Resource],
                changed: Mapping[Key, Resource], since: str, *, replace_all: bool, origin: str,
                stale_after: timedelta = DEFAULT_STALE_AFTER, dropped: Mapping[str, int] | None = None,
                replace_source: bool = False, require_free: bool = False, erased_after: int | None = None,
                unread: Mapping[str, str] | None = None) -> tuple[PatientRecord, PulledWrite]:
    """The chart, rebuilt from every held resource (`dropped`: what was not kept, by type, for its skipped
    parts; `unread`: the kinds that could not be read, type -> why, said on the face sheet), then one store
    transaction (`PatientStore.put_pulled`, which checks the store id's source and, given
    `erased_after`, that the patient was not erased since)."""
    if not any(k[0] == "Patient" for k in resources):
        raise EhrError("the FHIR server returned no Patient resource for this patient (unknown id, or not in the "
                       "access token's scopes)", status=404)
    record = as_patient(chart_record(resources.values(), patient, origin, stale_after), patient, dropped, unread)
    rows = [_row(r) for r in (resources if replace_all else changed).values()]
    return record, store.put_pulled(tenant, patient, source, record, rows, since, replace_all,
                                    replace_source=replace_source, require_free=require_free,
                                    erased_after=erased_after)


def _row(resource: Resource) -> PulledResource:
    kind, rid = key_of(resource)
    return PulledResource(kind, rid, version_of(resource),
                          json.dumps(resource, ensure_ascii=False, separators=(",", ":")))


def _kept(store: PatientStore, tenant: str, patient: str, source: str) -> dict[Key, Resource]:
    kept: dict[Key, Resource] = {}
    for body in store.pulled_resources(tenant, patient, source):
        resource = json.loads(body)
        kept[key_of(resource)] = resource
    return kept


def _by_type(keys: Sequence[Key]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for kind, rid in keys:
        grouped.setdefault(kind, []).append(rid)
    return grouped


def _bundle_time(bundle: Mapping[str, Any]) -> str:
    meta = bundle.get("meta")
    stamp = meta.get("lastUpdated") if isinstance(meta, Mapping) else None
    return stamp if isinstance(stamp, str) else ""


def server_instant(stamp: str) -> datetime | None:
    """A server's instant as an aware datetime; None when it does not say one."""
    try:
        moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def next_since(moment: datetime | str, params: EhrParams) -> str:
    """The instant the next refresh asks for changes after: the server's time of this pull (or ours), less
    `[ehr] since_skew_seconds` for what was being written while we read (fetching it twice costs nothing)."""
    if isinstance(moment, str):
        try:
            moment = datetime.fromisoformat(moment.replace("Z", "+00:00"))
        except ValueError:
            moment = datetime.now(UTC)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    start = moment.astimezone(UTC) - timedelta(seconds=params.since_skew_seconds)
    return start.isoformat(timespec="milliseconds").replace("+00:00", "Z")

