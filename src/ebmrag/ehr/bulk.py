"""Group-level FHIR Bulk Data `$export`: many patients' charts in one asynchronous export.

Kick-off (`GET Group/<id>/$export`, `Prefer: respond-async`) answers 202 with a status URL; the status URL
answers 202 (with `Retry-After`, `X-Progress`) until the export is complete, then a manifest of NDJSON files,
downloaded with the access token when it says `requiresAccessToken`. The wait is bounded (`[ehr]
export_wait_seconds`); an export given up (that bound, an error, the service's deadline) is cancelled with a
DELETE on the status URL, so the server stops working for nobody.

Each patient's chart is read by records.fhir.bulk (`records_from_ndjson_text`) and stored atomically with its
raw resources, under the same source as `pull_patient`'s, so a later pull of one patient refreshes from there
with `_since`. A patient that cannot be stored is reported and does not stop the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx

from ebmrag.ehr.fhir import EhrError, FhirClient, retry_after
from ebmrag.ehr.params import EhrConnection, EhrParams
from ebmrag.ehr.pull import OwnedClient, PullReport, key_of, next_since, source_of, store_chart
from ebmrag.ehr.smart import connect
from ebmrag.errors import RecordError
from ebmrag.protocols import Progress, checkpoint, checkpoints, no_progress
from ebmrag.records.fhir.bulk import records_from_ndjson_text
from ebmrag.records.fhir.bundle import ADMINISTRATIVE, DEFAULT_STALE_AFTER, subject_link
from ebmrag.records.fhir.index import reference_of, type_id
from ebmrag.records.fragment import PatientRecord
from ebmrag.records.limits import load_json
from ebmrag.store.access import valid_name
from ebmrag.store.patients import PatientStore

log = logging.getLogger(__name__)
NDJSON = "application/fhir+ndjson"
Resource = Mapping[str, Any]


@dataclass(frozen=True)
class ExportReport:
    connection: str
    requests: int
    files: int
    transaction_time: str
    patients: tuple[PullReport, ...]
    problems: tuple[str, ...]  # patients not stored and why (no patient text), files the server reported as errors

    def to_json(self) -> dict[str, Any]:
        return {"connection": self.connection, "requests": self.requests, "files": self.files,
                "transaction_time": self.transaction_time, "patients": [p.to_json() for p in self.patients],
                "problems": list(self.problems)}


def export_group(store: PatientStore, connection: EhrConnection, group: str, *, params: EhrParams,
                 types: Sequence[str] = (), stale_after: timedelta = DEFAULT_STALE_AFTER,
                 http: httpx.Client | None = None, progress: Progress = no_progress,
                 sleep: Callable[[float], None] = time.sleep,
                 on_stored: Callable[[PullReport], None] | None = None) -> ExportReport:
    """Export the Group's patients and store each one's chart (the store's patient id is the server's);
    `on_stored` hears each patient's report right after its commit."""
    valid_name(group, "group id")
    with OwnedClient(params, http) as client_http:
        client, _ = connect(connection, params, http=client_http)
        client.sleep = sleep
        status_url = kick_off(client, group, types)
        try:
            manifest = await_manifest(client, status_url, params, progress)
            text = download(client, manifest, progress)
        except BaseException:
            cancel(client, status_url)
            raise
    since = next_since(str(manifest.get("transactionTime") or ""), params)
    stored, problems = _store_each(store, connection, text, since, stale_after, progress, on_stored)
    errors = manifest.get("error")
    if isinstance(errors, list) and errors:
        problems.append(f"the server reported {len(errors)} error file(s) with the export (not downloaded)")
    outputs = manifest.get("output")
    return ExportReport(connection.name, client.requests, len(outputs) if isinstance(outputs, list) else 0,
                        str(manifest.get("transactionTime") or ""), tuple(stored), tuple(problems))


def kick_off(client: FhirClient, group: str, types: Sequence[str]) -> str:
    query = {"_type": ",".join(types)} if types else None
    answer = client.send("GET", f"Group/{group}/$export", operation="bulk export kick-off", query=query,
                         headers={"Prefer": "respond-async"})
    location = answer.headers.get("content-location")
    if answer.status != 202 or not location:
        raise EhrError(f"bulk export kick-off: the FHIR server answered {answer.status} without a status URL "
                       "(it must answer 202 with Content-Location)", status=answer.status,
                       operation="bulk export kick-off")
    return client.url(location)  # on the FHIR server's origin: polled with the token


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
        log.info("bulk export: in progress (%s), polling again in %.1f s", answer.headers.get("x-progress", "-")[:60],
                 wait)
        client.wait(wait, "bulk export status", "202")
        waited += wait


def download(client: FhirClient, manifest: Mapping[str, Any], progress: Progress) -> str:
    """Every output file's NDJSON, one after another (each ends with a newline)."""
    token = manifest.get("requiresAccessToken") is not False
    outputs = [o for o in manifest["output"] if isinstance(o, Mapping) and isinstance(o.get("url"), str)]
    texts: list[str] = []
    for done, output in enumerate(outputs, 1):
        operation = f"bulk export download {output.get('type') or 'file'}"
        answer = client.send("GET", str(output["url"]), operation=operation, authorized=token, accept=NDJSON)
        try:
            text = answer.body.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise EhrError(f"{operation}: the file is not UTF-8 text", operation=operation) from None
        texts.append(text if text.endswith("\n") or not text else text + "\n")
        progress("files downloaded", done, len(outputs))
    return "".join(texts)


def cancel(client: FhirClient, status_url: str) -> None:
    """DELETE the export (best effort: the reason it was given up is what the caller hears)."""
    try:
        with checkpoints(_never_stop):  # sent even when a stopped request is why the export is given up
            client.send("DELETE", status_url, operation="bulk export cancel", accept="application/json")
    except EhrError as exc:
        log.warning("bulk export: the cancel was not accepted (%s)", exc.status)


def _never_stop() -> None:
    """A checkpoint hook that lets the cancel go out."""


def _store_each(store: PatientStore, connection: EhrConnection, text: str, since: str, stale_after: timedelta,
                progress: Progress, on_stored: Callable[[PullReport], None] | None
                ) -> tuple[list[PullReport], list[str]]:
    problems: list[str] = []
    try:
        records = records_from_ndjson_text(text, f"bulk export ({connection.name})", stale_after=stale_after)
    except RecordError as exc:
        raise EhrError(f"bulk export: {exc.problem}") from None
    by_patient = {r.patient_id: r for r in records}
    groups = resources_per_patient(_resources(text))
    stored: list[PullReport] = []
    for done, (fhir_id, held) in enumerate(sorted(groups.items()), 1):
        checkpoint()
        try:
            valid_name(fhir_id, "patient id")
        except ValueError:
            problems.append(f"patient #{done}: its id is not a valid store id; not stored")
            continue
        record = by_patient.get(f"Patient/{fhir_id}")
        if record is None:
            problems.append(f"patient #{done}: no chart could be read; not stored")
            continue
        stored.append(_store_one(store, connection, fhir_id, record, held, since))
        if on_stored is not None:
            on_stored(stored[-1])
        progress("patients stored", done, len(groups))
    return stored, problems


def _store_one(store: PatientStore, connection: EhrConnection, fhir_id: str, record: PatientRecord,
               held: Mapping[tuple[str, str], Resource], since: str) -> PullReport:
    source = source_of(connection, fhir_id)
    stored, written = store_chart(store, connection.tenant, fhir_id, source, held, held, since, replace_all=True,
                                  origin=record.origin, record=record)
    return PullReport(fhir_id, connection.name, "bulk", False, 0, len(held), len(held), written, stored.skipped,
                      since, tuple(f.id for f in stored.fragments))


def _resources(text: str) -> list[Resource]:
    found: list[Resource] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            resource = load_json(line, f"line {number}")
        except RecordError:
            continue  # the reader reports it in the chart's skipped parts
        if isinstance(resource, Mapping) and isinstance(resource.get("resourceType"), str) and \
                isinstance(resource.get("id"), str):
            found.append(resource)
    return found


def resources_per_patient(resources: Sequence[Resource]) -> dict[str, dict[tuple[str, str], Resource]]:
    """The raw resources each patient's chart is read from, grouped as records.fhir.bulk groups them: a resource
    joins the patient it names; shared ones (a Medication, an Organization) join every patient."""
    groups: dict[str, dict[tuple[str, str], Resource]] = {
        str(r["id"]): {key_of(r): r} for r in resources if r["resourceType"] == "Patient"}
    shared: list[Resource] = []
    for resource in resources:
        if resource["resourceType"] == "Patient":
            continue
        named = type_id(reference_of(subject_link(resource)))
        if named.startswith("Patient/") and named[len("Patient/"):] in groups:
            groups[named[len("Patient/"):]][key_of(resource)] = resource
        elif not named and resource["resourceType"] in ADMINISTRATIVE:
            shared.append(resource)
        elif not named and len(groups) == 1:
            next(iter(groups.values()))[key_of(resource)] = resource
    for held in groups.values():
        held.update({key_of(r): r for r in shared})
    return groups
