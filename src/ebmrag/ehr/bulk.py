"""Group-level FHIR Bulk Data `$export`: many patients' charts in one asynchronous export.

Kick-off (`GET Group/<id>/$export`, `Prefer: respond-async`) answers 202 with a status URL; the status URL
answers 202 (with `Retry-After`, `X-Progress`) until the export is complete, then a manifest of NDJSON files,
downloaded with the access token when it says `requiresAccessToken`. The wait is bounded (`[ehr]
export_wait_seconds`); an export given up (that bound, an error, the service's deadline) is cancelled with a
DELETE on the status URL, so the server stops working for nobody.

The manifest's file URLs are the server's words: a file is fetched only from the FHIR base's origin or one the
connection lists (`bulk_file_origins`), token or not; one elsewhere fails the export before anything is fetched.
The files are streamed to a private spool folder (ehr.spool: removed however the export ends, and at the next
start when a killed process could not), not memory (`[ehr] max_export_mb` in all, `pull_seconds`
for the downloads), indexed line by line, and each patient's chart is then read from its own lines only: the
resources that belong to that patient (`ehr.compartment`) and the shared ones they refer to, and, as a pull does,
the resources naming nobody that the patient's refer to. A resource that belongs to no patient of the export is
counted, not stored.

Each patient is stored atomically with its raw resources, under the same source as `pull_patient`'s, so a later
pull of one patient refreshes from there with `_since`; a store id that is not free (an uploaded chart, another
source's) is reported for that patient and left as it is. A patient that cannot be stored does not stop the
others.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from ebmrag.ehr.chart import WATCHED_TYPES, dropped_parts, has_nul
from ebmrag.ehr.compartment import belongs_to, is_shared, named_patients, names_nobody
from ebmrag.ehr.fhir import EhrError, FhirClient, Origin, check_media, origin, retry_after
from ebmrag.ehr.ids import fhir_id as checked_fhir_id
from ebmrag.ehr.params import EhrConnection, EhrParams
from ebmrag.ehr.pull import (
    Key,
    OwnedClient,
    PullReport,
    Resource,
    StepRunner,
    inline,
    key_of,
    local_key,
    next_since,
    references_in,
    server_instant,
    source_of,
    store_chart,
)
from ebmrag.ehr.scopes import scope_reads
from ebmrag.ehr.smart import connect
from ebmrag.ehr.spool import Spool, sweep_stale
from ebmrag.errors import RecordError
from ebmrag.protocols import Progress, checkpoint, checkpoints, no_progress
from ebmrag.records.fhir.bundle import DEFAULT_STALE_AFTER
from ebmrag.records.limits import load_json
from ebmrag.store.access import valid_name
from ebmrag.store.erasures import PatientErasedError
from ebmrag.store.patients import PatientStore
from ebmrag.store.pulled import ChartSourceConflictError

log = logging.getLogger(__name__)
NDJSON = "application/fhir+ndjson"
Line = tuple[int, int]  # (file number, byte offset) of one resource's line in the spooled files


@dataclass(frozen=True)
class ExportReport:
    connection: str
    requests: int
    files: int
    transaction_time: str
    patients: tuple[PullReport, ...]
    problems: tuple[str, ...]  # patients not stored and why (no patient text), what was not read or kept
    not_stored: tuple[tuple[str, str], ...] = ()  # (patient id on the server, why: a problem type)

    def to_json(self) -> dict[str, Any]:
        return {"connection": self.connection, "requests": self.requests, "files": self.files,
                "transaction_time": self.transaction_time, "patients": [p.to_json() for p in self.patients],
                "problems": list(self.problems),
                "not_stored": [{"patient": p, "reason": why} for p, why in self.not_stored]}


def export_group(store: PatientStore, connection: EhrConnection, group: str, *, params: EhrParams,
                 types: Sequence[str] = (), stale_after: timedelta = DEFAULT_STALE_AFTER,
                 http: httpx.Client | None = None, progress: Progress = no_progress,
                 sleep: Callable[[float], None] = time.sleep,
                 on_stored: Callable[[PullReport], None] | None = None,
                 compute: StepRunner = inline) -> ExportReport:
    """Export the Group's patients and store each one's chart (the store's patient id is the server's, where it
    is free or holds this source already); `on_stored` hears each patient's report right after its commit;
    `compute` runs the CPU-bound steps (reading the files, each patient's chart). A patient erased after the
    export began is not stored (reported as `patient-erased`)."""
    checked_fhir_id(group, "group id")  # it goes into the URL: Group/<id>/$export
    erasures = store.erasure_mark(connection.tenant)
    sweep_stale()  # what an export killed before left behind: every exported patient's data
    with OwnedClient(params, http) as client_http, Spool() as spool:
        client, _ = connect(connection, params, http=client_http)
        client.sleep = sleep
        client.bound(params.max_export_mb, "max_export_mb", params.export_wait_seconds + params.pull_seconds)
        started = datetime.now(UTC)
        status_url = kick_off(client, group, types)
        try:
            manifest = await_manifest(client, status_url, params, progress)
            client.bound(params.max_export_mb, "max_export_mb", params.pull_seconds)  # the downloads' own time
            files = download(client, connection, manifest, spool, progress)
        except BaseException:
            cancel(client, status_url)
            raise
        stamp = server_instant(str(manifest.get("transactionTime") or ""))
        since = next_since(min(stamp or started, started), params)  # an EHR clock ahead would skip changes
        spooled = compute(lambda: SpooledExport.read(files, connection.base))
        errors = manifest.get("error")
        if isinstance(errors, list) and errors:  # which records failed, the error files would say: none is "none"
            for kind in WATCHED_TYPES:
                spooled.not_read(kind, f"may be incomplete (the server reported {len(errors)} error file(s) with "
                                       "the export)")
        granted = str(getattr(client.auth, "scope", "") or "")
        for kind in WATCHED_TYPES:  # what was not asked for, or not granted, is not "none" either
            if types and kind not in types:
                spooled.not_read(kind, "were not asked for in this export (its _type list)")
            elif granted and not scope_reads(granted, kind):
                spooled.not_read(kind, "are outside the access token's granted scopes, so none could be read")
        try:
            since = "" if spooled.unread else since  # a later `_since` pull would not ask again for what was not read
            result = _store_each(store, connection, spooled, _Batch(since, stale_after, params.reference_depth,
                                                                    erasures, compute), progress, on_stored)
        finally:
            spooled.close()
    if isinstance(errors, list) and errors:
        result.problems.append(f"the server reported {len(errors)} error file(s) with the export (not downloaded)")
    outputs = manifest.get("output")
    return ExportReport(connection.name, client.requests, len(outputs) if isinstance(outputs, list) else 0,
                        str(manifest.get("transactionTime") or ""), tuple(result.stored), tuple(result.problems),
                        tuple(result.not_stored))


def kick_off(client: FhirClient, group: str, types: Sequence[str]) -> str:
    query = {"_type": ",".join(types)} if types else None
    answer = client.send("GET", f"Group/{group}/$export", operation="bulk export kick-off", query=query,
                         headers={"Prefer": "respond-async"})
    location = answer.headers.get("content-location")
    if answer.status != 202 or not location:
        raise EhrError(f"bulk export kick-off: the FHIR server answered {answer.status} without a status URL "
                       "(it must answer 202 with Content-Location)", status=answer.status,
                       operation="bulk export kick-off")
    return client.url(location, operation="bulk export kick-off")  # on the FHIR server's origin: polled with the token


def await_manifest(client: FhirClient, status_url: str, params: EhrParams, progress: Progress) -> Mapping[str, Any]:
    """Poll the status URL until the manifest, waiting what each 202 asks (capped at `max_retry_after_seconds`,
    the backoff when it does not say), for `export_wait_seconds` at most."""
    started, waited, polls = time.monotonic(), 0.0, 0
    while True:
        answer = client.send("GET", status_url, operation="bulk export status", accept="application/json")
        if answer.status == 200:
            manifest = answer.json("bulk export status")
            if not isinstance(manifest, Mapping) or not isinstance(manifest.get("output"), list):
                raise EhrError("bulk export status: the manifest has no output list", operation="bulk export status")
            return manifest
        if answer.status != 202:
            raise EhrError(f"bulk export status: unexpected answer {answer.status}", status=answer.status,
                           operation="bulk export status")
        polls += 1
        progress("export in progress", polls, 0)
        asked = retry_after(answer.headers.get("retry-after"))
        wait = min(params.max_retry_after_seconds, asked) if asked is not None else \
            min(params.max_backoff_seconds, 0.5 * 2 ** min(polls, 16))
        if max(time.monotonic() - started, waited) + wait > params.export_wait_seconds:
            raise EhrError(f"bulk export: not complete after {params.export_wait_seconds:g} s ([ehr] "
                           "export_wait_seconds); cancelled", operation="bulk export status")
        log.info("bulk export: in progress, polling again in %.1f s", wait)
        client.wait(wait, "bulk export status", "202")
        waited += wait


def download(client: FhirClient, connection: EhrConnection, manifest: Mapping[str, Any], spool: Path,
             progress: Progress) -> list[Spooled]:
    """Every output file streamed to `spool` (one file each, in the manifest's order). Every URL is checked
    before the first is fetched: one on another origin than the FHIR base's and the connection's
    `bulk_file_origins` fails the export, nothing fetched. A file the server refuses, redirects, answers without
    content or labels as something other than NDJSON is spooled empty with why: its kind is marked not read in
    every chart of the export (never read as "none"); no answer at all, or the budget spent, fails the export."""
    token = manifest.get("requiresAccessToken") is not False
    outputs = [o for o in manifest["output"] if isinstance(o, Mapping) and isinstance(o.get("url"), str)]
    allowed = frozenset(origin(o) for o in connection.bulk_file_origins)
    refused = [f"#{n} ({_kind(o)})" for n, o in enumerate(outputs, 1) if not _fetchable(client, o["url"], allowed)]
    if refused:
        raise EhrError(f"bulk export download: output file {', '.join(refused[:5])}"
                       f"{f' and {len(refused) - 5} more' if len(refused) > 5 else ''} is not on the FHIR base's "
                       f"origin nor one of [ehr.connections.{connection.name}] bulk_file_origins; nothing fetched, "
                       "nothing stored", operation="bulk export download")
    files: list[Spooled] = []
    for done, output in enumerate(outputs, 1):
        path = spool / f"{done:05d}.ndjson"
        operation = f"bulk export download {_kind(output)}"
        with path.open("wb") as sink:
            try:
                answer = client.send("GET", str(output["url"]), operation=operation, authorized=token,
                                     accept=NDJSON, origins=allowed, sink=sink)
                if answer.status != 200:  # a redirect (not followed), 204: the file's records are not "none"
                    raise EhrError(f"{operation}: the server answered {answer.status} "
                                   f"{httpx.codes.get_reason_phrase(answer.status)}", status=answer.status)
                check_media(answer, "ndjson", operation)
            except EhrError as exc:
                if exc.status is None:  # no answer, or the export's budget or time spent: the export fails
                    raise
                files.append(Spooled(path, _kind(output), f"could not be downloaded (the server answered "
                                                          f"{exc.status})"))
                continue
        files.append(Spooled(path, _kind(output)))
        progress("files downloaded", done, len(outputs))
    return files


@dataclass(frozen=True)
class Spooled:
    """One downloaded output file; `failed`: why it could not be downloaded (its kind is then not read)."""

    path: Path
    kind: str
    failed: str = ""


def _fetchable(client: FhirClient, url: str, allowed: frozenset[Origin]) -> bool:
    try:
        there = origin(url)
    except ValueError:
        return False
    return there == client.origin or there in allowed


def _kind(output: Mapping[str, Any]) -> str:
    """The file's resource type as the manifest says it, when it looks like one (it is the server's text)."""
    kind = output.get("type")
    return kind if isinstance(kind, str) and kind.isalpha() and len(kind) <= 64 else "file"


def cancel(client: FhirClient, status_url: str) -> None:
    """DELETE the export (best effort: the reason it was given up is what the caller hears)."""
    client.last_request()  # the budget spent or the time up may be why: the cancel goes out, bounded, all the same
    try:
        with checkpoints(_never_stop):  # sent even when a stopped request is why the export is given up
            client.send("DELETE", status_url, operation="bulk export cancel", accept="application/json")
    except EhrError as exc:
        log.warning("bulk export: the cancel was not accepted (%s)", exc.status)


def _never_stop() -> None:
    """A checkpoint hook that lets the cancel go out."""


@dataclass
class SpooledExport:
    """Where each resource of the downloaded files is, grouped by whose it is (no resource held in memory)."""

    files: list[Spooled]
    base: str
    patients: dict[str, Line] = field(default_factory=dict)  # server patient id -> its Patient's line
    owned: dict[str, list[Line]] = field(default_factory=dict)  # server patient id -> its resources' lines
    shared: dict[Key, Line] = field(default_factory=dict)  # a Medication, an Organization, ...: by (type, id)
    nobodys: dict[Key, Line] = field(default_factory=dict)  # naming nobody: taken where a chart refers to them
    adopted: set[Key] = field(default_factory=set)  # the nobody's some patient's chart took in
    dropped: Counter[str] = field(default_factory=Counter)  # resource type -> belonging to no patient here
    unreadable: int = 0  # lines that are not a JSON resource with a type and an id
    unread: dict[str, str] = field(default_factory=dict)  # kinds no chart of the export holds whole: type -> why
    _open: dict[int, BinaryIO] = field(default_factory=dict)

    @classmethod
    def read(cls, files: list[Spooled], base: str) -> SpooledExport:
        spooled = cls(files, base)
        for number, spooled_file in enumerate(files):
            if spooled_file.failed:
                spooled.not_read(spooled_file.kind, spooled_file.failed)
            with spooled_file.path.open("rb") as text:
                offset = 0
                for raw in text:
                    checkpoint()
                    spooled._place(raw, (number, offset), spooled_file.kind)
                    offset += len(raw)
        for patient in [p for p in spooled.owned if p not in spooled.patients]:  # a patient the export lacks
            for line in spooled.owned.pop(patient):
                spooled.dropped[str(spooled.resource(line)["resourceType"])] += 1
        spooled.close()
        return spooled

    def not_read(self, kind: str, why: str) -> None:
        """`kind` is not held whole by any chart of the export (a file of no named kind: every watched kind)."""
        for each in (kind,) if kind != "file" else WATCHED_TYPES:
            self.unread.setdefault(each, why)

    def _place(self, raw: bytes, line: Line, kind: str) -> None:
        if not raw.strip():
            return
        resource = self._parse(raw)
        if resource is None or has_nul(resource):  # cut short, damaged, or unstorable: its kind is not "none"
            self.unreadable += 1
            self.not_read(str(resource["resourceType"]) if resource else kind,
                          "were not all read (a line of the export is cut short, damaged or holds a NUL character)")
            return
        if resource["resourceType"] == "Patient":
            self.patients.setdefault(resource["id"], line)
        elif is_shared(resource):
            self.shared.setdefault(key_of(resource), line)
        elif names_nobody(resource):
            self.nobodys.setdefault(key_of(resource), line)
        else:
            owners = [p for p in named_patients(resource, self.base) if belongs_to(resource, p, self.base)]
            for owner in owners:
                self.owned.setdefault(owner, []).append(line)
            if not owners:
                self.dropped[str(resource["resourceType"])] += 1

    @staticmethod
    def _parse(raw: bytes) -> Resource | None:
        try:
            resource = load_json(raw.decode("utf-8-sig"), "a line of a bulk export file")
        except (UnicodeDecodeError, RecordError):
            return None
        if isinstance(resource, Mapping) and isinstance(resource.get("resourceType"), str) and \
                isinstance(resource.get("id"), str):
            return resource
        return None

    def resource(self, line: Line) -> Resource:
        number, offset = line
        text = self._open.get(number) or self._open.setdefault(number, self.files[number].path.open("rb"))
        text.seek(offset)
        found = self._parse(text.readline())
        if found is None:  # it was read before; the spool is ours
            raise EhrError("bulk export: a spooled file changed while it was read")
        return found

    def close(self) -> None:
        for text in self._open.values():
            text.close()
        self._open.clear()

    def chart_of(self, patient: str, depth: int) -> dict[Key, Resource]:
        """The patient's resources and the shared (or nobody's) ones they refer to, `depth` rounds deep."""
        held = {key_of(r): r for r in map(self.resource, [self.patients[patient], *self.owned.get(patient, [])])}
        following = list(held.values())
        pool = {**self.nobodys, **self.shared}
        for _ in range(depth):
            wanted = {k for r in following for ref in references_in(r) if (k := local_key(ref, self.base))
                      and k in pool and k not in held}
            self.adopted |= wanted & set(self.nobodys)
            following = [self.resource(pool[k]) for k in sorted(wanted)]
            held.update((key_of(r), r) for r in following)
            if not following:
                break
        return held

    def left_out(self) -> Counter[str]:
        """What belongs to no patient of the export, by type: the refused, and the nobody's no chart took in."""
        return self.dropped + Counter(kind for kind, _ in set(self.nobodys) - self.adopted)


@dataclass(frozen=True)
class _Batch:
    """What every patient of one export is stored with."""

    since: str
    stale_after: timedelta
    depth: int
    erased_after: int  # the erasure mark read when the export began
    compute: StepRunner


@dataclass
class _Stored:
    stored: list[PullReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    not_stored: list[tuple[str, str]] = field(default_factory=list)


def _store_each(store: PatientStore, connection: EhrConnection, spooled: SpooledExport, batch: _Batch,
                progress: Progress, on_stored: Callable[[PullReport], None] | None) -> _Stored:
    result = _Stored()
    if spooled.unreadable:
        result.problems.append(f"{spooled.unreadable} line(s) of the export are not FHIR resources with a type and "
                               "an id; not read")
    patients = sorted(spooled.patients)
    for done, fhir_id in enumerate(patients, 1):
        checkpoint()
        try:
            valid_name(fhir_id, "patient id")
        except ValueError:
            result.problems.append(f"patient #{done}: its id is not a valid store id; not stored")
            continue
        try:
            report = batch.compute(partial(_store_one, store, connection, spooled, fhir_id, batch))
        except PatientErasedError:
            result.problems.append(f"patient #{done}: erased after the export began; not stored")
            result.not_stored.append((fhir_id, PatientErasedError.code))
            continue
        except RecordError:
            result.problems.append(f"patient #{done}: no chart could be read; not stored")
            continue
        except ChartSourceConflictError:
            result.problems.append(f"patient #{done}: its store id already holds a chart from elsewhere (an upload "
                                   "or another source); not stored")
            result.not_stored.append((fhir_id, ChartSourceConflictError.code))
            continue
        result.stored.append(report)
        if on_stored is not None:
            on_stored(report)
        progress("patients stored", done, len(patients))
    result.problems += [f"{part} (in no exported patient's chart)" for part in dropped_parts(spooled.left_out())]
    return result


def _store_one(store: PatientStore, connection: EhrConnection, spooled: SpooledExport, fhir_id: str,
               batch: _Batch) -> PullReport:
    held = spooled.chart_of(fhir_id, batch.depth + 1)  # the server's include level, then the pull's rounds
    source = source_of(connection, fhir_id)
    stored, written = store_chart(store, connection.tenant, fhir_id, source, held, held, batch.since,
                                  replace_all=True, origin=f"FHIR bulk export ({connection.name})",
                                  stale_after=batch.stale_after, require_free=True, erased_after=batch.erased_after,
                                  unread=spooled.unread, dropped=spooled.left_out())
    return PullReport(fhir_id, connection.name, "bulk", False, 0, len(held), len(held), written, stored.skipped,
                      batch.since, tuple(f.id for f in stored.fragments), fhir_id)
