"""The adaptive retrieval gate (ICA-RAG): does this record need outside knowledge?

Every sentence of the record gets a label: A (decisive for the diagnosis), B (helps retrieval) or C
(unimportant). Information completeness I = Σ (α·[A] + β·[B] + γ·[C]) / (α·n). I > θ1: answer
directly; θ2 ≤ I ≤ θ1: retrieve; I < θ2: retrieve and warn that critical information is sparse.
Only A and B sentences become retrieval queries.

The label-free default labeller reads what ebmrag already knows about evidence: a sentence the tier
classifier puts in T1/T2 (pathology, genetics, labs, imaging, a high-risk allergy) is A; one naming a
finding, value, drug or symptom that is not negated is B; the rest (demographics, social history,
normal or negated findings) is C.

Thresholds: with the paper's weights the smallest possible I is γ/α = 0.1, so its printed θ2 = 0.1
can never warn, and its own case studies (I = 0.47 retrieves, 0.27 warns) contradict θ1 = 0.3. The
defaults θ1 = 0.35, θ2 = 0.25 lie between the completeness of full records and of the same records
cut to history only, on the shared AgentClinic and CMB-Clin cases (docs/results/gate.md has the
distributions); `GateParams.paper()` gives the printed 0.3 / 0.1.

A record's labels do not depend on the question, so the rule labeller keeps each fragment's labelled sentences
on disk (keyed by the rules', lexicons' and detectors' content, the section and the text): a stored chart is
labelled once, when it is prepared (serve/prepare.py), and a 10,000-fragment chart's gate reads them back
instead of labelling ~15,000 sentences on every ask. Erasure forgets them with the fragment.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from ebmrag.answer.params import check_gate_params
from ebmrag.evidence.entities import EntityExtractor, EntityKind
from ebmrag.evidence.questions import QuestionClassifier, QuestionType
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.kvcache import KeyValueCache, digest
from ebmrag.protocols import CHECK_EVERY, checkpoint
from ebmrag.records.fragment import Fragment, PatientRecord, Tier
from ebmrag.rules import bundled, rule_file
from ebmrag.text.sentences import split_sentences

GATE_LEXICON = "evidence/gate.toml"  # symptom words, in the rules folder
_KEY_KINDS = (EntityKind.VALUE, EntityKind.TEST, EntityKind.FINDING, EntityKind.DRUG)


class Label(StrEnum):
    A = "A"
    B = "B"
    C = "C"


class Action(StrEnum):
    ANSWER = "answer"
    RETRIEVE = "retrieve"
    RETRIEVE_WARN = "retrieve_warn"


@dataclass(frozen=True)
class GateParams:
    alpha: float = 1.0
    beta: float = 0.5
    gamma: float = 0.1
    theta1: float = 0.35
    theta2: float = 0.25

    def __post_init__(self) -> None:
        check_gate_params(self.alpha, self.beta, self.gamma, self.theta1, self.theta2)

    @classmethod
    def paper(cls) -> GateParams:
        """The values printed in the ICA-RAG paper (θ1 = 0.3, θ2 = 0.1); see the module note on θ2."""
        return cls(theta1=0.3, theta2=0.1)

    def weight(self, label: Label) -> float:
        return {Label.A: self.alpha, Label.B: self.beta, Label.C: self.gamma}[label]


@dataclass(frozen=True)
class LabelledSentence:
    text: str
    fragment_id: str
    label: Label
    reason: str


@dataclass(frozen=True)
class GateDecision:
    completeness: float
    action: Action
    warning: str
    sentences: tuple[LabelledSentence, ...]
    question_type: str = ""  # evidence.questions; "" when the gate ran without a question
    reason: str = ""  # why this action: completeness against θ1/θ2, or what the question asks for

    @property
    def queries(self) -> list[str]:
        """The sentences retrieval uses: A and B only (C sentences add noise)."""
        return [s.text for s in self.sentences if s.label is not Label.C]

    def to_json(self) -> dict[str, Any]:
        return {"completeness": round(self.completeness, 4), "action": self.action.value, "warning": self.warning,
                **({"question_type": self.question_type} if self.question_type else {}), "reason": self.reason}


class SentenceLabeller(Protocol):
    def label(self, text: str, section: str | None) -> tuple[Label, str]: ...

    def label_fragments(self, fragments: Sequence[Fragment]) -> list[list[LabelledSentence]]:
        """Each fragment's sentences, labelled (a checkpoint every CHECK_EVERY fragments)."""
        ...

    def to_dict(self) -> dict[str, Any]: ...


def label_each(labeller: SentenceLabeller, fragments: Sequence[Fragment]) -> list[list[LabelledSentence]]:
    """`label_fragments` by one `label` call per sentence, for labellers that keep nothing."""
    labelled = []
    for n, fragment in enumerate(fragments):
        if n % CHECK_EVERY == 0:
            checkpoint()  # a long chart's sentences: the host may stop or pause the work here
        labelled.append([LabelledSentence(s.text, fragment.id, *labeller.label(s.text, fragment.section))
                         for s in split_sentences(fragment.text)])
    return labelled


@rule_file(GATE_LEXICON)
def _symptom_pattern(table: Mapping[str, Any]) -> re.Pattern[str]:
    terms = table["symptoms"]
    english = sorted((t for t in terms if t.isascii()), key=len, reverse=True)
    chinese = sorted((t for t in terms if not t.isascii()), key=len, reverse=True)
    words = "|".join(re.escape(t) for t in english)
    return re.compile(rf"\b(?:{words})(?:s|es|ful|ing|ed)?\b|" + "|".join(re.escape(t) for t in chinese),
                      re.IGNORECASE)


class RuleLabeller:
    """Label-free A/B/C from tiers, clinical entities, symptom words and negation."""

    def __init__(self, classifier: TierClassifier, extractor: EntityExtractor,
                 store: KeyValueCache | None = None) -> None:
        """`classifier` and `extractor`: the composition root's (compose.Resources); `store`: each fragment's
        labelled sentences on disk (module doc), keyed by `fingerprint`."""
        self.classifier, self.extractor = classifier, extractor
        self.symptoms = _symptom_pattern()
        self.store = store
        self.fingerprint = digest("gate", self.classifier.fingerprint, self.extractor.fingerprint,
                                  hashlib.sha256(bundled().source(GATE_LEXICON).encode()).hexdigest(),
                                  hashlib.sha256(Path(__file__).read_bytes()).hexdigest())

    def label(self, text: str, section: str | None) -> tuple[Label, str]:
        # Rules only: the gate labels sentence by sentence, where a model call each would dominate `ask`.
        tier = self.classifier.rule_decision(text, section) or self.classifier.default
        if tier.tier in (Tier.T1, Tier.T2):
            return Label.A, f"objective result ({tier.tier.value}, rule {tier.rule_id})"
        entities = [e for e in self.extractor.extract(text) if e.kind in _KEY_KINDS and not e.negated]
        if entities:
            return Label.B, f"{entities[0].kind.value} '{entities[0].text}'"
        scopes = self.extractor.negation_scopes(text)
        for match in self.symptoms.finditer(text):
            if self.extractor.negation_cue_start(text, match.start(), scopes) is None:
                return Label.B, f"symptom '{match.group(0)}'"
        return Label.C, "no positive finding, value, drug or symptom"

    def label_fragments(self, fragments: Sequence[Fragment]) -> list[list[LabelledSentence]]:
        """Each fragment's labelled sentences, read from the store where it has them, labelled and stored
        where not."""
        if self.store is None:
            return label_each(self, fragments)
        keys = [self._key(f) for f in fragments]
        stored = self.store.get_many(list(dict.fromkeys(keys)))
        missing = [f for key, f in zip(keys, fragments, strict=True) if key not in stored]
        fresh = {self._key(f): _sentences_to_json(labelled) for f, labelled in
                 zip(missing, label_each(self, missing), strict=True)}
        if fresh:
            self.store.put_many(fresh)
        labelled = []
        for n, (key, fragment) in enumerate(zip(keys, fragments, strict=True)):
            if n % (CHECK_EVERY * 8) == 0:
                checkpoint()
            labelled.append(_sentences_from_json(stored.get(key) or fresh[key], fragment.id))
        return labelled

    def forget(self, fragments: Sequence[Fragment]) -> int:
        """Erase the stored labels of these fragments; returns the rows removed."""
        return self.store.forget([self._key(f) for f in fragments]) if self.store is not None else 0

    def _key(self, fragment: Fragment) -> str:
        return digest(self.fingerprint, fragment.section or "", fragment.text)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "rules", "tier_rules": self.classifier.to_dict()["rules_path"]}


def _sentences_to_json(labelled: Sequence[LabelledSentence]) -> bytes:
    return json.dumps([[s.text, s.label.value, s.reason] for s in labelled], ensure_ascii=False).encode()


def _sentences_from_json(blob: bytes, fragment_id: str) -> list[LabelledSentence]:
    return [LabelledSentence(text, fragment_id, Label(label), reason) for text, label, reason in json.loads(blob)]


class RetrievalGate:
    """Pipeline step: a patient record -> labelled sentences, completeness and the retrieval decision."""

    def __init__(self, labeller: SentenceLabeller, questions: QuestionClassifier,
                 params: GateParams | None = None) -> None:
        """`labeller` and `questions`: the root's (compose.Resources.gate_labeller and .questions): rules or a
        trained classifier, the bundled question rules or a site's; the gate builds neither itself."""
        self.labeller = labeller
        self.questions = questions
        self.params = params or GateParams()

    def run(self, record: PatientRecord, question: str = "", question_type: QuestionType | None = None) -> GateDecision:
        """Completeness decides for the record; the question can only add retrieval: a record complete
        enough to name the diagnosis still cannot say which antibiotic a guideline recommends. A caller that
        has typed the question already passes `question_type`."""
        sentences = [s for labelled in self.labeller.label_fragments(record.fragments) for s in labelled]
        decision = self.decide(sentences)
        if not question.strip():
            return decision
        kind = question_type or self.questions.classify(question)
        if kind.retrieve and decision.action is Action.ANSWER:
            return replace(decision, action=Action.RETRIEVE, question_type=kind.id,
                           reason=f"a {kind.id} question needs outside knowledge whatever the record holds "
                                  f"({decision.reason})")
        return replace(decision, question_type=kind.id)

    def decide(self, sentences: Sequence[LabelledSentence]) -> GateDecision:
        p = self.params
        score = sum(p.weight(s.label) for s in sentences) / (p.alpha * len(sentences)) if sentences else 0.0
        if score > p.theta1:
            action, warning, reason = Action.ANSWER, "", f"completeness {score:.2f} > θ1 {p.theta1:.2f}"
        elif score >= p.theta2:
            action, warning, reason = Action.RETRIEVE, "", f"completeness {score:.2f} ≤ θ1 {p.theta1:.2f}"
        else:
            action, reason = Action.RETRIEVE_WARN, f"completeness {score:.2f} < θ2 {p.theta2:.2f}"
            warning = (f"Critical information is sparse (completeness {score:.2f} < {p.theta2:.2f}): "
                       "few decisive findings in the record; the answer may be unreliable.")
        return GateDecision(score, action, warning, tuple(sentences), reason=reason)

    def to_dict(self) -> dict[str, Any]:
        return {"params": asdict(self.params), "labeller": self.labeller.to_dict(),
                "questions": self.questions.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], labeller: SentenceLabeller | None = None,
                  extractor: EntityExtractor | None = None) -> RetrievalGate:
        """`labeller` is built by the caller from `data["labeller"]` when it needs a model (a trained
        classifier needs the embedder); a rule labeller is rebuilt here from its tier rules, with `extractor`
        (the root's: compose.Resources.extractor)."""
        spec = data.get("labeller") or {"type": "rules"}
        if labeller is None:
            if spec.get("type") != "rules":
                raise ValueError(f"a {spec.get('type')!r} labeller must be passed in built (it needs a model)")
            if extractor is None:
                raise ValueError("a rule labeller is rebuilt with the entity extractor: pass extractor= "
                                 "(compose.Resources.extractor)")
            labeller = RuleLabeller(TierClassifier(spec.get("tier_rules")), extractor)
        return cls(labeller, QuestionClassifier.from_dict(data.get("questions") or {}),
                   GateParams(**data.get("params", {})))
