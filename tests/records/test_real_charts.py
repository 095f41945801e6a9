"""Issue 29: every real chart in ../shared/data/fhir_charts is read, and what a clinician needs from it reaches the
packed context.

These are the acceptance tests of the chart-reader rewrite (src/ebmrag/records/). The charts are public test and
synthetic patients from several vendors and countries (SOURCE.md beside them lists each file's habits); the facts
below are copied from SOURCE.md's "Facts", one entry per file. A new chart file joins the "loads" test by itself
(glob) and fails `test_every_chart_has_its_facts_written_down` until its facts are written here.

Patterns are searched case-insensitively and allow reasonable wording ("creatinine ... 88" with no other number
between). Where SOURCE.md is ambiguous the stricter, clinically safer reading is taken; each such choice says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from ebmrag.evidence.tiering import Tiering
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.types import PackResult
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.records.loaders import load_record

CHART_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "fhir_charts"
CHART_FILES = sorted(p.name for p in [*CHART_DIR.glob("*.json"), *CHART_DIR.glob("*.xml")])

SUMMARY = "Summarise this patient's allergies, active problems, current medications and key results."
DRUG_CHOICE = "Which antibiotic is safe to prescribe for this patient's infection?"

NKA = r"no known (drug )?allerg"
# No allergy entry and no allergy statement in the chart: the context must still say so (and never that the
# patient has none); absence of a record is not "no known allergies" (see test_unrecorded_allergies_...).
ALLERGY_STATUS = r"allerg"
PREGNANT = r"(?<!not )\bpregnant\b"
ADVANCE_PLAN = r"advance (care plan|(digital )?directive)"


def lab(name: str, value: str) -> str:
    """A result followed by its value with no other number between ("Creatinine [Moles/volume]...: 88 umol/L")."""
    return rf"(?:{name})\D{{0,60}}{re.escape(value)}"


# W = 1024, the summary question: allergies, active problems, current medications, renal labs, pregnancy.
SUMMARY_FACTS: dict[str, tuple[str, ...]] = {
    "ips_nz_peter_jordan_labs_document.json": (
        NKA, r"hypertension", r"gout", r"lisinopril", r"ultraproct|cinchocaine", lab("creatinine", "88"),
        lab("egfr|ckd-epi", "78"), lab("potassium", "4.7")),
    "ips_at_elga_german_document.json": (
        r"penicillin", r"mobilit", r"r(ö|oe)teln|rubella", r"aspirin", r"ciproxin|ciprofloxacin",
        lab("kalium|potassium", "4.96")),
    "ips_cy_pregnancy_document.json": (r"\bfish\b", r"\bfigs?\b", PREGNANT, r"hyperemesis"),
    "ips_nl_dutch_malformed_document.json": (
        r"perazine", r"sarsaparill", r"fazant|pheasant", r"depressi", r"acenocoumarol", r"fenprocoumon|marcoumar",
        lab("creatinine", "67"), lab("egfr|ckd-epi", "83")),
    "ips_it_italian_codes_document.json": (
        NKA, r"attention deficit|adhd", r"substance abuse", r"tonsillitis", r"hearing", r"methylphenidate",
        r"diazepam"),
    "ips_dk_danish_medication_card_document.json": (
        ALLERGY_STATUS, r"humira", r"remsima", r"biktarvy", r"dovato", r"tegretol", r"irbesartan", r"mirtazapin"),
    "ips_us_meditech_renal_transplant_searchset.json": (
        r"ampicillin", r"penicillin", r"rejection of renal transplant|renal transplant rejection",
        r"anemia (in|of) (chronic kidney|renal)", r"hypertension", r"hypothyroidism", r"interstitial pneumonia"),
    "ips_us_epic_document.json": (
        r"nickel", r"lactose", r"hypertension", r"polycystic|pcos", r"bronchitis", r"ferrous gluconate|fergon",
        r"multivitamin", r"drospirenone|yaz"),
    "au_gpvisit_no_ids_document.json": (
        NKA, r"hypercholesterol", r"diabetes", r"hypertension", r"gout", r"copd", r"zyloprim|allopurinol",
        r"telmisartan"),
    "au_noknown_negations_document.json": (NKA, r"no (known )?(current )?medic", r"no current problem"),
    "au_missing_composition_elements_document.json": (
        r"lactose", r"gluten", r"chlorhexidine", r"bisoprolol", r"no current problem"),
    "fhirconv_discharge_summary_batch.json": (r"penicillin", r"codeine", r"\beggs?\b", r"appendicitis", r"ibuprofen"),
    "fhirconv_onc_ambulatory_ccd_batch.json": (r"penicillin", r"codeine", r"asthma", r"costochondritis", r"albuterol"),
    # Facts name only the advance care plan (LOINC 81334-5; a PDF three encodings deep, titled "Universal Advance
    # Digital Directive") and no structured allergy.
    "fhirconv_embedded_pdf_batch.json": (ADVANCE_PLAN, ALLERGY_STATUS),
    "uscore_amy_shaw_collection.json": (
        r"sulfonamide", r"latex", PREGNANT, lab("creatinine", "1") + r"(\.0+)?\s*mg", lab("potassium", "5.4"),
        r"nizatidine", r"tylenol", r"duodenal ulcer"),
    "synthea_ckd_diabetes_transaction.json": (
        r"chronic kidney disease", r"carbamazepine|tegretol", r"hydrochlorothiazide", r"metformin",
        r"humulin|insulin", lab("creatinine", "1.51"), lab("egfr|glomerular filtration rate", "79"),
        lab("potassium", "4.58")),
    "ecr_eicr_not_pregnant_batch.json": (
        r"covid|sars-cov-2|coronavirus 2", r"detected", r"not pregnant", ALLERGY_STATUS),
    # "No medication or problem information" is not a fact to pack; the procedure and the ECG are what there is.
    "ccda_ccd_isabella_jones.xml": (NKA, r"appendectomy", r"borderline"),
    "ccda_discharge_summary_isabella_jones.xml": (
        r"penicillin", r"codeine", r"\beggs?\b", r"appendicitis", r"ibuprofen"),
    "ccda_progress_note_adam_everyman.xml": (
        r"penicillin", r"codeine", r"albuterol|proventil", r"atenolol", r"diabetes", r"asthma",
        lab("hemoglobin|haemoglobin|\bhgb\b", "13.2"), lab("platelets?|\bplt\b", "123")),
    "ccda_embedded_pdf_roger_mcbee.xml": (ADVANCE_PLAN, ALLERGY_STATUS),
    # A dictated note with no allergy section: conservative reading, the reader still states the allergy status.
    "ccda_embedded_text_surgical_consult.xml": (
        r"cervical disc degeneration", r"cervical pain", r"focal neuro", ALLERGY_STATUS),
    "ccda_onc_ambulatory_ccd_adam_everyman.xml": (
        r"penicillin", r"codeine", r"asthma", r"costochondritis", r"albuterol", lab(r"co2|carbon dioxide", "25")),
}

# W = 256, the drug-choice question: every allergy (or the no-known-allergy status, or that none is recorded),
# pregnancy status where recorded, creatinine / eGFR / potassium where recorded.
DRUG_FACTS: dict[str, tuple[str, ...]] = {
    "ips_nz_peter_jordan_labs_document.json": (
        NKA, lab("creatinine", "88"), lab("egfr|ckd-epi", "78"), lab("potassium", "4.7")),
    "ips_at_elga_german_document.json": (r"penicillin", lab("kalium|potassium", "4.96")),
    "ips_cy_pregnancy_document.json": (r"\bfish\b", r"\bfigs?\b", PREGNANT),
    "ips_nl_dutch_malformed_document.json": (
        r"perazine", r"sarsaparill", r"fazant|pheasant", lab("creatinine", "67"), lab("egfr|ckd-epi", "83")),
    "ips_it_italian_codes_document.json": (NKA,),
    "ips_dk_danish_medication_card_document.json": (ALLERGY_STATUS,),
    # Its renal results sit in a fixed-width text report that SOURCE.md's facts do not quote; its kidney transplant
    # and chronic kidney disease are conditions, and a drug decision turns on them (issue 47).
    "ips_us_meditech_renal_transplant_searchset.json": (r"ampicillin", r"penicillin", r"kidney transplant"),
    "ips_us_epic_document.json": (r"nickel", r"lactose"),
    "au_gpvisit_no_ids_document.json": (NKA,),
    "au_noknown_negations_document.json": (NKA,),
    "au_missing_composition_elements_document.json": (r"lactose", r"gluten", r"chlorhexidine"),
    "fhirconv_discharge_summary_batch.json": (r"penicillin", r"codeine", r"\beggs?\b"),
    "fhirconv_onc_ambulatory_ccd_batch.json": (r"penicillin", r"codeine"),
    "fhirconv_embedded_pdf_batch.json": (ALLERGY_STATUS,),
    "uscore_amy_shaw_collection.json": (
        r"sulfonamide", r"latex", PREGNANT, lab("creatinine", "1") + r"(\.0+)?\s*mg", lab("potassium", "5.4")),
    "synthea_ckd_diabetes_transaction.json": (
        ALLERGY_STATUS, r"\bCKD\b|chronic kidney disease", lab("creatinine", "1.51"),
        lab("egfr|glomerular filtration rate", "79"), lab("potassium", "4.58")),
    "ecr_eicr_not_pregnant_batch.json": (ALLERGY_STATUS, r"not pregnant"),
    "ccda_ccd_isabella_jones.xml": (NKA,),
    "ccda_discharge_summary_isabella_jones.xml": (r"penicillin", r"codeine", r"\beggs?\b"),
    "ccda_progress_note_adam_everyman.xml": (r"penicillin", r"codeine"),
    "ccda_embedded_pdf_roger_mcbee.xml": (ALLERGY_STATUS,),
    "ccda_embedded_text_surgical_consult.xml": (ALLERGY_STATUS,),
    "ccda_onc_ambulatory_ccd_adam_everyman.xml": (r"penicillin", r"codeine"),
}

NO_KNOWN_ALLERGY = ("ips_nz_peter_jordan_labs_document.json", "ips_it_italian_codes_document.json",
                    "au_gpvisit_no_ids_document.json", "au_noknown_negations_document.json",
                    "ccda_ccd_isabella_jones.xml")
NEGATION_AS_ALLERGY = r"allergy to no[- ]known|allergy to no current|allergy to nka"
# No allergy entry and no allergy statement at all: "not recorded" must never read as "no known allergies".
UNRECORDED_ALLERGY = ("ips_dk_danish_medication_card_document.json", "synthea_ckd_diabetes_transaction.json",
                      "ecr_eicr_not_pregnant_batch.json", "fhirconv_embedded_pdf_batch.json",
                      "ccda_embedded_pdf_roger_mcbee.xml", "ccda_embedded_text_surgical_consult.xml")

# Drugs whose every order is stopped, cancelled or completed (SOURCE.md), never on an active-medication line.
STOPPED: dict[str, tuple[str, ...]] = {
    "ips_us_meditech_renal_transplant_searchset.json": (
        r"acetaminophen|tylenol", r"aranesp|darbepoetin", r"clindamycin", r"torsemide", r"fenofibric",
        r"mycophenol", r"everolimus|zortress", r"ciprofloxacin|\bcipro\b", r"ceftriaxone|rocephin"),
    "ips_nz_peter_jordan_labs_document.json": (r"cilazapril",),
    # Facts list the four active drugs; carbamazepine's stopped duplicate is caught by the status words below,
    # meperidine and acetaminophen are the chart's other (stopped) orders.
    "synthea_ckd_diabetes_transaction.json": (r"meperidine", r"acetaminophen"),
    # "No known medications" is an active MedicationStatement: a negation, not a drug the patient takes. The face
    # sheet may quote it as the chart's statement, never list it as one of the drugs.
    "au_noknown_negations_document.json": (r"active medications \(\d+[^)]*\):[^.]*no known",
                                           r"^medication statement: no known"),
}
STOPPED_WORDS = r"\b(stopped|cancell?ed|completed)\b"
ACTIVE = re.compile(r"(?<!not )\bactive\b", re.IGNORECASE)  # "Medication order > not active" is not active

# Each C-CDA and its FHIR conversion: the decisive names (SOURCE.md) both must yield, by category.
PAIRS = {
    # The C-CDA's narrative says "Penicillin" and "Eggs" where its codes say "penicillin G" and "Egg": either is the
    # document's own word, so the name both readings share is compared (plurals fold, see `named`).
    "discharge summary": ("ccda_discharge_summary_isabella_jones.xml", "fhirconv_discharge_summary_batch.json",
                          {"Allergy": {"penicillin", "codeine", "egg"}, "Problem list": {"appendicitis"},
                           "Medication": {"ibuprofen"}}),
    "ONC ambulatory CCD": ("ccda_onc_ambulatory_ccd_adam_everyman.xml", "fhirconv_onc_ambulatory_ccd_batch.json",
                           {"Allergy": {"penicillin g benzathine", "codeine"},
                            "Problem list": {"asthma", "costochondritis"}, "Medication": {"albuterol"}}),
    "embedded PDF": ("ccda_embedded_pdf_roger_mcbee.xml", "fhirconv_embedded_pdf_batch.json",
                     {"Allergy": set(), "Problem list": set(), "Medication": set()}),
}


@pytest.fixture(scope="module")
def chart_dir(shared_data: Path) -> Path:
    if not (shared_data / "fhir_charts").is_dir():
        pytest.skip("no fhir_charts folder in the shared data")
    return shared_data / "fhir_charts"


@cache
def _load(path: Path) -> PatientRecord:
    return load_record(path)


@pytest.fixture(scope="module")
def packed(context_packer: ContextPacker, tiering: Tiering, chart_dir: Path) -> Callable[[str, str, int], PackResult]:
    results: dict[tuple[str, str, int], PackResult] = {}

    def pack(name: str, question: str, window: int) -> PackResult:
        if (name, question, window) not in results:
            results[name, question, window] = context_packer.run(tiering.run(_load(chart_dir / name)), question,
                                                                 window)
        return results[name, question, window]
    return pack


def face_sheet(record: PatientRecord) -> list[Fragment]:
    return [f for f in record.fragments if f.section == "Patient summary" or f.id.startswith("summary/")]


def missing(patterns: tuple[str, ...], text: str) -> list[str]:
    return [p for p in patterns if not re.search(p, text, re.IGNORECASE)]


def test_every_chart_has_its_facts_written_down(chart_dir: Path) -> None:
    assert CHART_FILES, f"no chart found in {CHART_DIR}"
    assert set(SUMMARY_FACTS) == set(DRUG_FACTS) == set(CHART_FILES)


@pytest.mark.parametrize("name", CHART_FILES)
def test_every_chart_loads_and_says_what_it_left_out(chart_dir: Path, name: str) -> None:
    record = _load(chart_dir / name)
    assert record.fragments, f"{name}: no fragment"
    assert all(re.fullmatch(r"\S.*: \S.*", line) for line in record.skipped), record.skipped
    if name.endswith(".json"):  # every resource type is read (a fragment id names it) or its omission is explained
        entries = json.loads((chart_dir / name).read_text(encoding="utf-8")).get("entry") or []
        kinds = {str((e.get("resource") or {}).get("resourceType")) for e in entries}
        unaccounted = {k for k in kinds if not any(f.id.startswith(f"{k}/") for f in record.fragments)
                       and not any(re.search(rf"\b{k}\b", line) for line in record.skipped)}
        assert not unaccounted, f"{name}: read silently past {sorted(unaccounted)}; skipped = {record.skipped}"


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("name", sorted(SUMMARY_FACTS))
def test_summary_context_holds_the_decisive_facts(packed: Callable[[str, str, int], PackResult], name: str) -> None:
    context = packed(name, SUMMARY, 1024).context
    assert not missing(SUMMARY_FACTS[name], context), f"{name}: {missing(SUMMARY_FACTS[name], context)}\n{context}"


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("name", sorted(DRUG_FACTS))
def test_drug_choice_context_holds_allergies_pregnancy_and_kidney(
        packed: Callable[[str, str, int], PackResult], name: str) -> None:
    context = packed(name, DRUG_CHOICE, 256).context
    assert not missing(DRUG_FACTS[name], context), f"{name}: {missing(DRUG_FACTS[name], context)}\n{context}"


@pytest.mark.parametrize("name", NO_KNOWN_ALLERGY)
def test_no_known_allergy_code_is_not_an_allergy(chart_dir: Path, name: str) -> None:
    record = _load(chart_dir / name)
    assert not [f.text for f in record.fragments if re.search(NEGATION_AS_ALLERGY, f.text, re.IGNORECASE)]
    assert any(re.search(NKA, f.text, re.IGNORECASE) for f in face_sheet(record)), face_sheet(record)


@pytest.mark.model
@pytest.mark.parametrize("name", NO_KNOWN_ALLERGY)
def test_no_known_allergy_code_is_not_packed_as_an_allergy(
        packed: Callable[[str, str, int], PackResult], name: str) -> None:
    for question, window in ((SUMMARY, 1024), (DRUG_CHOICE, 256)):  # the no-known status itself: the tables above
        context = packed(name, question, window).context
        assert not re.search(NEGATION_AS_ALLERGY, context, re.IGNORECASE), context


@pytest.mark.parametrize("name", UNRECORDED_ALLERGY)
def test_unrecorded_allergies_are_not_called_no_known_allergies(chart_dir: Path, name: str) -> None:
    sheet = " ".join(f.text for f in face_sheet(_load(chart_dir / name)))
    assert re.search(r"allerg", sheet, re.IGNORECASE) and not re.search(NKA, sheet, re.IGNORECASE), sheet


@pytest.mark.parametrize("name", sorted(STOPPED))
def test_stopped_medications_are_not_listed_as_active(chart_dir: Path, name: str) -> None:
    active = [f.text for f in _load(chart_dir / name).fragments
              if f.section and ACTIVE.search(f.section) and "medication" in f.section.lower()]
    listed = [p for p in (*STOPPED[name], STOPPED_WORDS) if any(re.search(p, t, re.IGNORECASE) for t in active)]
    assert not listed, f"{name}: {listed} on an active-medication line: {active}"


def normalise(text: str) -> str:
    """Lower case, no parenthesised or bracketed asides, no doses: 'Ibuprofen 600mg Oral Tablet' -> 'ibuprofen oral
    tablet'."""
    text = re.sub(r"\([^)]*\)|\[[^\]]*\]", " ", text.lower())
    text = re.sub(r"\d+(\.\d+)?\s*(mg|mcg|ml|g|%|unt|actuat)\b", " ", text)
    return " ".join(re.findall(r"[a-z]+", text))


def named(record: PatientRecord, section: str, names: set[str]) -> tuple[set[str], set[str]]:
    """The decisive names found in a category's fragments, and all of its fragments, normalised."""
    texts = {normalise(f.text) for f in record.fragments if (f.section or "").startswith(section)}
    return {n for n in names if any(re.search(rf"\b{n}s?\b", t) for t in texts)}, texts


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_ccda_and_its_fhir_conversion_agree(chart_dir: Path, pair: str) -> None:
    ccda_file, fhir_file, decisive = PAIRS[pair]
    ccda, fhir = _load(chart_dir / ccda_file), _load(chart_dir / fhir_file)
    for section, names in decisive.items():
        (from_ccda, ccda_texts), (from_fhir, fhir_texts) = named(ccda, section, names), named(fhir, section, names)
        assert from_ccda == from_fhir == names, f"{pair}, {section}: C-CDA {ccda_texts}, FHIR {fhir_texts}"
        if not names:  # nothing structured on either side: neither may invent an entry
            assert ccda_texts == fhir_texts, f"{pair}, {section}: C-CDA {ccda_texts}, FHIR {fhir_texts}"


def test_partial_dates_keep_their_precision(chart_dir: Path) -> None:
    record = _load(chart_dir / "ips_at_elga_german_document.json")
    rubella = [f.text for f in record.fragments if re.search(r"r(ö|oe)teln|rubella", f.text, re.IGNORECASE)]
    assert rubella and any("2016-03" in t for t in rubella) and not any("2016-03-01" in t for t in rubella), rubella
