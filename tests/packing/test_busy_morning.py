"""Issue 46: on a busy morning, six critical facts told in long ordinary sentences are all packed at 256 tokens,
beside twenty one-line normal results and routine nursing notes of the same day. Before criticality ranked inside
the level, the solver counted fragments and the short normal lines won (1 of 6 packed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ebmrag.evidence.tiering import Tiering
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.types import State
from ebmrag.records.fragment import Fragment, PatientRecord

MORNING = datetime(2026, 5, 14, 7, 0, tzinfo=UTC)

CRITICAL = {  # written for this test; each states one critical fact of its own kind, at length
    "angioedema": ("Progress note", "Since the ramipril was started three weeks ago she has had two episodes of "
                   "swelling of the lips and tongue, the second one during the night, so the medical registrar has "
                   "stopped it and asked that no ACE inhibitor be restarted."),
    "cephalosporin": ("Nursing admission", "Her son told the admitting nurse that in a previous hospital stay she "
                      "had an anaphylactic reaction with low blood pressure needing adrenaline shortly after "
                      "intravenous cefuroxime was given before an operation."),
    "biopsy": ("Ward round", "The core biopsy taken from the left breast mass was reported late yesterday as "
               "invasive ductal carcinoma, grade 3, oestrogen receptor negative and HER2 amplified, with "
               "lymphovascular invasion seen in the sample."),
    "potassium": ("Ward round", "The blood gas taken after the fall at six o'clock this morning showed a potassium "
                  "of 6.9 mmol/L, and the renal team have been asked to review her as a matter of urgency."),
    "dpyd": ("Ward round", "The pharmacogenomic panel sent before chemotherapy came back today showing that she is "
             "heterozygous for the DPYD c.1905+1G>A variant, which the oncology pharmacist has flagged."),
    "haemoglobin": ("Ward round", "Her haemoglobin this morning was 6.2 g/dL, down from 9.6 g/dL two days ago, "
                    "after dark tarry stools overnight, and two units of red cells have been cross-matched."),
}

ROUTINE = [  # one-line normal results and routine notes of the same morning
    ("Results", "Sodium 139 mmol/L (135-145)"), ("Results", "Chloride 102 mmol/L (98-107)"),
    ("Results", "Bicarbonate 25 mmol/L (22-29)"), ("Results", "Urea 5.1 mmol/L (2.5-7.8)"),
    ("Results", "Glucose 5.4 mmol/L (3.9-7.8)"), ("Results", "Calcium 2.35 mmol/L (2.20-2.60)"),
    ("Results", "Magnesium 0.85 mmol/L (0.70-1.00)"), ("Results", "Phosphate 1.1 mmol/L (0.8-1.5)"),
    ("Results", "Albumin 40 g/L (35-50)"), ("Results", "Bilirubin 9 umol/L (0-21)"),
    ("Results", "ALT 22 U/L (0-40)"), ("Results", "Platelets 245 x10^9/L (150-400)"),
    ("Results", "White cell count 7.2 x10^9/L (4.0-11.0)"), ("Results", "CRP 3 mg/L (0-5)"),
    ("Results", "TSH 1.9 mU/L (0.4-4.0)"), ("Results", "Urinalysis: negative"),
    ("Results", "Chest X-ray: no acute abnormality"), ("Results", "ECG: sinus rhythm, normal intervals"),
    ("Nursing note", "Slept well overnight."), ("Nursing note", "Observations stable, afebrile."),
    ("Nursing note", "Ate most of her breakfast."), ("Nursing note", "Walking to the bathroom with a frame."),
]


def _morning() -> PatientRecord:
    fragments = [Fragment(f"crit-{key}", "busy", text, section, MORNING - timedelta(minutes=n))
                 for n, (key, (section, text)) in enumerate(CRITICAL.items())]
    fragments += [Fragment(f"routine-{n}", "busy", text, section, MORNING - timedelta(minutes=10 + n))
                  for n, (section, text) in enumerate(ROUTINE)]
    return PatientRecord("busy", tuple(fragments))


@pytest.mark.parametrize("strategy", ["ebm-exact", "ebm-greedy"])
def test_six_critical_facts_in_long_sentences_all_fit_in_256_tokens(context_packer: ContextPacker,
                                                                    tiering: Tiering, strategy: str) -> None:
    record = tiering.run(_morning())
    packer = context_packer.with_params(context_packer.settings.__class__(strategy=strategy))
    result = packer.run(record, "What matters most for her care this morning?", window=256)
    packed = {p.fragment_id: p for p in result.packed}
    missing = [key for key in CRITICAL if f"crit-{key}" not in packed]
    assert not missing, (strategy, missing, [(d.fragment_id, d.reason.value, d.detail) for d in result.dropped])
    assert result.tokens_used <= 256


def test_normal_results_are_not_findings_of_the_encounter(tiering: Tiering) -> None:
    decisions = {f.id: f.decision for f in tiering.run(_morning()).fragments}
    normal = [fid for fid, d in decisions.items() if fid.startswith("routine-") and d and d.flag == "normal"]
    assert len(normal) >= 12, normal  # the lines with a written range or a normality statement
    assert decisions["crit-potassium"] is not None and decisions["crit-potassium"].critical


def test_a_state_says_which_it_is(context_packer: ContextPacker, tiering: Tiering) -> None:
    result = context_packer.run(tiering.run(_morning()), "What matters most for her care this morning?", window=256)
    states = {p.state for p in result.packed if p.fragment_id.startswith("crit-")}
    assert states <= {State.FULL, State.COMPRESSED, State.FACT}
    assert all(p["state"] in {"full", "compressed", "fact"} for p in result.to_json()["packed"])
