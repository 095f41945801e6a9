"""The C-CDA reader on the six real documents in ../shared/data/fhir_charts (SOURCE.md states their facts), on
the TS converter, and on hostile or broken input."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ebmrag.errors import RecordError
from ebmrag.records.ccda import bundle_from_ccda, ccda_narrative, is_ccda
from ebmrag.records.ccda.values import ts

pytestmark = pytest.mark.data
Bundle = dict[str, Any]

PATIENTS = {  # file stem -> (name text, gender, birth date), from SOURCE.md
    "ccda_ccd_isabella_jones": ("Isabella Jones", "female", "1950-12-19"),
    "ccda_discharge_summary_isabella_jones": ("Isabella Jones", "female", "2005-05-01"),
    "ccda_onc_ambulatory_ccd_adam_everyman": ("Adam Everyman", "male", "1962-10-22"),
    "ccda_progress_note_adam_everyman": ("Mr. Adam Frankie Everyman", "male", "1954-11-25"),
    "ccda_embedded_text_surgical_consult": ("Juan Damore", "male", "1953-03-02"),
    "ccda_embedded_pdf_roger_mcbee": ("Roger Rienman McBee", "male", "1930-09-11"),
}


@pytest.fixture(scope="module")
def charts(shared_data: Path) -> Path:
    return shared_data / "fhir_charts"


@pytest.fixture(scope="module")
def load(charts: Path) -> Callable[[str], Bundle]:
    def convert(stem: str) -> Bundle:
        return bundle_from_ccda((charts / f"{stem}.xml").read_bytes(), f"{stem}.xml")
    return convert


def resources(bundle: Bundle, kind: str) -> list[dict[str, Any]]:
    return [e["resource"] for e in bundle["entry"] if e["resource"]["resourceType"] == kind]


def words(concept: dict[str, Any] | None) -> str:
    """Every text and display of a CodeableConcept, lower-cased, for loose name checks."""
    concept = concept or {}
    return " ".join([concept.get("text") or "", *(c.get("display") or "" for c in concept.get("coding", []))]).lower()


def codes(concept: dict[str, Any] | None) -> set[str]:
    return {c.get("code") for c in (concept or {}).get("coding", [])}


@pytest.mark.parametrize("stem", sorted(PATIENTS))
def test_every_document_converts_with_its_patient(stem: str, charts: Path, load: Callable[[str], Bundle]) -> None:
    raw = (charts / f"{stem}.xml").read_bytes()
    assert is_ccda(raw)
    bundle = load(stem)
    assert bundle["resourceType"] == "Bundle" and bundle["type"] == "collection"
    (patient,) = resources(bundle, "Patient")
    name, gender, born = PATIENTS[stem]
    assert patient["name"][0]["text"] == name
    assert (patient["gender"], patient["birthDate"]) == (gender, born)
    ids = [f"{e['resource']['resourceType']}/{e['resource']['id']}" for e in bundle["entry"]]
    assert len(ids) == len(set(ids)) and ids == [e["fullUrl"] for e in bundle["entry"]]
    targets = set(ids)
    for entry in bundle["entry"]:  # every reference points inside the Bundle
        found = re.findall(r"'reference': '([^']+)'", repr(entry["resource"]))
        assert set(found) <= targets, (stem, set(found) - targets)
    assert all(e["resource"].get("subject", e["resource"].get("patient", {"reference": f"Patient/{patient['id']}"}))
               == {"reference": f"Patient/{patient['id']}"} for e in bundle["entry"])


@pytest.mark.parametrize("stem", sorted(PATIENTS))
def test_bundle_without_notes_is_valid_fhir_r4(stem: str, load: Callable[[str], Bundle]) -> None:
    from fhir.resources.R4B.bundle import Bundle as R4BBundle  # the dev extra: a check on our output only

    bundle = load(stem)
    bundle.pop("ccda_notes")  # ours, not FHIR: a caller strips it before validating
    R4BBundle.model_validate(bundle)


def test_isabella_ccd_states_no_known_allergy_and_no_information_sections(load: Callable[[str], Bundle]) -> None:
    bundle = load("ccda_ccd_isabella_jones")
    (allergy,) = resources(bundle, "AllergyIntolerance")
    assert codes(allergy["code"]) == {"716186003"}
    assert allergy["clinicalStatus"]["coding"][0]["code"] == "active"
    assert not resources(bundle, "MedicationStatement") and not resources(bundle, "Condition")
    notes = " ".join(bundle["ccda_notes"])
    assert "10160-0" in notes and "11450-4" in notes and "nullFlavor NI (no information)" in notes
    (composition,) = resources(bundle, "Composition")
    empty = [s["title"] for s in composition["section"] if "emptyReason" in s]
    assert empty == ["MEDICATIONS", "PROBLEMS"]
    assert all("text" not in s for s in composition["section"] if "emptyReason" in s)
    ecg = next(p for p in resources(bundle, "Procedure") if "268400002" in codes(p["code"]))
    assert "borderline normal" in words(ecg["outcome"])


def test_discharge_summary_allergies_diagnosis_and_ibuprofen(load: Callable[[str], Bundle]) -> None:
    bundle = load("ccda_discharge_summary_isabella_jones")
    allergies = resources(bundle, "AllergyIntolerance")
    assert len(allergies) == 3
    by_name = {words(a["code"]): a for a in allergies}
    penicillin = next(a for n, a in by_name.items() if "penicillin g" in n)
    codeine = next(a for n, a in by_name.items() if "codeine" in n)
    egg = next(a for n, a in by_name.items() if "egg" in n)
    reaction = {id(a): words(a["reaction"][0]["manifestation"][0]) for a in (penicillin, codeine, egg)}
    assert "nausea" in reaction[id(penicillin)] and "wheezing" in reaction[id(codeine)]
    assert "hives" in reaction[id(egg)]  # coded "Wheal"; the narrative the entry points to says Hives
    assert (penicillin["category"], egg["category"]) == (["medication"], ["food"])
    assert (penicillin["onsetDateTime"], egg["onsetDateTime"]) == ("2007-05-01", "1998")
    assert any("74400008" in codes(c["code"]) and "appendicitis" in words(c["code"])
               for c in resources(bundle, "Condition"))
    diagnoses = [c for c in resources(bundle, "Condition") if c["category"][0]["coding"][0]["code"] ==
                 "encounter-diagnosis"]
    assert len(diagnoses) == 2  # admission (42347-5) and discharge ("C-CDAV2-DDN", found by templateId)
    (ibuprofen,) = resources(bundle, "MedicationStatement")
    assert "197806" in codes(ibuprofen["medicationCodeableConcept"])
    assert "ibuprofen 600" in words(ibuprofen["medicationCodeableConcept"])
    assert "every 6 h" in ibuprofen["dosage"][0]["text"] and "Oral" in ibuprofen["dosage"][0]["text"]
    assert ibuprofen["effectivePeriod"] == {"start": "2014-09-16T13:00:00-05:00"}
    assert ibuprofen["status"] == "intended"  # moodCode INT


def test_onc_ccd_null_flavoured_allergen_named_from_narrative(load: Callable[[str], Bundle]) -> None:
    bundle = load("ccda_onc_ambulatory_ccd_adam_everyman")
    allergies = {a["code"]["text"]: a for a in resources(bundle, "AllergyIntolerance")}
    assert set(allergies) == {"Penicillin G benzathine", "Codeine"}
    assert codes(allergies["Codeine"]["code"]) == {"261000"}  # the translation; the code itself is OTH
    for allergy in allergies.values():  # concern acts "completed", status observations "Active"
        assert allergy["clinicalStatus"]["coding"][0]["code"] == "active"
    problems = " ".join(words(c["code"]) for c in resources(bundle, "Condition"))
    assert "asthma" in problems and "costochondritis" in problems
    (albuterol,) = resources(bundle, "MedicationStatement")
    assert "albuterol" in words(albuterol["medicationCodeableConcept"]) and albuterol["status"] == "active"
    co2 = next(o for o in resources(bundle, "Observation") if "2028-9" in codes(o["code"]))
    assert co2["valueQuantity"]["value"] == 25 and co2["valueQuantity"]["unit"] == "mmol/L"
    assert co2["category"][0]["coding"][0]["code"] == "laboratory"
    report = next(r for r in resources(bundle, "DiagnosticReport") if "82374" in codes(r["code"]))
    assert report["result"] == [{"reference": f"Observation/{co2['id']}"}]


def test_progress_note_medications_and_results(load: Callable[[str], Bundle]) -> None:
    bundle = load("ccda_progress_note_adam_everyman")
    allergens = sorted(words(a["code"]) for a in resources(bundle, "AllergyIntolerance"))
    assert len(allergens) == 2 and "codeine" in allergens[0] and "penicillin" in allergens[1]
    drugs = {words(m["medicationCodeableConcept"]).split()[0]: m for m in resources(bundle, "MedicationStatement")}
    assert set(drugs) == {"albuterol", "atenolol"} and {m["status"] for m in drugs.values()} == {"active"}
    observations = resources(bundle, "Observation")
    bun = next(o for o in observations if "3094-0" in codes(o["code"]))
    assert bun["dataAbsentReason"]["text"] == "no value recorded" and "valueQuantity" not in bun
    hemoglobin = next(o for o in observations if "718-7" in codes(o["code"]))
    assert hemoglobin["valueQuantity"]["value"] == 13.2 and hemoglobin["valueQuantity"]["unit"] == "g/dL"
    assert hemoglobin["referenceRange"][0]["text"] == "12.0-15.5 g/dL"
    pneumonia = next(c for c in resources(bundle, "Condition") if "pneumonia" in words(c["code"]))
    assert pneumonia["clinicalStatus"]["coding"][0]["code"] == "resolved"
    assert pneumonia["abatementDateTime"] == "1998-03-16"


def test_embedded_text_document(charts: Path, load: Callable[[str], Bundle]) -> None:
    bundle = load("ccda_embedded_text_surgical_consult")
    (document,) = resources(bundle, "DocumentReference")
    attachment = document["content"][0]["attachment"]
    assert attachment["contentType"] == "text/plain"
    assert "cervical" in base64.b64decode(attachment["data"]).decode("utf-8").lower()
    assert document["date"] == "2020-04-20T19:18:00-08:00"
    assert "34847-4" in codes(document["type"])
    assert resources(bundle, "Patient")[0]["id"] == "ccda-patient"  # the only id is an SSN: not a resource id
    raw = (charts / "ccda_embedded_text_surgical_consult.xml").read_bytes()
    ((title, text),) = ccda_narrative(raw, "consult.xml")
    assert "SURGICAL CONSULT" in title and "M50.30" in text and "cervical" in text.lower()


def test_embedded_pdf_document(load: Callable[[str], Bundle]) -> None:
    bundle = load("ccda_embedded_pdf_roger_mcbee")
    (document,) = resources(bundle, "DocumentReference")
    attachment = document["content"][0]["attachment"]
    assert attachment["contentType"] == "application/pdf"
    pdf = base64.b64decode(attachment["data"], validate=True)
    assert pdf.startswith(b"%PDF") and len(pdf) == 143710
    assert "81334-5" in codes(document["type"])


def test_narrative_of_a_structured_document(charts: Path) -> None:
    raw = (charts / "ccda_discharge_summary_isabella_jones.xml").read_bytes()
    sections = dict(ccda_narrative(raw, "discharge.xml"))
    assert "Penicillin | Nausea | Moderate to severe | Active" in sections["ALLERGIES, ADVERSE REACTIONS, ALERTS"]
    assert "acute appendicitis" in sections["HOSPITAL COURSE"]
    assert len(sections) == 21


@pytest.mark.parametrize(("raw", "expected"), [
    ("2014", "2014"), ("201409", "2014-09"), ("20140917", "2014-09-17"),
    ("201409171030", "2014-09-17T10:30:00"), ("20140917103026", "2014-09-17T10:30:26"),
    ("20140917103026-0500", "2014-09-17T10:30:26-05:00"), ("201409091904-0500", "2014-09-09T19:04:00-05:00"),
    ("20140917103026.123+0130", "2014-09-17T10:30:26.123+01:30"), ("20140917-0500", "2014-09-17"),
    ("2014091710", "2014-09-17T10:00:00"), ("", None), (None, None),
])
def test_timestamps_keep_their_precision(raw: str | None, expected: str | None) -> None:
    assert ts(raw) == expected


@pytest.mark.parametrize("raw", ["2014-09-17", "20141317", "20140230", "201", "yesterday", "20140917 1030",
                                 "20140917-1900"])
def test_malformed_timestamps_are_refused(raw: str) -> None:
    with pytest.raises(ValueError):
        ts(raw)


MINIMAL = """<?xml version="1.0"?>
<ClinicalDocument xmlns="urn:hl7-org:v3" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
  <code code="34133-9" codeSystem="2.16.840.1.113883.6.1"/><effectiveTime value="20200101"/>
  <recordTarget><patientRole><id root="1.2.3" extension="p1"/><patient><name><given>Ann</given><family>Lee</family>
  </name><administrativeGenderCode code="F"/><birthTime value="1970"/></patient></patientRole></recordTarget>
  <component><structuredBody>{body}</structuredBody></component>
</ClinicalDocument>"""
BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<ClinicalDocument xmlns="urn:hl7-org:v3"><title>&lol3;</title></ClinicalDocument>"""
EXTERNAL = """<?xml version="1.0"?>
<!DOCTYPE doc [<!ENTITY secret SYSTEM "file:///etc/passwd">]>
<ClinicalDocument xmlns="urn:hl7-org:v3"><title>&secret;</title></ClinicalDocument>"""


@pytest.mark.parametrize(("data", "message"), [
    (b'{"resourceType": "Bundle"}', "not well-formed XML"),
    (b"", "not well-formed XML"),
    ("<Bundle xmlns='http://hl7.org/fhir'/>", "not an HL7 v3 ClinicalDocument"),
    ("<ClinicalDocument/>", "not an HL7 v3 ClinicalDocument"),  # right name, no namespace
    (BILLION_LAUGHS, "refused XML"),
    (EXTERNAL, "refused XML"),
    ("<ClinicalDocument xmlns='urn:hl7-org:v3'><title>x</title></ClinicalDocument>", "no recordTarget/patientRole"),
])
def test_unreadable_documents_raise_record_error(data: bytes | str, message: str) -> None:
    with pytest.raises(RecordError, match=re.escape(message)) as raised:
        bundle_from_ccda(data, "upload.xml")
    assert raised.value.where == "upload.xml"
    if "recordTarget" in message:  # the narrative needs no patient (a C-CDA inside a FHIR attachment)
        assert ccda_narrative(data, "upload.xml") == []
        return
    with pytest.raises(RecordError):
        ccda_narrative(data, "upload.xml")


@pytest.mark.parametrize(("data", "expected"), [
    ("\ufeff<?xml version='1.0'?><?xml-stylesheet href='x.xsl'?><!-- a -- comment --><ClinicalDocument "
     "xmlns='urn:hl7-org:v3'>", True),
    (b"\xef\xbb\xbf<!-- c --><cda:ClinicalDocument xmlns:cda=\"urn:hl7-org:v3\">", True),
    ("<ClinicalDocument xmlns:xsi='http://www.w3.org/2001/XMLSchema-instance'\n xmlns='urn:hl7-org:v3'>", True),
    ("<ClinicalDocument xmlns='urn:other'>", False),
    ("<ClinicalDocument>", False),
    ('{"resourceType": "Bundle"}', False),
    ("<Bundle xmlns='urn:hl7-org:v3'>", False),
])
def test_sniff(data: bytes | str, expected: bool) -> None:
    assert is_ccda(data) is expected


ALLERGY = """<component><section><code code="48765-2" codeSystem="2.16.840.1.113883.6.1"/><title>Allergies</title>
<text><table><tr ID="a1" styleCode="Bold"><td>Sulfa &amp; &lt;others&gt;</td></tr></table>
<renderMultiMedia referencedObject="img"/><paragraph>See <linkHtml href="https://x.org/a">link</linkHtml></paragraph>
</text>{entries}</section></component>"""
ENTRY = """<entry><act classCode="ACT" moodCode="EVN"><statusCode code="active"/>
<entryRelationship typeCode="SUBJ"><observation classCode="OBS" moodCode="EVN"{negation}>
<templateId root="2.16.840.1.113883.10.20.22.4.7"/><effectiveTime><low value="{onset}"/></effectiveTime>
<value xsi:type="CD" code="416098002" codeSystem="2.16.840.1.113883.6.96"/>
<participant typeCode="CSM"><participantRole><playingEntity>{allergen}</playingEntity></participantRole></participant>
</observation></entryRelationship></act></entry>"""
SULFA = '<code code="10180" codeSystem="2.16.840.1.113883.6.88" displayName="sulfamethoxazole"/>'


def test_allergy_edge_cases_and_narrative_xhtml() -> None:
    entries = "".join([
        ENTRY.format(negation="", onset="2001", allergen=SULFA),
        ENTRY.format(negation="", onset="2001", allergen=""),  # no allergen, not negated: skipped
        ENTRY.format(negation=' negationInd="true"', onset="", allergen='<code nullFlavor="NA"/>'),
        ENTRY.format(negation=' negationInd="true"', onset="", allergen=SULFA),  # not allergic to sulfa
        ENTRY.format(negation="", onset="20011345", allergen=SULFA),  # bad onset: kept without it
    ])
    bundle = bundle_from_ccda(MINIMAL.format(body=ALLERGY.format(entries=entries)), "made.xml")
    allergies = resources(bundle, "AllergyIntolerance")
    assert [a["id"] for a in allergies] == ["ccda-allergy-1", "ccda-allergy-2", "ccda-allergy-3", "ccda-allergy-4"]
    first, no_known, refuted, undated = allergies
    assert first["onsetDateTime"] == "2001" and first["clinicalStatus"]["coding"][0]["code"] == "active"
    assert codes(no_known["code"]) == {"409137002"}  # the value says drug allergy: no known drug allergy
    assert refuted["verificationStatus"]["coding"][0]["code"] == "refuted" and "clinicalStatus" not in refuted
    assert "onsetDateTime" not in undated
    notes = bundle["ccda_notes"]
    assert any(n.startswith("entry 2 of section 48765-2 Allergies: no allergen and no negation") for n in notes)
    assert any(n.startswith("entry 5 of section 48765-2 Allergies: onset") and "kept" in n for n in notes)
    div = resources(bundle, "Composition")[0]["section"][0]["text"]["div"]
    assert div.startswith('<div xmlns="http://www.w3.org/1999/xhtml"><table><tr><td>Sulfa &amp; &lt;others&gt;</td>')
    assert "styleCode" not in div and "ID=" not in div and "img" not in div
    assert '<p>See <a href="https://x.org/a">link</a></p>' in div


def test_a_broken_entry_costs_only_that_entry(charts: Path) -> None:
    raw = (charts / "ccda_progress_note_adam_everyman.xml").read_text(encoding="utf-8")
    broken, n = re.subn(r'(code="718-7".*?<effectiveTime value=")201303110830-0800', r"\g<1>2013-03-11 soon", raw,
                        count=1, flags=re.S)
    broken, m = re.subn(r'(code="197380".*?)', r"\1", broken, count=1)
    broken, k = re.subn(r'(<low value=")20120318(")', r"\1garbage\2", broken, count=1)  # atenolol's start
    assert n == m == k == 1
    bundle = bundle_from_ccda(broken, "broken.xml")
    observations = {next(iter(codes(o["code"]))) for o in resources(bundle, "Observation")}
    assert "718-7" not in observations and {"6690-2", "777-3", "4544-3", "789-8", "3094-0"} <= observations
    (cbc, *_) = [r for r in resources(bundle, "DiagnosticReport") if "57021-8" in codes(r["code"])]
    assert len(cbc["result"]) == 4
    drugs = [words(m["medicationCodeableConcept"]) for m in resources(bundle, "MedicationStatement")]
    assert len(drugs) == 1 and "albuterol" in drugs[0]
    notes = bundle["ccda_notes"]
    assert any("component 1" in n and "30954-2" in n and "2013-03-11 soon" in n for n in notes)
    assert any(n.startswith("entry 2 of section 10160-0 MEDICATIONS") and "garbage" in n for n in notes)
    assert len(resources(bundle, "AllergyIntolerance")) == 2 and len(resources(bundle, "Condition")) == 3


def test_an_allergy_without_its_value_is_kept_and_reported(charts: Path) -> None:
    raw = (charts / "ccda_discharge_summary_isabella_jones.xml").read_text(encoding="utf-8")
    broken, n = re.subn(r'<value xsi:type="CD" code="419511003"[^>]*> </value>', "", raw, count=1)
    assert n == 1
    bundle = bundle_from_ccda(broken, "broken.xml")
    allergies = resources(bundle, "AllergyIntolerance")
    penicillin = next(a for a in allergies if "penicillin" in words(a["code"]))
    assert len(allergies) == 3 and "type" not in penicillin and "category" not in penicillin
    assert any("no allergy type" in n and "penicillin" in n.lower() for n in bundle["ccda_notes"])


def test_the_fhir_reader_renders_a_converted_document(load: Callable[[str], Bundle]) -> None:
    from ebmrag.records.fhir.bundle import record_from_fhir_bundle

    bundle = load("ccda_discharge_summary_isabella_jones")
    bundle.pop("ccda_notes")
    record = record_from_fhir_bundle(bundle, "discharge.xml")
    text = " ".join(f.text for f in record.fragments).lower()
    assert "penicillin" in text and "appendicitis" in text and "ibuprofen" in text


def test_narrative_of_an_embedded_pdf(charts: Path) -> None:
    raw = (charts / "ccda_embedded_pdf_roger_mcbee.xml").read_bytes()
    ((title, text),) = ccda_narrative(raw, "pdf.xml")
    assert title == "Personal Advance Care Document" and "Roger Rienman McBee" in text
