"""CDS Hooks 2.0 on `ebmrag serve`: discovery, the three hook services, and their feedback endpoints.

- `GET /cds-services`: the services, their hooks and prefetch templates (no token needed: it holds no data);
- `POST /cds-services/{id}`: a hook call. The client's JWT is checked first (serve.cds_auth; 401), then the body
  (400 naming the field), then the prefetch: a key the client did not satisfy is fetched from its `fhirServer`
  with the hook's `fhirAuthorization`, if that server is one the issuer lists; otherwise 412. The chart is read and
  the cards made off the event loop; the call is audited under the issuer's tenant with the context's patient id,
  the fragment ids the cards cite and the cards' uuids;
- `POST /cds-services/{id}/feedback`: each card's outcome audited (card uuid and outcome, never text).
Everything is off unless [cds] enabled is true; errors are problem+json like every other route.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ebmrag.ehr.cds import (
    SERVICES,
    HookRequest,
    HookRequestError,
    ServiceDefinition,
    cited_fragments,
    discovery,
    hook_cards,
    parse_feedback,
    parse_request,
    prefetched,
)
from ebmrag.ehr.cds_cards import Card
from ebmrag.ehr.cds_facts import Chart
from ebmrag.ehr.cds_fetch import PrefetchUnavailableError, fetch_missing
from ebmrag.ehr.drugs import vocabulary
from ebmrag.serve.bodies import parse_json
from ebmrag.serve.cds_auth import CdsAuthError, CdsCaller, ClientVerifier
from ebmrag.serve.problems import ProblemError
from ebmrag.serve.service import Service, bounded_body
from ebmrag.store import audit
from ebmrag.store.access import NAME_PATTERN

_NAME = re.compile(NAME_PATTERN)


def install_cds(app: FastAPI, service: Service) -> None:
    """The CDS Hooks routes, when [cds] enabled is true."""
    params = service.settings.cds
    if not params.enabled:
        return
    verifier = ClientVerifier(params)

    async def verified(request: Request, *audiences: str) -> CdsCaller:
        try:
            return await run_in_threadpool(verifier.verify, request.headers.get("authorization"), list(audiences))
        except CdsAuthError as exc:
            route = getattr(request.scope.get("route"), "path", "unmatched")
            await run_in_threadpool(service.audit_refused, None, 401, route, request.state.request_id)
            raise ProblemError(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"}) from None

    @app.get("/cds-services", tags=["cds-hooks"])
    async def discover() -> dict[str, Any]:
        return discovery()

    @app.post("/cds-services/{service_id}", tags=["cds-hooks"])
    async def call(service_id: str, request: Request) -> JSONResponse:
        definition = _definition(service_id)
        caller = await verified(request, endpoint(request, service.settings.cds.base_url))
        body = await run_in_threadpool(parse_json, await bounded_body(request))  # a large prefetch: off the loop
        hook = _checked(parse_request, body, definition)
        resources, missing = await run_in_threadpool(prefetched, hook, definition)
        if missing:
            _may_fetch(hook, caller, missing)
        now = datetime.now(UTC)

        def work() -> list[Card]:
            fetched = fetch_missing(hook, definition, missing, params, service.settings.serve.max_body_mb) \
                if missing else []
            return hook_cards(hook, Chart(hook.patient_id, [*resources, *fetched]), now=now,
                              vocabulary=vocabulary(), critical_hours=params.critical_hours)

        try:
            cards = await service.run(work, tenant=caller.tenant, engine=False)
        except PrefetchUnavailableError as exc:
            raise ProblemError(412, "precondition-failed", str(exc)) from None
        await run_in_threadpool(_audit, service, caller, hook, cards, request.state.request_id)
        return JSONResponse({"cards": [card.to_json() for card in cards]})

    @app.post("/cds-services/{service_id}/feedback", tags=["cds-hooks"])
    async def feedback(service_id: str, request: Request) -> dict[str, Any]:
        _definition(service_id)
        url = endpoint(request, service.settings.cds.base_url)
        caller = await verified(request, url, url.removesuffix("/feedback"))
        body = await run_in_threadpool(parse_json, await bounded_body(request))
        items = _checked(lambda raw, _: parse_feedback(raw), body, None)

        def record() -> None:
            for item in items:
                audit.append(service.store, audit.AuditEntry(
                    f"cds:{caller.issuer.name}", caller.tenant, "", f"cds:feedback {item.outcome}",
                    request.state.request_id, (f"card:{item.card}", *(f"suggestion:{s}" for s in item.accepted))))

        await run_in_threadpool(record)
        return {"recorded": len(items)}


def endpoint(request: Request, base_url: str) -> str:
    """The URL the client called, as its JWT's `aud` must name it: under [cds] base_url when the service is behind
    a proxy, else as this server saw it."""
    base = base_url.rstrip("/") if base_url else f"{request.url.scheme}://{request.url.netloc}"
    return base + request.url.path


def _definition(service_id: str) -> ServiceDefinition:
    found = SERVICES.get(service_id)
    if found is None:
        raise ProblemError(404, "not-found", "no CDS service with this id (GET /cds-services lists them)")
    return found


def _checked(parse: Any, body: Any, definition: ServiceDefinition | None) -> Any:
    try:
        return parse(body, definition)
    except HookRequestError as exc:
        raise ProblemError(400, "invalid-hook-request", str(exc)) from None


def _may_fetch(hook: HookRequest, caller: CdsCaller, missing: list[str]) -> None:
    """412 unless the missing prefetch can be fetched: a fhirAuthorization, for a fhirServer the issuer lists."""
    lacking = ", ".join(missing)
    if hook.authorization is None:
        raise ProblemError(412, "precondition-failed", f"the prefetch lacks {lacking} and the request has no "
                                                       "fhirAuthorization to fetch it with")
    if not caller.issuer.may_fetch_from(hook.fhir_server):
        raise ProblemError(412, "precondition-failed", f"the prefetch lacks {lacking} and fhirServer is not one of "
                                                       f"[cds.issuers.{caller.issuer.name}] fhir_servers")


def _audit(service: Service, caller: CdsCaller, hook: HookRequest, cards: list[Card], request_id: str) -> None:
    patient = hook.patient_id if _NAME.match(hook.patient_id) else ""
    disclosed = (*cited_fragments(cards), *(f"card:{card.uuid}" for card in cards))
    audit.append(service.store, audit.AuditEntry(f"cds:{caller.issuer.name}", caller.tenant, patient,
                                                 f"cds:{hook.hook}", request_id, disclosed))
