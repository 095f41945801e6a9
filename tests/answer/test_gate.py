from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.answer.gate import Action, GateParams, Label, LabelledSentence, RetrievalGate, RuleLabeller
from ebmrag.eval.cases import load_cases
from ebmrag.eval.gate_report import gate_report, gate_runs
from ebmrag.evidence.entities import default_extractor
from ebmrag.evidence.questions import QuestionClassifier, default_question_classifier
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.kvcache import KeyValueCache
from ebmrag.records.fragment import Fragment, PatientRecord


def _labeller(store: KeyValueCache | None = None) -> RuleLabeller:
    """The rule labeller over the bundled tier rules and entity lexicon (the root hands these to the gate)."""
    return RuleLabeller(TierClassifier(), default_extractor(), store)


def _gate(params: GateParams | None = None) -> RetrievalGate:
    return RetrievalGate(_labeller(), default_question_classifier(), params)


def _record(*texts: str, section: str | None = None) -> PatientRecord:
    return PatientRecord("p", tuple(Fragment(f"f{i}", "p", t, section) for i, t in enumerate(texts)))


@pytest.mark.parametrize(("text", "section", "label"), [
    ("Biopsy shows adenocarcinoma of the sigmoid colon.", None, Label.A),
    ("Serum creatinine 2.8 mg/dL.", "Blood_Work", Label.A),
    ("She reports crushing chest pain for two hours.", "History", Label.B),
    ("Abdominal tenderness in the right lower quadrant.", "Physical_Examination_Findings > Abdomen", Label.B),
    ("Denies fever, cough or night sweats.", "History", Label.C),
    ("Works in a construction company.", "Social_History", Label.C),
    ("右下腹痛并自扪及包块3小时。", "现病史 > 主诉", Label.B),
    ("病人既往体健。", "现病史", Label.C),
])
def test_rule_labeller(text: str, section: str | None, label: Label) -> None:
    assert _labeller().label(text, section)[0] is label


def test_completeness_formula_and_thresholds() -> None:
    gate = _gate(GateParams(theta1=0.35, theta2=0.25))

    def decide(*labels: Label) -> tuple[float, Action]:
        decision = gate.decide([LabelledSentence("s", "f", label, "") for label in labels])
        return decision.completeness, decision.action

    assert decide(Label.A, Label.B, Label.C, Label.C) == (pytest.approx((1 + 0.5 + 0.1 + 0.1) / 4), Action.ANSWER)
    assert decide(Label.B, Label.C) == (pytest.approx(0.3), Action.RETRIEVE)
    score, action = decide(Label.C, Label.C, Label.B, Label.C)
    assert score == pytest.approx(0.2) and action is Action.RETRIEVE_WARN
    assert gate.decide([]).action is Action.RETRIEVE_WARN and "sparse" in gate.decide([]).warning
    assert GateParams.paper().theta2 == 0.1
    with pytest.raises(ValueError, match="thresholds"):
        GateParams(theta1=0.2, theta2=0.3)
    with pytest.raises(ValueError, match="weights"):
        GateParams(beta=2.0)
    assert RetrievalGate.from_dict(gate.to_dict(), extractor=default_extractor()).params == gate.params


def test_a_sites_question_rules_survive_the_gates_settings(tmp_path: Path) -> None:
    """The gate is handed its question classifier; its settings name a site's rule file, so the rebuilt gate types
    questions by that file, not by the bundled one."""
    rules = tmp_path / "questions.toml"
    rules.write_text('[[types]]\nid = "dosing"\nretrieve = true\npatterns = ["\\\\bdose\\\\b"]\n', encoding="utf-8")
    gate = RetrievalGate(_labeller(), QuestionClassifier(rules))
    again = RetrievalGate.from_dict(gate.to_dict(), extractor=default_extractor())
    assert [t.id for t in again.questions.types] == ["dosing"]
    assert again.questions.classify("What dose of amoxicillin?").retrieve
    bundled = RetrievalGate.from_dict(_gate().to_dict(), extractor=default_extractor())
    assert bundled.questions is default_question_classifier()


def test_only_a_and_b_sentences_become_queries() -> None:
    decision = _gate().run(_record("Works as a teacher. Reports a painful swollen knee.",
                                           "Knee X-ray shows a joint effusion."))
    assert decision.queries == ["Reports a painful swollen knee.", "Knee X-ray shows a joint effusion."]
    assert [s.fragment_id for s in decision.sentences] == ["f0", "f0", "f1"]


def test_full_records_answer_more_and_history_cuts_warn_more(shared_data: Path) -> None:
    gate = _gate()
    for dataset, folder in (("agentclinic", "agentclinic"), ("cmb", "cmb_clin")):
        full, cut = gate_runs(gate, dataset, load_cases(dataset, shared_data / folder)[:30])
        assert full.actions()[Action.ANSWER] > cut.actions()[Action.ANSWER]
        assert cut.actions()[Action.RETRIEVE_WARN] > full.actions()[Action.RETRIEVE_WARN]
        assert full.labels()[Label.A] > 0 and cut.labels()[Label.A] < full.labels()[Label.A]
    report = gate_report(gate, {"cmb": shared_data / "cmb_clin"})
    assert "| cmb | full record | 41 |" in report and "Sparsest" in report


def test_a_complete_record_still_retrieves_for_a_question_it_cannot_answer() -> None:
    """Issue 20.4: the Synthea chart scored complete, so a drug-choice question retrieved no guideline."""
    full = _record("Biopsy shows adenocarcinoma of the sigmoid colon.", "Serum creatinine 2.8 mg/dL.",
                   "Anaphylaxis to penicillin in 2014.")
    gate = _gate()
    alone = gate.run(full)
    assert alone.action is Action.ANSWER and alone.question_type == "" and "θ1" in alone.reason
    drug = gate.run(full, "Which antibiotic is safe for his wound infection?")
    assert drug.action is Action.RETRIEVE and drug.question_type == "drug_choice"
    assert "drug_choice question needs outside knowledge" in drug.reason
    assert drug.completeness == alone.completeness
    diagnosis = gate.run(full, "What is the most likely diagnosis?")
    assert diagnosis.action is Action.ANSWER and diagnosis.question_type == "diagnosis"
    sparse = gate.run(_record("Feels tired.", "Lives alone."), "Which antibiotic is safe?")
    assert sparse.action is Action.RETRIEVE_WARN, "the question never lowers a warning to plain retrieval"


def test_a_records_labels_are_stored_read_back_and_forgotten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: the gate labels a stored chart once (when it is prepared) and reads the labels back on every ask;
    the sentences and labels are those computed without a store; another section is another key; erasure
    forgets them."""
    store = KeyValueCache(tmp_path / "derived.sqlite", "gate_labels")
    record = _record("Biopsy shows adenocarcinoma. She reports chest pain.", "Denies fever.", section="History")
    plain = RetrievalGate(_labeller(), default_question_classifier()).run(record)
    stored = RetrievalGate(_labeller(store), default_question_classifier()).run(record)
    assert stored.sentences == plain.sentences and len(plain.sentences) == 3
    monkeypatch.setattr(RuleLabeller, "label", lambda *a: pytest.fail("labelled again"))
    again = RetrievalGate(_labeller(store), default_question_classifier()).run(record)
    assert again.sentences == plain.sentences and again.completeness == plain.completeness
    moved = _record("Denies fever.", section="Social_History")
    with pytest.raises(pytest.fail.Exception, match="labelled again"):
        RetrievalGate(_labeller(store), default_question_classifier()).run(moved)
    assert _labeller(store).forget(record.fragments) == 2
    with pytest.raises(pytest.fail.Exception, match="labelled again"):
        RetrievalGate(_labeller(store), default_question_classifier()).run(record)
