"""schemathesis against the running service's /openapi.json: no 5xx, every response conforms to its schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from ebmrag.store.patients import SQLiteStore
from tests.serve.conftest import Live, demo_engine, running
from tests.serve.test_service import RECORD

pytestmark = pytest.mark.model


def test_no_server_error_and_responses_match_the_schema(tmp_path: Path, resources: Any, context_packer: Any,
                                                        demo_voter: Any) -> None:
    """One store is enough for the schema (the behaviour tests run on both)."""
    with running(SQLiteStore(tmp_path / "s.sqlite"), *demo_engine(resources, context_packer, demo_voter),
                 rate_per_second=1000, rate_burst=1000) as live:
        check_schema(live)


def check_schema(live: Live) -> None:
    key = live.key("t", "admin")
    with live.client(key) as http:
        assert http.put("/v1/patients/p1", json=RECORD).status_code == 200
    loaded = schemathesis.openapi.from_url(live.url + "/openapi.json")
    seen: list[str] = []
    for result in loaded.get_all_operations():
        operation = result.ok()

        @given(operation.as_strategy())
        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: Any) -> None:
            response = case.call(headers={"Authorization": f"Bearer {key}"})
            assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:300]}"
            # Every check but positive-data acceptance: a JSON schema cannot say what makes a FHIR Bundle valid
            # or a record's fragment ids unique, so a schema-valid body may rightly be refused (422).
            case.validate_response(response, excluded_checks=[schemathesis.checks.positive_data_acceptance])

        check()
        seen.append(operation.label)
    assert len(seen) >= 9
