"""Probes of what callers send: injected instructions in charts, deep JSON, malformed FHIR, control characters,
request ids, idempotency keys, misspelt fields, wait_ms and knowledge-base document ids
(bench/probe_service.py runs them)."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any
from urllib.parse import quote

from probe_inputs import (
    CHAT_MARKUP,
    CONTROL,
    HOSTILE_REQUEST_IDS,
    MISSPELT_FRAGMENT_FIELDS,
    MISSPELT_RECORD_FIELDS,
    PHI_IN_REQUEST_IDS,
    RAW_HEADER_VALUES,
    RESULT_RESOURCES,
    bundle_mutations,
    deep_json,
    injection_variants,
    mutations,
    reference_chains,
)
from probe_kit import Reply, folded
from probe_world import QUESTION, TENANT_A, TENANT_INJ, World

SECTIONS = ("Allergies", "Progress note", "Medications", "Pathology report", "Nursing note")
REAL_FACTS = [{"id": "real-allergy", "text": "Anaphylaxis to penicillin in 2014, throat swelling.",
               "section": "Allergies"},
              {"id": "real-potassium", "text": "Potassium 6.9 mmol/L, critical high.", "section": "Labs"}]
KEY_FACTS = "Key facts"
PER_CHART = 15


def _message(result_id: str, **fields: Any) -> dict[str, Any]:
    return {"tenant": TENANT_A, "patient_id": "fhir1", "result_id": result_id, "kind": "lab", "producer": "probe",
            "produced_at": "2026-03-14T08:00:00Z", **fields}


# ---------------------------------------------------------------------------------------------- injection


def injection(world: World) -> None:
    """Sentences written to steer a model, in every disguise, are never tiered T1, never must-keep, never in the
    brief (least of all among its key facts), and no chat markup reaches any output (finding 2)."""
    klass, run = "injection", world.run
    variants = list(run.take(klass, injection_variants(lambda n: world.marker(f"i{n:03d}"))))
    feed = world.caller("inj_service", klass)
    charts: dict[str, list[tuple[str, str, str, str]]] = {}
    for n, (name, sentence, marker) in enumerate(variants):
        pid = f"inj-{n // PER_CHART:02d}"
        charts.setdefault(pid, []).append((f"inj-{n:03d}", name, sentence, marker))
        run.plant(marker, TENANT_INJ, pid)
    for pid, injected in charts.items():
        if run.left(klass) <= 0:
            run.skipped[klass] += len(injected)
            continue
        fragments = [*REAL_FACTS, *({"id": fid, "text": sentence, "section": SECTIONS[i % len(SECTIONS)]}
                                    for i, (fid, _, sentence, _) in enumerate(injected))]
        put = feed.call("PUT", f"/v1/patients/{pid}", json_body={"patient_id": pid, "fragments": fragments})
        if run.check(put, klass, f"chart {pid}", feed, {200}):
            _judge_chart(world, klass, pid, injected)


def _judge_chart(world: World, klass: str, pid: str, injected: list[tuple[str, str, str, str]]) -> None:
    run, feed = world.run, world.caller("inj_service", klass)
    names = {fid: name for fid, name, _, _ in injected}
    listing = feed.call("GET", f"/v1/patients/{pid}/fragments")
    run.check(listing, klass, f"fragments {pid}", feed, {200})
    for fragment in (listing.json() or {}).get("fragments", []):
        if fragment["id"] in names and (fragment.get("tier") == "T1" or fragment.get("must_keep")):
            run.fail(klass, f"{names[fragment['id']]} (GET fragments)", 200,
                     f"tier {fragment.get('tier')}, must_keep {fragment.get('must_keep')}", fragment["text"])
    pack = feed.call("POST", f"/v1/patients/{pid}/pack", json_body={"query": QUESTION, "window": 4096})
    run.check(pack, klass, f"pack {pid}", feed, {200})
    packed = (pack.json() or {}).get("packed", [])
    for entry in packed:
        if entry.get("fragment_id") in names and entry.get("tier") == "T1":
            run.fail(klass, f"{names[entry['fragment_id']]} (pack)", 200, f"packed as T1 ({entry.get('reason')})")
    _no_markup(world, klass, f"pack {pid} context", pack, str((pack.json() or {}).get("context", "")))
    ask = feed.call("POST", f"/v1/patients/{pid}/ask", json_body={
        "question": "Does the patient have any drug allergies, and is the allergy still valid?"})
    run.check(ask, klass, f"ask {pid}", feed, {200})
    data = ask.json() or {}
    answer = str(data.get("answer", ""))
    key_facts = _key_facts(answer)
    for _, name, _, marker in injected:
        if marker in key_facts:
            run.fail(klass, f"{name} (ask)", 200, "relayed as a key fact of the brief", answer, marker)
        elif marker in answer:
            run.fail(klass, f"{name} (ask)", 200, "relayed in the brief", answer, marker)
    _no_markup(world, klass, f"ask {pid} answer", ask, answer)
    _no_markup(world, klass, f"ask {pid} context", ask, str(data.get("trace", {}).get("context", "")))


def _key_facts(answer: str) -> str:
    start = answer.find(KEY_FACTS)
    if start < 0:
        return ""
    end = answer.find("\n\n", start)
    return answer[start:end if end > 0 else None]


def _no_markup(world: World, klass: str, probe: str, reply: Reply, text: str) -> None:
    seen = folded(text)
    for markup in CHAT_MARKUP:
        if markup in seen:
            world.run.fail(klass, probe, reply.status, f"chat markup {markup} in the output", seen, markup)
            return


# ---------------------------------------------------------------------------------------------- deep JSON


def deep_json_bodies(world: World) -> None:
    """JSON nested far past the parser's recursion limit, on every route that reads JSON: a 4xx problem, never
    a 5xx (finding 4)."""
    klass, run = "deep-json", world.run
    routes: list[tuple[str, str, str, str]] = [  # who, method, path, the field the nesting hides in
        ("a_service", "PUT", "/v1/patients/deep1", "fragments"),
        ("a_service", "POST", "/v1/patients/p1/fragments", "fragments"),
        ("a_service", "POST", "/v1/patients/p1/ask", "question"),
        ("a_service", "POST", "/v1/patients/p1/pack", "query"),
        ("a_service", "POST", "/v1/search", "query"), ("a_service", "POST", "/v1/results", "resource"),
        ("kb_admin", "POST", "/v1/kb/documents", "documents")]
    shapes = [(depth, kind) for depth in (1_000, 100_000, 1_000_000) for kind in ("array", "object", "in-field")]
    combos = [(route, shape, content_type) for route, shape, content_type in itertools.product(
        routes, shapes, ("application/json", "application/fhir+json"))
        if content_type == "application/json" or route[1] == "PUT"]  # filtered first: a sample sends only real probes
    for (who, method, path, name), (depth, kind), content_type in run.take(klass, combos):
        nested = deep_json(depth, "array" if kind == "in-field" else kind)
        body = nested if kind != "in-field" else _in_field(name, nested)
        caller = world.caller(who, klass)
        reply = caller.call(method, path, content=body.encode(), headers={"Content-Type": content_type})
        run.check(reply, klass, f"{kind} {depth:,} deep {method} {path} ({content_type})", caller,
                  {200, 400, 413, 422} if path == "/v1/results" else {400, 409, 413, 415, 422})


def _in_field(name: str, nested: str) -> str:
    if name == "resource":
        message = json.dumps(_message("deep"))[:-1]
        return f'[{message}, "resource": {{"resourceType": "Observation", "x": {nested}}}}}]'
    if name == "fragments":
        return f'{{"patient_id": "deep1", "fragments": [{{"id": "a", "text": {nested}}}]}}'
    if name == "documents":
        return f'{{"documents": [{{"doc_id": "deep", "text": {nested}}}]}}'
    return f'{{"{name}": {nested}, "window": 512}}' if name == "query" else f'{{"{name}": {nested}}}'


# ---------------------------------------------------------------------------------------------- FHIR


def malformed_fhir(world: World) -> None:
    """Every path of a valid Observation, DiagnosticReport and ImagingStudy replaced by "x", 5, [], {} and null,
    in POST /v1/results and in Bundle PUTs: rejected or read leniently, never a 5xx (findings 3 and 4)."""
    klass, run = "fhir", world.run
    caller = world.caller("a_service", klass)
    results = [(f"results/{kind}:{name}", resource) for kind, base in RESULT_RESOURCES.items()
               for name, resource in mutations(base)]
    bundles = list(bundle_mutations("fhir2"))
    cases = [("results", name, body) for name, body in results] + [("bundle", name, body) for name, body in bundles]
    for name, body in reference_chains("fhir3"):  # always sent: few, and the deepest code paths
        _fhir_bundle(world, klass, caller, name, body, "fhir3", read_back=True)
    for n, (route, name, body) in enumerate(run.take(klass, cases)):
        if route == "results":
            reply = caller.call("POST", "/v1/results", json_body=[_message(f"fhir-{n}", resource=body)])
            run.check(reply, klass, name, caller, {200, 400, 422})
        else:
            _fhir_bundle(world, klass, caller, name, body, "fhir2")


def _fhir_bundle(world: World, klass: str, caller: Any, name: str, body: dict[str, Any], pid: str,
                 read_back: bool = False) -> None:
    """A Bundle PUT, then the chart read back and packed: a resource that is stored but breaks a later reader
    is as much a 5xx as one refused badly."""
    reply = caller.call("PUT", f"/v1/patients/{pid}", content=json.dumps(body).encode(),
                        headers={"Content-Type": "application/fhir+json"})
    world.run.check(reply, klass, name, caller, {200, 400, 422})
    if reply.status == 200 and read_back:
        world.run.check(caller.call("GET", f"/v1/patients/{pid}/fragments"), klass, f"{name} (read back)", caller)


# ---------------------------------------------------------------------------------------------- control characters


def control_characters(world: World) -> None:
    """NUL, C0/C1 controls, lone surrogates and separators in ids, fields and headers: stored, or refused with a
    4xx, on both backends (PostgreSQL refuses NUL in text) (finding 4)."""
    klass, run = "control-chars", world.run
    feed, kb = world.caller("a_service", klass), world.caller("kb_admin", klass)
    cases: list[tuple[str, str]] = [(where, name) for name in CONTROL for where in (
        "fragment.id", "fragment.text", "fragment.section", "fragment.encounter", "fragment.timestamp",
        "result.result_id", "result.producer", "result.text", "result.value_name", "question", "query",
        "path.pid", "kb.doc_id", "kb.text")]
    cases += [(f"header.{header}", name) for header in ("X-Request-ID", "Idempotency-Key", "Authorization")
              for name in RAW_HEADER_VALUES]
    for n, (where, name) in enumerate(run.take(klass, cases)):
        probe = f"{name} in {where}"
        if where.startswith("header."):
            _raw_header(world, klass, where.split(".", 1)[1], name, probe)
            continue
        value = CONTROL[name]
        if where.startswith("fragment."):
            field = where.split(".")[1]
            fragment = {"id": f"ctl-{n}", "text": "Potassium 4.1 mmol/L.", "section": "Labs"}
            fragment[field] = (fragment.get(field) or "2026-03-01T09:00:00Z") + value
            reply = feed.call("PUT", f"/v1/patients/ctl-{n}", json_body={"patient_id": "x", "fragments": [fragment]})
            run.check(reply, klass, probe, feed, {200, 400, 422})
        elif where.startswith("result."):
            field = where.split(".")[1]
            fields: dict[str, Any] = {"text": "Potassium 4.1 mmol/L."}
            if field == "value_name":
                fields["values"] = [{"name": "Potassium" + value, "value": 4.1, "unit": "mmol/L"}]
            else:
                fields[field] = f"r{n}{value}" if field != "text" else "Potassium 4.1" + value
            message = {**_message(f"ctl-{n}"), **fields}
            reply = feed.call("POST", "/v1/results", json_body=[message])
            run.check(reply, klass, probe, feed, {200, 400, 422})
        elif where in ("question", "query"):
            route, body = ("ask", {"question": "Allergies?" + value}) if where == "question" else \
                ("pack", {"query": "allergies" + value, "window": 512})
            reply = feed.call("POST", f"/v1/patients/p1/{route}", json_body=body)
            run.check(reply, klass, probe, feed, {200, 400, 422})
        elif where == "path.pid":
            reply = feed.raw("GET", b"/v1/patients/p1" + _encoded(value) + b"/fragments")
            run.check(reply, klass, probe, feed, {400, 404, 422})
        else:
            _kb_document(world, klass, kb, probe, f"probe/ctl-{n}" + (value if where == "kb.doc_id" else ""),
                         "Reduce the dose." + (value if where == "kb.text" else ""))


def _raw_header(world: World, klass: str, header: str, name: str, probe: str) -> None:
    feed = world.caller("a_service", klass)
    value = RAW_HEADER_VALUES[name]
    if header == "Authorization":
        reply = feed.raw("GET", b"/v1/patients/p1/fragments", [(b"Authorization", f"Bearer {feed.key}".encode() +
                                                                value)], authorized=False)
    elif header == "Idempotency-Key":
        body = b'{"patient_id": "x", "fragments": [{"id": "idem-ctl", "text": "Weight 70 kg."}]}'
        reply = feed.raw("POST", b"/v1/patients/p1/fragments", [(b"Content-Type", b"application/json"),
                                                                (b"Idempotency-Key", value)], body)
    else:
        reply = feed.raw("GET", b"/v1/patients/p1/fragments", [(b"X-Request-ID", value)])
    world.run.check(reply, klass, probe, feed)


def _kb_document(world: World, klass: str, kb: Any, probe: str, doc_id: str, text: str) -> None:
    reply = kb.call("POST", "/v1/kb/documents", json_body={"documents": [{"doc_id": doc_id, "text": text}]})
    world.run.check(reply, klass, probe, kb, {200, 400, 409, 422})
    if reply.status == 200:
        gone = kb.raw("DELETE", b"/v1/kb/documents/" + _encoded(doc_id, safe="/"))
        added = (reply.json() or {}).get("added")
        world.run.check(gone, klass, probe + " (delete)", kb, lambda r: "" if r.status == 200 and doc_id in (
            (r.json() or {}).get("deleted") or []) else f"the uploaded document (added {added!r}) could not be "
                                                         "deleted by its id")


def _encoded(text: str, safe: str = "") -> bytes:
    """Percent-encoded UTF-8 (a lone surrogate as its three bytes: the server must refuse, not crash)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe=safe).encode()


# ---------------------------------------------------------------------------------------------- request ids


def request_ids(world: World) -> None:
    """A client's X-Request-ID is never stored or echoed as it came when it is long or carries text; every
    answer's id is unique (finding 7; the audit class checks the stored ids)."""
    klass, run = "request-ids", world.run
    feed = world.caller("a_service", klass)
    for (name, sent), path in run.take(klass, list(itertools.product(HOSTILE_REQUEST_IDS.items(), (
            "/v1/patients/p1/fragments", "/v1/patients/p9/fragments", "/healthz")))):
        reply = feed.raw("GET", path.encode(), [(b"X-Request-ID", sent.encode())])
        echoed = reply.request_id

        def bounded(r: Reply, echoed: str = echoed) -> str:
            if not echoed:
                return "no X-Request-ID in the answer"
            if len(echoed) > 128 or any(p in echoed for p in PHI_IN_REQUEST_IDS) or not echoed.isascii():
                return f"echoed a request id of {len(echoed):,} characters or with text from the client"
            return ""

        run.check(reply, klass, f"{name} on {path}", feed, bounded)
    plain = [feed.call("GET", "/healthz", headers={"X-Request-ID": "probe-repeat"}).request_id for _ in range(3)]
    if len(set(plain)) < len(plain):
        run.fail(klass, "the same X-Request-ID three times", 200, "the answers share a request id", plain[0])


# ---------------------------------------------------------------------------------------------- integrator traps


def idempotency(world: World) -> None:
    """An Idempotency-Key reused with another body is a 409 and stores nothing; a true retry is replayed
    (finding 14)."""
    klass, run = "idempotency", world.run
    feed = world.caller("a_service", klass)
    first: dict[str, Any] = {"patient_id": "x", "fragments": [{
        "id": "k1", "text": "Potassium 4.1 mmol/L.", "section": "Labs", "timestamp": "2026-03-14T08:00:00Z"}]}
    changes: dict[str, dict[str, str]] = {"text": {"text": "Potassium 6.9 mmol/L."}, "section": {"section": "Notes"},
               "timestamp": {"timestamp": "2026-03-15T08:00:00Z"}, "id": {"id": "k2"},
               "encounter": {"encounter": "e9"}}
    for n, (what, change) in enumerate(run.take(klass, list(changes.items()))):
        pid, headers = f"idem-{n}", {"Idempotency-Key": f"batch-{n}"}
        feed.call("PUT", f"/v1/patients/{pid}", json_body={"patient_id": pid, "fragments": [
            {"id": "base", "text": "Weight 70 kg."}]})
        run.check(feed.call("POST", f"/v1/patients/{pid}/fragments", json_body=first, headers=headers), klass,
                  f"first use ({what})", feed, {200})
        run.check(feed.call("POST", f"/v1/patients/{pid}/fragments", json_body=first, headers=headers), klass,
                  f"true retry ({what})", feed, lambda r: "" if r.status == 200 and (r.json() or {}).get("replayed")
                  else "a retry with the same body is not replayed")
        second = {**first, "fragments": [{**first["fragments"][0], **change}]}
        run.check(feed.call("POST", f"/v1/patients/{pid}/fragments", json_body=second, headers=headers), klass,
                  f"reused with another {what}", feed, {409})
        stored = feed.call("GET", f"/v1/patients/{pid}/fragments").json() or {}
        texts = {(f["id"], f["text"], f.get("section"), f.get("encounter")) for f in stored.get("fragments", [])}
        new = second["fragments"][0]
        if (new["id"], new["text"], new.get("section"), new.get("encounter")) in texts and what != "timestamp":
            run.fail(klass, f"reused with another {what}", 409, "the conflicting body was stored")
    long_key = feed.call("POST", "/v1/patients/idem-0/fragments", json_body=first,
                         headers={"Idempotency-Key": "k" * 10_000})
    run.check(long_key, klass, "a 10,000-character key", feed, {200, 400, 422})


def record_fields(world: World) -> None:
    """A misspelt record field (timestmp, sectoin, …) is an error, or a warning the answer names; never
    silence (finding 14)."""
    klass, run = "record-fields", world.run
    feed = world.caller("a_service", klass)
    fragment = {"id": "a", "text": "Creatinine 2.8 mg/dL.", "section": "Labs"}
    cases: list[tuple[str, str, Any]] = [("fragment", name, value) for name, value in MISSPELT_FRAGMENT_FIELDS.items()]
    cases += [("record", name, value) for name, value in MISSPELT_RECORD_FIELDS.items()]
    for (level, name, value), (method, path) in run.take(klass, list(itertools.product(cases, [
            ("PUT", "/v1/patients/rf1"), ("POST", "/v1/patients/p1/fragments")]))):
        body: dict[str, Any] = {"patient_id": "rf1", "fragments": [{**fragment, name: value} if level == "fragment"
                                                                   else fragment]}
        if level == "record":
            body[name] = value

        def named(r: Reply, name: str = name) -> str:
            if r.status == 422 or (r.status == 200 and name.strip() in r.text):
                return ""
            return f"misspelt field {name!r} silently ignored ({r.status})"

        run.check(feed.call(method, path, json_body=body), klass, f"{level} field {name!r} {method}", feed, named)


def wait_ms_bounds(world: World) -> None:
    """wait_ms is validated, and waiting for announced results ends within [serve] request_seconds (finding 11)."""
    klass, run = "wait-ms", world.run
    feed = world.caller("a_service", klass)
    invalid: list[Any] = [-1, 600_001, 10**12, "soon", 1.5, None, [], {"ms": 5}]
    for value in run.take(klass, invalid):
        reply = feed.call("POST", "/v1/patients/p1/ask", json_body={"question": QUESTION, "wait_ms": value})
        run.check(reply, klass, f"wait_ms={value!r}", feed, {422})
    if run.left(klass) <= 0:
        run.skipped[klass] += 1
        return
    feed.call("PUT", "/v1/patients/wait1", json_body={"patient_id": "wait1", "fragments": [
        {"id": "a", "text": "Colon biopsy taken.", "section": "Procedures"}]})
    announced = _message("slide-9", patient_id="wait1", kind="pathology", status="pending")
    run.check(feed.call("POST", "/v1/results", json_body=[announced]), klass, "announce a result", feed, {200})
    limit = world.target.request_seconds
    started = time.monotonic()
    reply = feed.call("POST", "/v1/patients/wait1/ask", json_body={"question": "What did the biopsy show?",
                                                                   "wait_ms": 600_000})
    elapsed = time.monotonic() - started
    run.check(reply, klass, "wait_ms=600000 with a result announced", feed,
              lambda r: f"answered after {elapsed:.1f} s, past request_seconds = {limit:g}"
              if elapsed > limit + 2 else "")


def kb_document_ids(world: World) -> None:
    """Document ids with "/" (every file-ingested id), spaces, backslashes, Unicode, "?" and "#" can be
    deleted through the API; traversal and NUL ids are a 4xx; other tenants' admins are refused (finding 12)."""
    klass, run = "kb-doc-ids", world.run
    kb = world.caller("kb_admin", klass)
    if kb.call("GET", "/v1/kb/stats").status == 409:
        run.note("the server has no knowledge base: class kb-doc-ids skipped")
        return
    for doc_id in run.take(klass, ["probe/guides/renal dosing.md", "probe/a/b/c.txt", "probe\\win\\dose.md",
                                   "probe/\u00fcn\u00efc\u00f6de/\u00e7a.md", "probe/q?x=1.md", "probe/#frag.md",
                                   "probe/%2e%2e/encoded.md", "probe/trailing/", "probe/semi;colon.md"]):
        _kb_document(world, klass, kb, f"upload and delete {doc_id!r}", doc_id, "Reduce the dose when eGFR falls.")
    for segment in run.take(klass, [b"../../etc/passwd", b"%2e%2e%2f%2e%2e%2fetc%2fpasswd", b"x%00y", b"%ff%fe",
                                    b"probe/" + b"d" * 400, b"..%5c..%5cwin.ini"]):
        reply = kb.raw("DELETE", b"/v1/kb/documents/" + segment)
        run.check(reply, klass, f"delete {segment[:40].decode()!r}", kb, {400, 404, 422})
    long_id = kb.call("POST", "/v1/kb/documents", json_body={"documents": [{"doc_id": "d" * 301, "text": "x"}]})
    run.check(long_id, klass, "a 301-character id", kb, {422})
    for who in ("a_admin", "a_service"):
        other = world.caller(who, klass)
        reply = other.call("DELETE", "/v1/kb/documents/probe/guides/x.md")
        run.check(reply, klass, f"delete by {who} of tenant {TENANT_A}", other, {403})
