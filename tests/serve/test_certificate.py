"""Issue 46.4 over HTTP: the service's pack and ask replies carry the pack's certificate, in the same shape as
`ebmrag pack --json`, and it agrees with the trace beside it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.serve.conftest import Live
from tests.serve.test_service import RECORD

pytestmark = pytest.mark.model

CERTIFICATE_KEYS = {"optimal", "critical_left_out", "first_critical_left_out", "levels"}


def agrees_with_trace(cert: dict[str, Any], packed: list[dict[str, Any]], dropped: list[dict[str, Any]]) -> None:
    assert set(cert) == CERTIFICATE_KEYS and [c["level"] for c in cert["levels"]] == [1, 2, 3, 4]
    assert sum(c["packed"] for c in cert["levels"]) == len(packed)
    assert sum(c["left_out"] + c["collapsed"] for c in cert["levels"]) == len(dropped)


def test_pack_and_ask_replies_carry_the_certificate(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(live.key("t", "service")) as http:
        assert http.put("/v1/patients/p1", json=RECORD).status_code == 200
        tight = http.post("/v1/patients/p1/pack", json={"query": "Which antibiotic is safe?", "window": 32}).json()
        roomy = http.post("/v1/patients/p1/pack", json={"query": "Which antibiotic is safe?", "window": 512}).json()
        answer = http.post("/v1/patients/p1/ask", json={"question": "Which antibiotic is safe for his wound "
                                                                    "infection?", "window": 2048}).json()
    cert = tight["certificate"]
    agrees_with_trace(cert, tight["packed"], tight["dropped"])
    assert cert["optimal"] is True and cert["critical_left_out"] >= 1
    first = cert["first_critical_left_out"]
    assert set(first) == {"fragment_id", "level", "level_name", "reason", "needs", "room"}
    assert first["fragment_id"] in {d["fragment_id"] for d in tight["dropped"]}
    assert first["room"] == 32 - tight["tokens_used"] < first["needs"]
    assert "allergy" in {p["fragment_id"] for p in tight["packed"]}, "level 1 is packed before anything else"
    assert roomy["certificate"]["critical_left_out"] == 0 and roomy["certificate"]["first_critical_left_out"] is None
    trace = answer["trace"]
    agrees_with_trace(trace["certificate"], trace["packed"], trace["dropped"])
    assert trace["certificate"]["optimal"] is (trace["strategy"] == "ebm-exact")
