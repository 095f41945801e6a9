"""Render a DDXPlus patient's structured evidence as a first-person account, for the free-text DDx evaluation.

Kept apart from `ddx.findings` on purpose: the mapper must be measured on phrasing it was not written
against. Questions become statements by grammatical rules ("Do you have X?" -> "I have X."), openers vary by a
seeded choice, follow-up answers become "The pain is sharp, burning." style sentences, and a few questions the
patient was not positive for are denied ("I don't ..."), so negation is exercised too.
"""

from __future__ import annotations

import hashlib
import random
import re

from ebmrag.ddx.knowledge import ConditionKB
from ebmrag.eval.ddx_eval import DdxPatient

OPENERS = ("", "", "Also, ", "I should say that ", "Apart from that, ", "And ")
_REWRITES = (
    ("do you have any ", "I have some "), ("do you have a ", "I have a "), ("do you have an ", "I have an "),
    ("do you have ", "I have "), ("have you ever had ", "I have had "), ("have you ever been ", "I have been "),
    ("have you had ", "I have had "), ("have you been ", "I have been "), ("have you ", "I have "),
    ("are you ", "I am "), ("do you ", "I "), ("did you ", "I "), ("is your ", "my "), ("does your ", "my "),
)
_DENIALS = (("I have ", "I don't have "), ("I am ", "I'm not "), ("I have had ", "I have never had "))
DEFAULTS = {"", "0", "N", "NA", "nulle_part"}


_PRONOUNS = re.compile(r"\b(yourself|your|you)\b")
_SWAP = {"yourself": "myself", "your": "my", "you": "I"}


def statement(question: str) -> str:
    """'Do you have a fever?' -> 'I have a fever' (first person, no question mark)."""
    text = question.strip().rstrip("?").strip()
    lower = text.lower()
    for prefix, replacement in _REWRITES:
        if lower.startswith(prefix):
            return replacement + _PRONOUNS.sub(lambda m: _SWAP[m.group(1)], text[len(prefix):])
    return "Yes: " + text[0].lower() + text[1:]


def denial(question: str) -> str:
    said = statement(question)
    for prefix, replacement in sorted(_DENIALS, key=lambda d: -len(d[0])):
        if said.startswith(prefix):
            return replacement + said[len(prefix):]
    return "No to: " + question.strip().rstrip("?")


def render(kb: ConditionKB, patient: DdxPatient, denials: int = 2) -> str:
    """The patient's account: one sentence per positive finding, follow-up answers, `denials` denied questions."""
    rng = random.Random(int(hashlib.sha256(patient.key.encode()).hexdigest()[:12], 16))
    sentences = []
    for code, value in patient.evidence.items():
        evidence = kb.evidences.get(code)
        if evidence is None:
            continue
        if evidence.follow_up or evidence.kind != "binary":
            answers = [evidence.values.get(v, v) for v in value.split("|") if v not in DEFAULTS]
            if answers:
                sentences.append(f"{evidence.question.rstrip('?:')}: {', '.join(answers)}.")
            continue
        sentence = statement(evidence.question)
        opener = rng.choice(OPENERS)
        sentences.append(opener + sentence + ".")
    candidates = sorted(c for c, e in kb.evidences.items()
                        if e.kind == "binary" and not e.follow_up and c not in patient.evidence)
    sentences += [denial(kb.evidences[c].question) + "." for c in rng.sample(candidates, min(denials, len(candidates)))]
    rng.shuffle(sentences)
    return " ".join(sentences)
