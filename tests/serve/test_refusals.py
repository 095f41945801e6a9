"""Every refused attempt can be found in the audit by the request id its answer carries: the guard's own 401,
413 and the first 429 of a burst (the rest are counted in its summary row, issue 43), a path that reaches no route,
a missing knowledge-base document, an oversized /ui form; ids that could be stored but never named again are
refused at the door (issue 32, found by the probe suite)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.serve.conftest import Live


def _audited(live: Live) -> dict[str, str]:
    """request id -> action, for every audit row."""
    return {str(row[6]): str(row[5]) for row in live.store.audit_rows()}


def test_the_guards_refusals_carry_the_id_of_their_audit_row(serve: Callable[..., Live]) -> None:
    live = serve(max_body_mb=0.01)
    with live.client() as anonymous:
        no_key = anonymous.get("/v1/patients/p1/fragments", headers={"X-Request-ID": "trace-7"})
    with live.client(live.key("t", "clinician")) as http:
        too_large = http.post("/v1/search", content=b" " * 20_000, headers={"Content-Type": "application/json"})
    with live.client("ebm_000000000000_" + "x" * 30) as guesser:
        answers = [guesser.get("/v1/patients/p1/fragments") for _ in range(25)]
    throttled = next(a for a in answers if a.status_code == 429)  # the first of a burst: later ones are counted
    assert (no_key.status_code, too_large.status_code, answers[-1].status_code) == (401, 413, 429)
    audited = _audited(live)
    for answer in (no_key, too_large, throttled):
        rid = answer.headers["X-Request-ID"]
        assert audited.get(rid, "").startswith(f"refused {answer.status_code}"), (rid, answer.status_code)
    assert no_key.headers["X-Request-ID"].startswith("trace-7.")
    assert len({a.headers["X-Request-ID"] for a in answers}) == len(answers), "ids never repeat"


def test_a_path_that_reaches_no_route_is_audited_without_the_path(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(live.key("t", "clinician")) as http:
        answers = [http.get("/v1/patients/p1/fragments/extra/Jane-Doe-1970"),
                   http.get("/v1/patients/%2e%2e%2fother/fragments/x"), http.get("/ui/patients/a/b/Jane-Doe-1970")]
    audited = _audited(live)
    for answer in answers:
        assert answer.status_code == 404
        assert audited[answer.headers["X-Request-ID"]] == "refused 404 unmatched"
    assert not any("Jane-Doe" in str(row) for row in live.store.audit_rows()), "the sent path is not stored"


def test_an_oversized_ui_form_is_refused_and_audited(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client() as browser:
        answer = browser.post("/ui/login", content=b"key=" + b"x" * 70_000,
                              headers={"Content-Type": "application/x-www-form-urlencoded",
                                       "Origin": live.url})
    assert answer.status_code == 413
    assert _audited(live)[answer.headers["X-Request-ID"]].startswith("refused 413")


def test_kb_ids_that_could_never_be_named_again_are_refused(tmp_path: Any, store: Any, resources: Any,
                                                         context_packer: Any, embedder: Any) -> None:
    from ebmrag.answer.engine import AnswerParams
    from ebmrag.index.kb import KnowledgeBase
    from ebmrag.retrieve.vote import DocumentVoter
    from tests.engines import engine_from_parts, over_knowledge_base, rrf_retriever
    from tests.serve.conftest import running

    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    engine = engine_from_parts(resources, AnswerParams(retrieval="never"), packer=context_packer,
                               voter=DocumentVoter(rrf_retriever(kb)))
    with running(store, engine, over_knowledge_base(resources, kb)) as live, \
            live.client(live.key("ebmrag", "admin")) as admin:
        for bad in ("line\nbreak", "nul\u0000id", "bell\u0007"):
            answer = admin.post("/v1/kb/documents", json={"documents": [{"doc_id": bad, "text": "Some text."}]})
            assert answer.status_code == 422, (bad, answer.text)
        assert admin.post("/v1/kb/documents", json={"documents": [{"doc_id": "g1", "text": "Some text."}]}).json()[
            "added"] == ["g1"]
        missing = admin.delete("/v1/kb/documents/no-such-guide")
        assert missing.status_code == 404
        assert _audited(live)[missing.headers["X-Request-ID"]] == "refused 404 /v1/kb/documents/{doc_id}"


def test_a_differential_has_bounded_input() -> None:
    import pytest

    from ebmrag.serve.mcp import MAX_FINDINGS, McpTools
    from ebmrag.store.keys import ApiKey

    tools = McpTools.__new__(McpTools)  # the bound is checked before the tool touches its service
    key = ApiKey("k", "t", "clinician", (), "", "")
    with pytest.raises(ValueError, match="at most"):
        tools.ddx(key, ["fever"] * (MAX_FINDINGS + 1), None, None)
    with pytest.raises(ValueError, match="characters"):
        tools.ddx(key, ["x" * 5000], None, None)
