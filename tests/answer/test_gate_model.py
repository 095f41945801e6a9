from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ebmrag.answer.gate import Label, RetrievalGate
from ebmrag.answer.gate_model import (
    AnnotatedSentence,
    ClassifierLabeller,
    MaskingAnnotator,
    read_annotations,
    same_diagnosis,
    train_classifier,
)
from ebmrag.errors import ConfigError
from ebmrag.evidence.questions import default_question_classifier
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.retrieve.vote import DocumentVoter
from tests.fake_openai import FakeOpenAI, serve

SENTENCES = ["A 34-year-old woman has had fever for five days.", "She lives with her partner.",
             "Blood cultures grew Staphylococcus aureus.", "Echocardiography shows a mitral valve vegetation."]


def doctor(body: dict[str, Any]) -> str:
    """Diagnoses endocarditis only when it sees the vegetation (the decisive sentence)."""
    summary = body["messages"][1]["content"]
    return json.dumps({"diagnosis": "Infective endocarditis" if "vegetation" in summary else "Viral illness"})


def test_masking_labels_the_decisive_sentence_a_and_the_rest_c() -> None:
    fake = FakeOpenAI(doctor)
    with serve(fake) as url:
        rows = MaskingAnnotator(OpenAIChatClient(url, "tiny", max_retries=0)).annotate("c1", SENTENCES,
                                                                                     "infective endocarditis")
    assert [r.label for r in rows] == [Label.C, Label.C, Label.C, Label.A]
    assert {r.strategy for r in rows} == {1} and len(fake.requests) == 1 + len(SENTENCES)


def test_a_wrong_full_diagnosis_labels_by_knowledge_base_lookup(demo_voter: DocumentVoter) -> None:
    fake = FakeOpenAI(("text", "not json"))
    fake.script = [("text", "I think it is a viral illness."), ("text", '{"diagnosis": "Viral illness"}')]
    sentences = ["Creatinine rose from 1.1 to 2.8 mg/dL within two days.", "He enjoys gardening."]
    with serve(fake) as url:
        annotator = MaskingAnnotator(OpenAIChatClient(url, "tiny", max_retries=0), demo_voter.retriever)
        rows = annotator.annotate("c2", sentences, "Acute kidney injury")
    assert [(r.label, r.strategy) for r in rows] == [(Label.B, 2), (Label.C, 2)]
    assert "Reply with only" in fake.requests[1]["messages"][-1]["content"], "a malformed reply is asked again"


def test_diagnosis_matching_is_lenient_on_wording_only() -> None:
    assert same_diagnosis("Most likely: acute infective endocarditis", "Infective endocarditis")
    assert same_diagnosis("endocarditis, infective (S. aureus)", "Infective endocarditis")
    assert not same_diagnosis("Rheumatic fever", "Infective endocarditis")


def test_trained_classifier_labels_like_its_training_data(embedder: Any, tmp_path: Path) -> None:
    a = ["Biopsy shows adenocarcinoma.", "Troponin rose to 31 ng/L.", "CT shows a 4 cm liver mass.",
         "HbA1c is 9.1 %.", "Creatinine 2.8 mg/dL.", "MRI shows a ruptured disc."]
    c = ["She lives with her partner.", "Visiting hours were explained.", "He likes gardening.",
         "The family brought a phone charger.", "Parking permit issued.", "Bed linen changed."]
    rows = [AnnotatedSentence("c", t, Label.A, 1) for t in a] + [AnnotatedSentence("c", t, Label.C, 1) for t in c]
    annotations = tmp_path / "labels.jsonl"
    annotations.write_text("\n".join(json.dumps(r.to_json()) for r in rows) + "\n", encoding="utf-8")
    report = train_classifier(read_annotations(annotations), embedder, tmp_path / "gate.npz")
    assert report.examples == 12 and report.held_out == 3
    labeller = ClassifierLabeller(tmp_path / "gate.npz", embedder)
    assert labeller.label("Liver biopsy shows hepatocellular carcinoma.", None)[0] is Label.A
    assert labeller.label("Her daughter visited on Sunday.", None)[0] is Label.C
    record = PatientRecord("p", (Fragment("f1", "p", "Biopsy shows lymphoma. Her son visited."),))
    decision = RetrievalGate(labeller, default_question_classifier()).run(record)
    assert [s.label for s in decision.sentences] == [Label.A, Label.C]
    assert decision.sentences[0].reason.startswith("classifier p=")


def test_bad_training_input_is_named(embedder: Any, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"case_id": "c", "text": "t", "label": "D"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: not an annotation line"):
        read_annotations(bad)
    with pytest.raises(ValueError, match="at least 10 sentences of at least 2 labels"):
        train_classifier([AnnotatedSentence("c", "t", Label.A, 1)] * 12, embedder, tmp_path / "x.npz")
    with pytest.raises(ConfigError, match="could not be read"):
        ClassifierLabeller(tmp_path / "missing.npz", embedder)
