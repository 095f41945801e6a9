"""CDS Hooks 2.0 on `ebmrag serve`: discovery, the three hook services, and their feedback endpoints.

- `GET /cds-services`: the services, their hooks and prefetch templates (no token needed: it holds no data);
- `POST /cds-services/{id}`: a hook call. The client's JWT is checked first (serve.cds_auth; 401, its `aud`
  against [cds] base_url and the route alone, never the Host or X-Forwarded-* headers; bad tokens are counted
  per address and per issuer key with the service's failed-credential count, 429 past it, and a valid token always
  passes), then the body (400 naming the field), then the
  prefetch: a key the client did not satisfy (left out, failed, unreadable) is fetched from its `fhirServer` with
  the hook's `fhirAuthorization`, if that server is one the issuer lists; otherwise 412. The fetch waits on the
  EHR in the service's CDS lane (bounded per tenant and in all, 429 / 503; stopped with its connections at the
  deadline: serve/outbound.py), and the chart is read and the cards made as the tenant's engine work on the fair
  scheduler; the call is audited under the issuer's tenant with the context's patient id,
  the fragment ids the cards cite and the cards' uuids;
- `POST /cds-services/{id}/feedback`: each card's outcome audited (card uuid and outcome, never text).
Everything is off unless [cds] enabled is true; errors are problem+json like every other route.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ebmrag.cds.cards import Card
from ebmrag.cds.facts import Chart
from ebmrag.cds.fetch import PrefetchUnavailableError, fetch_missing
from ebmrag.cds.hooks import (
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
from ebmrag.records.fhir.index import Resource
from ebmrag.serve.bodies import parse_json
from ebmrag.serve.cds_auth import CdsAuthError, CdsCaller, ClientVerifier
from ebmrag.serve.outbound import OutboundCall
from ebmrag.serve.problems import ProblemError, client_address
from ebmrag.serve.service import Service, bounded_body
from ebmrag.store import audit
from ebmrag.store.access import NAME_PATTERN
from ebmrag.vocab.drugs import vocabulary

_NAME = re.compile(NAME_PATTERN)


def install_cds(app: FastAPI, service: Service) -> None:
    """The CDS Hooks routes, when [cds] enabled is true."""
    params = service.settings.cds
    if not params.enabled:
        return
    verifier = ClientVerifier(params)

    async def verified(request: Request, *audiences: str) -> CdsCaller:
        """The caller, or 401; the token is always checked, and a bad one is counted against the address and the
        issuer's key it named (the count /v1 keys and the /ui sign-in share): past the allowance it is answered 429.
        A valid token is never refused for the bad ones before it."""
        try:
            return await run_in_threadpool(verifier.verify, request.headers.get("authorization"), list(audiences))
        except CdsAuthError as exc:
            wait = service.failed_keys.failed(client_address(request), exc.credential) if exc.client_fault else 0
            if wait > 0:
                raise ProblemError(429, "rate-limited", "too many bad tokens from this address or for this issuer's "
                                   "key", {"Retry-After": str(max(1, round(wait)))}) from None
            route = getattr(request.scope.get("route"), "path", "unmatched")
            await run_in_threadpool(service.audit_refused, None, 401, route, request.state.request_id)
            raise ProblemError(401, "unauthorized", str(exc), {"WWW-Authenticate": "Bearer"}) from None

    @app.get("/cds-services", tags=["cds-hooks"])
    async def discover() -> dict[str, Any]:
        return discovery()

    @app.post("/cds-services/{service_id}", tags=["cds-hooks"])
    async def call(service_id: str, request: Request) -> JSONResponse:
        definition = _definition(service_id)
        caller = await verified(request, endpoint(params.base_url, definition))
        body = await run_in_threadpool(parse_json, await bounded_body(request))  # a large prefetch: off the loop
        hook = _checked(parse_request, body, definition)
        resources, missing = await run_in_threadpool(prefetched, hook, definition)
        fetch_from = _may_fetch(hook, caller, missing) if missing else hook
        now = datetime.now(UTC)

        def fetch(call: OutboundCall) -> list[Resource]:
            return fetch_missing(fetch_from, definition, list(missing), params, service.settings.serve.max_body_mb,
                                 http=call.http(params.fetch_timeout_seconds))

        try:  # the fetch waits on the EHR in the CDS lane; the cards are the tenant's engine work
            fetched = await service.call_ehr(fetch, tenant=caller.tenant, lane=service.cds_fetches) if missing else []

            def cards_of_chart() -> list[Card]:
                chart = Chart(hook.patient_id, [*resources, *fetched], fhir_base=hook.fhir_server)
                return hook_cards(hook, chart, now=now, vocabulary=vocabulary(), critical_hours=params.critical_hours)

            cards = await service.run(cards_of_chart, tenant=caller.tenant)
        except PrefetchUnavailableError as exc:
            raise ProblemError(412, "precondition-failed", str(exc)) from None
        except HookRequestError as exc:  # an order whose medication reference resolves to nothing
            raise ProblemError(400, "invalid-hook-request", str(exc)) from None
        await run_in_threadpool(_audit, service, caller, hook, cards, request.state.request_id)
        return JSONResponse({"cards": [card.to_json() for card in cards]})

    @app.post("/cds-services/{service_id}/feedback", tags=["cds-hooks"])
    async def feedback(service_id: str, request: Request) -> dict[str, Any]:
        url = endpoint(params.base_url, _definition(service_id))
        caller = await verified(request, url + "/feedback", url)
        body = await run_in_threadpool(parse_json, await bounded_body(request))
        items = _checked(lambda raw, _: parse_feedback(raw), body, None)

        def record() -> None:
            for item in items:
                audit.append(service.store, audit.AuditEntry(
                    f"cds:{caller.issuer.name}", caller.tenant, "", f"cds:feedback {item.outcome}",
                    request.state.request_id, (f"card:{item.card}", *(f"suggestion:{s}" for s in item.accepted))))

        await run_in_threadpool(record)
        return {"recorded": len(items)}


def endpoint(base_url: str, definition: ServiceDefinition) -> str:
    """The URL of a service as its clients' JWTs must name it (`aud`): [cds] base_url and the route, nothing the
    request says (a Host or X-Forwarded-* header is the caller's to choose)."""
    return f"{base_url.rstrip('/')}/cds-services/{definition.id}"


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


def _may_fetch(hook: HookRequest, caller: CdsCaller, missing: dict[str, str]) -> HookRequest:
    """The hook to fetch the missing prefetch for, its fhirServer the issuer's listed spelling of that base; 412
    unless there is a fhirAuthorization and the fhirServer is one the issuer lists."""
    lacking = "; ".join(key if why == "not sent" else f"{key} ({why})" for key, why in missing.items())
    if hook.authorization is None:
        raise ProblemError(412, "precondition-failed", f"the prefetch lacks {lacking}, and the request has no "
                                                       "fhirAuthorization to fetch it with")
    listed = caller.issuer.listed_base(hook.fhir_server)
    if listed is None:
        raise ProblemError(412, "precondition-failed", f"the prefetch lacks {lacking}, and fhirServer is not one "
                                                       f"of [cds.issuers.{caller.issuer.name}] fhir_servers")
    return replace(hook, fhir_server=listed)


def _audit(service: Service, caller: CdsCaller, hook: HookRequest, cards: list[Card], request_id: str) -> None:
    patient = hook.patient_id if _NAME.match(hook.patient_id) else ""
    disclosed = (*cited_fragments(cards), *(f"card:{card.uuid}" for card in cards))
    audit.append(service.store, audit.AuditEntry(f"cds:{caller.issuer.name}", caller.tenant, patient,
                                                 f"cds:{hook.hook}", request_id, disclosed))
