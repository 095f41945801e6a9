"""The test FHIR server for the EHR tests: one process for the session, emptied before each test that uses `fhir`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.ehr.fhir_server import FhirServer


@pytest.fixture(scope="session")
def fhir_server() -> Iterator[FhirServer]:
    """The running server (Node.js, tests/fhir_server); fails the test loudly when it is not installed."""
    server = FhirServer()
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def fhir(fhir_server: FhirServer) -> FhirServer:
    """The session's server, reset: no resources, clients, tokens, faults or logged requests."""
    fhir_server.reset()
    return fhir_server
