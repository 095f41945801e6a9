"""Charts pulled from an EHR over HTTP: `POST /v1/patients/{pid}/pull` and `POST /v1/ehr/{connection}/export`.

A request names a connection of `[ehr.connections]`; the key, the client id and the FHIR base stay on the server,
and a connection belongs to one tenant: another tenant's key is answered as if it did not exist (404). A pull or an
export is the tenant's outbound work (serve/outbound.py): it waits on the EHR on a thread of the EHR lane, at most
[serve] tenant_ehr_calls per tenant and ehr_calls in all (429 / 503 with Retry-After beyond), and its CPU-bound
steps (reading what was kept, building and storing the chart) run on the fair scheduler in the tenant's turn. It is
stopped at the request's deadline (504, its connections to the EHR shut, the store as it was), is audited with its
source (`source:<connection>`, `fhir:<id on the server>`) and the fragment ids it stored, and is prepared in the
background like any write. An erasure of the patient stops its pull (409 `patient-erased`), and one in another
process is seen by the store's write, which then stores nothing (the same 409); an export stores no patient erased
after it began (reported in `not_stored`).

Which chart lands under a store id is the key's business, not the body's: `fhir_patient` (a server id other than
the store's) is accepted only from a key that sees the whole tenant, since the connection's system token reads
every patient on the server and a key limited to "alice" must not fill alice's chart with someone else's. A store
patient holds one pulled source; another source is 409 `chart-source-conflict` unless the body says `replace`.
What the EHR refuses is a 502 `ehr-refused` naming its status; an EHR that cannot be reached a 502
`ehr-unreachable`; a connection whose key cannot be read a 503 `ehr-misconfigured` (details in the log only).

The group export needs the write role and a tenant-wide key: it writes every patient of the Group, and a key
limited to listed patients must not write the others. It is not admin-only: the EHR feed (a `service` key) is
exactly who runs it, and it cannot erase or reach another tenant.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Request
from fastapi import Path as PathParameter
from pydantic import BaseModel, ConfigDict, Field

from ebmrag.ehr.fhir import EhrError
from ebmrag.ehr.params import EhrConnection
from ebmrag.errors import ConfigError, MissingExtraError, require_extra
from ebmrag.serve.outbound import OutboundCall
from ebmrag.serve.problems import PROBLEM_SCHEMA, ProblemError
from ebmrag.serve.service import Service, caller
from ebmrag.store.access import NAME_PATTERN, WRITE, AccessError, require, valid_name
from ebmrag.store.erasures import PatientErasedError
from ebmrag.store.keys import ApiKey
from ebmrag.store.pulled import ChartSourceConflictError

if TYPE_CHECKING:
    from ebmrag.ehr.bulk import ExportReport
    from ebmrag.ehr.pull import PullReport

log = logging.getLogger(__name__)
PatientId = Annotated[str, PathParameter(pattern=NAME_PATTERN, description="the patient's id within the key's tenant")]
ConnectionName = Annotated[str, PathParameter(pattern=NAME_PATTERN, description="a connection of [ehr.connections]")]
_PROBLEM = {"application/problem+json": {"schema": PROBLEM_SCHEMA}}
RESPONSES: dict[int | str, dict[str, Any]] = {
    409: {"description": "the patient holds a chart pulled from another source (chart-source-conflict); "
                         "`replace` erases it. Or the patient was erased while the pull ran (patient-erased): "
                         "nothing was stored", "content": _PROBLEM},
    429: {"description": "the tenant's EHR calls are all running ([serve] tenant_ehr_calls; tenant-busy), with "
                         "Retry-After", "content": _PROBLEM},
    502: {"description": "the EHR refused (ehr-refused, naming its status) or could not be reached "
                         "(ehr-unreachable)", "content": _PROBLEM},
    503: {"description": "the connection is misconfigured on this server (ehr-misconfigured), the ehr extra is "
                         "not installed (ehr-not-installed), or every EHR call of this process is running "
                         "([serve] ehr_calls; server-busy, with Retry-After)", "content": _PROBLEM},
    504: {"description": "the pull did not end within [serve] request_seconds; it was stopped, its connections "
                         "closed, nothing stored (timeout)", "content": _PROBLEM}}


class PullBody(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a key or a secret is never accepted here: only a name
    connection: str = Field(pattern=NAME_PATTERN, description="a connection of [ehr.connections] of the key's tenant")
    full: bool = Field(default=False, description="read everything again instead of only what changed")
    fhir_patient: str | None = Field(default=None, pattern=r"^[A-Za-z0-9\-.]{1,64}$",
                                     description="the patient's id on the FHIR server, when it is not the store's "
                                                 "(only from a key not limited to listed patients)")
    replace: bool = Field(default=False, description="erase a chart pulled into this patient from another source "
                                                     "(another server or FHIR patient) and store this one")


class ExportBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group: str = Field(pattern=r"^[A-Za-z0-9\-.]{1,64}$", description="the FHIR Group whose patients are exported")
    types: list[str] = Field(default_factory=list, max_length=100,
                             description="resource types to export (default: every type)")


def install_ehr(app: FastAPI, service: Service) -> None:
    @app.post("/v1/patients/{pid}/pull", tags=["ehr"], responses=RESPONSES)
    async def pull(pid: PatientId, body: PullBody, request: Request) -> dict[str, Any]:
        """Pull the patient's chart from the connection's FHIR server (only what changed since the last pull,
        unless `full`) and store it; nothing is stored when the pull fails."""
        key = await caller(request, service)
        valid_name(pid, "patient id")
        require(key, WRITE, pid)
        if key.patients and body.fhir_patient not in (None, pid):
            raise AccessError(403, "a key limited to listed patients pulls a patient's own chart only: fhir_patient "
                                   "must be absent or the patient id (another id could be anyone on the server)")
        connection = _connection(service, key, body.connection)
        _installed()
        from ebmrag.ehr.pull import pull_patient

        def stored(report: PullReport) -> None:  # on the worker thread, right after the store's commit
            service.audit(key, pid, "pull", request, report.audited)
            service.prepare(key.tenant, pid)

        settings = service.settings

        def work(call: OutboundCall) -> PullReport:
            return pull_patient(service.store, connection, pid, params=settings.ehr, full=body.full,
                                fhir_patient=body.fhir_patient or "", replace_source=body.replace,
                                stale_after=settings.chart.stale_after, http=call.http(settings.ehr.timeout_seconds),
                                on_stored=stored, compute=service.engine_steps(call))

        with _as_problem(connection):
            report = await service.call_ehr(work, tenant=key.tenant, patient=pid)
        return report.to_json()

    @app.post("/v1/ehr/{connection}/export", tags=["ehr"], responses=RESPONSES)
    async def export(connection: ConnectionName, body: ExportBody, request: Request) -> dict[str, Any]:
        """Bulk Data `$export` of a Group: each patient's chart stored (atomically, one by one) under the
        server's patient id. Needs a tenant-wide key with the write role (module doc)."""
        key = await caller(request, service)
        require(key, WRITE)
        if key.patients:
            raise AccessError(403, "a key limited to listed patients may not export a group (it would write "
                                   "patients it may not see)")
        chosen = _connection(service, key, connection)
        _installed()
        from ebmrag.ehr.bulk import export_group
        for kind in body.types:
            if not kind.isalpha():
                raise ProblemError(422, "invalid-request", "types must be FHIR resource type names")

        def stored(report: PullReport) -> None:
            service.audit(key, report.patient, "pull", request, report.audited)
            service.prepare(key.tenant, report.patient)

        settings = service.settings

        def work(call: OutboundCall) -> ExportReport:
            return export_group(service.store, chosen, body.group, params=settings.ehr, types=body.types,
                                stale_after=settings.chart.stale_after, http=call.http(settings.ehr.timeout_seconds),
                                on_stored=stored, compute=service.engine_steps(call))

        with _as_problem(chosen):
            report = await service.call_ehr(work, tenant=key.tenant)
        return report.to_json()


def _installed() -> None:
    """The signing parts (PyJWT, cryptography) come with the `ehr` extra; a service without it still serves."""
    try:
        require_extra("jwt", "ehr", "pulling charts")
        require_extra("cryptography", "ehr", "pulling charts")
    except MissingExtraError as exc:
        raise ProblemError(503, "ehr-not-installed", str(exc)) from None


def _connection(service: Service, key: ApiKey, name: str) -> EhrConnection:
    found = service.settings.ehr.connection_for(name, key.tenant)
    if found is None:
        raise ProblemError(404, "no-such-connection", f"no EHR connection {name!r} for this key's tenant")
    return found


@contextmanager
def _as_problem(connection: EhrConnection) -> Iterator[None]:
    """An EhrError or a connection's ConfigError as the problem the module doc names."""
    try:
        yield
    except EhrError as exc:
        log.warning("EHR connection %s: %s failed (%s)", connection.name, exc.operation or "a request",
                    exc.status or "no answer")
        raise ProblemError(502, "ehr-unreachable" if exc.unreachable else "ehr-refused", str(exc)) from None
    except ChartSourceConflictError as exc:
        raise ProblemError(409, ChartSourceConflictError.code, str(exc)) from None
    except PatientErasedError as exc:  # erased by another process meanwhile: the store refused the write
        raise ProblemError(409, PatientErasedError.code, str(exc)) from None
    except ConfigError as exc:
        log.error("EHR connection %s is misconfigured: %s", connection.name, exc)
        raise ProblemError(503, "ehr-misconfigured", f"the EHR connection {connection.name!r} is not usable on "
                                                     "this server; its operator can tell why from the log") from None
