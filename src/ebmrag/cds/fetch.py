"""What a hook's prefetch lacked, fetched from the client's FHIR server with the hook's own access token.

CDS Hooks 2.0 lets a client send `fhirServer` and `fhirAuthorization` instead of (or beside) the prefetch: the
service runs its own prefetch queries there. The token goes to that server only: the FHIR client (ehr.fhir)
sends it to the base's origin and follows `next` links on it alone, and the caller has already checked that the
base is one the trusted issuer lists ([cds.issuers.<name>] fhir_servers). A hook's token cannot be renewed: a 401
is final. Whatever keeps a key from being fetched (the server's refusal, a network or decoding failure, a link
that is no URL, an answer that cannot all be read) is a `PrefetchUnavailableError` naming the key, which the
service answers with 412 Precondition Failed, as the specification says: the key is missing, never a 500.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from urllib.parse import parse_qsl

import httpx

from ebmrag.cds.hooks import HookRequest, ServiceDefinition, UnreadableError, query_for, resources_of
from ebmrag.cds.params import CdsParams
from ebmrag.ehr.fhir import EhrError, FhirClient
from ebmrag.ehr.params import EhrParams
from ebmrag.errors import EbmragError
from ebmrag.records.fhir.index import Resource

PAGE_SIZE = 100  # `_count` of a fetched search, unless its template sets one
_SPACE = re.compile(r"\s+")


class PrefetchUnavailableError(EbmragError):
    """The data a hook needs could be neither prefetched nor fetched; the message says why (no patient data)."""


class HookToken:
    """The hook's `fhirAuthorization.access_token` as the FHIR client's authorizer: it cannot be refreshed."""

    def __init__(self, token: str) -> None:
        self._token = token

    def token(self) -> str:
        return self._token

    def refresh(self) -> str:
        return self._token


def fetch_missing(request: HookRequest, service: ServiceDefinition, keys: Sequence[str], params: CdsParams,
                  max_response_mb: float, http: httpx.Client | None = None) -> list[Resource]:
    """The resources of each prefetch key in `keys`, fetched from `request.fhir_server`: a read, or every page of
    a search (more than [cds] fetch_max_pages of them is refused, not cut short). `http`: the client to send with
    (the service's, whose connections it can cut); closed afterwards either way."""
    if request.authorization is None or not request.fhir_server:
        raise PrefetchUnavailableError(f"the prefetch lacks {', '.join(keys)} and the request has no "
                                       "fhirAuthorization to fetch it with")
    patience = EhrParams(timeout_seconds=params.fetch_timeout_seconds, retries=1, error_retries=0,
                         max_backoff_seconds=1.0, max_retry_after_seconds=2.0, max_response_mb=max_response_mb)
    resources: list[Resource] = []
    key = keys[0] if keys else ""
    client: FhirClient | None = None
    try:
        client = FhirClient(request.fhir_server, patience, auth=HookToken(request.authorization.access_token),
                            http=http)
        for key in keys:
            resources += _fetch(client, key, service, request, params)
    except PrefetchUnavailableError:
        raise
    except EhrError as exc:
        raise _unavailable(key, str(exc)) from None
    except UnreadableError as exc:
        raise _unavailable(key, f"its answer cannot all be read ({exc})") from None
    except _FETCH_FAILURES as exc:  # what the HTTP stack or a malformed URL raises; its text may hold the URL
        raise _unavailable(key, f"the request failed ({type(exc).__name__})") from None
    finally:
        if client is not None:
            client.close()
    return resources


# httpx.InvalidURL and StreamError are not HTTPError; a malformed link's urlsplit raises ValueError
_FETCH_FAILURES = (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, ValueError, UnicodeError, OSError)


def _unavailable(key: str, why: str) -> PrefetchUnavailableError:
    """One line naming the key (the FHIR client's messages leave the patient's id out)."""
    return PrefetchUnavailableError(f"prefetch key {key!r} could not be fetched from fhirServer: "
                                    f"{_SPACE.sub(' ', why).strip()[:300]}")


def _fetch(client: FhirClient, key: str, service: ServiceDefinition, request: HookRequest,
           params: CdsParams) -> list[Resource]:
    query = query_for(service.prefetch[key], request)
    if query is None:
        raise PrefetchUnavailableError(f"prefetch key {key!r}: its template's tokens are not in the context")
    path, _, search = query.partition("?")
    kind = path.split("/")[0]
    if not search:
        return resources_of(client.read(path, operation=f"read {kind}"), f"fetched {key}")
    found: list[Resource] = []
    query_params = {"_count": str(PAGE_SIZE), **dict(parse_qsl(search))}
    for number, page in enumerate(client.pages(path, query_params, operation=f"search {kind}"), 1):
        if number > params.fetch_max_pages:  # cards from part of a chart could claim an absence: refuse instead
            raise PrefetchUnavailableError(f"prefetch key {key!r}: the search has more than "
                                           f"{params.fetch_max_pages} pages ([cds] fetch_max_pages)")
        found += resources_of(page, f"fetched {key}")
    return found
