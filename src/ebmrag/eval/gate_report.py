"""The retrieval gate on real cases: decisions and A/B/C labels for full records and history-only cuts.

A controlled comparison: each AgentClinic / CMB-Clin case is gated twice, once whole (history, exam,
tests) and once cut to its history (the patient-actor fields / 现病史 only). The label-free gate
should answer the first directly more often and send the second to retrieval with a warning.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ebmrag.answer.gate import Action, GateDecision, Label, RetrievalGate
from ebmrag.eval.cases import EvalCase, load_cases
from ebmrag.records.fragment import PatientRecord

HISTORY_SECTIONS = {"agentclinic": "Patient_Actor", "cmb": "现病史"}


@dataclass(frozen=True)
class GateRun:
    dataset: str
    variant: str
    decisions: tuple[tuple[str, GateDecision], ...]

    def actions(self) -> Counter[Action]:
        return Counter(d.action for _, d in self.decisions)

    def labels(self) -> Counter[Label]:
        return Counter(s.label for _, d in self.decisions for s in d.sentences)


def history_only(case: EvalCase) -> PatientRecord | None:
    prefix = HISTORY_SECTIONS[case.dataset]
    kept = tuple(f for f in case.record.fragments if (f.section or "").startswith(prefix))
    return case.record.replace_fragments(kept) if kept else None


def gate_runs(gate: RetrievalGate, dataset: str, cases: Sequence[EvalCase]) -> list[GateRun]:
    full = tuple((c.case_id, gate.run(c.record)) for c in cases)
    cut = tuple((c.case_id, gate.run(r)) for c in cases if (r := history_only(c)) is not None)
    return [GateRun(dataset, "full record", full), GateRun(dataset, "history only", cut)]


def _distribution_rows(runs: Sequence[GateRun]) -> list[str]:
    lines = ["| dataset | record | cases | answer | retrieve | retrieve + warning | completeness median (q10–q90) "
             "| A / B / C sentences |", "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        n = len(run.decisions)
        actions, labels = run.actions(), run.labels()
        scores = sorted(d.completeness for _, d in run.decisions)
        q10, q90 = scores[int(0.1 * (n - 1))], scores[int(0.9 * (n - 1))]
        total = sum(labels.values()) or 1
        shares = " / ".join(f"{100 * labels[label] / total:.0f} %" for label in Label)
        lines.append(f"| {run.dataset} | {run.variant} | {n} | {actions[Action.ANSWER]} | "
                     f"{actions[Action.RETRIEVE]} | {actions[Action.RETRIEVE_WARN]} | "
                     f"{statistics.median(scores):.2f} ({q10:.2f}–{q90:.2f}) | {shares} |")
    return lines


def _example(title: str, case_id: str, decision: GateDecision, limit: int = 12) -> list[str]:
    lines = [f"#### {title}: {case_id}, I = {decision.completeness:.2f}, {decision.action.value}", ""]
    if decision.warning:
        lines += [f"> {decision.warning}", ""]
    lines += ["| label | why | sentence |", "|---|---|---|"]
    for sentence in decision.sentences[:limit]:
        text = sentence.text if len(sentence.text) < 110 else sentence.text[:107] + "..."
        lines.append(f"| {sentence.label.value} | {sentence.reason} | {text.replace('|', '/')} |")
    if len(decision.sentences) > limit:
        lines.append(f"| … | | {len(decision.sentences) - limit} more sentences |")
    return [*lines, ""]


def gate_report(gate: RetrievalGate, data: dict[str, Path]) -> str:
    runs: list[GateRun] = []
    for dataset, folder in data.items():
        runs += gate_runs(gate, dataset, load_cases(dataset, folder))
    p = gate.params
    lines = ["# Retrieval gate on real cases", "",
             "Command: `ebmrag eval gate --data-root ../shared/data --out docs/results/gate.md`", "",
             f"Label-free labeller; α, β, γ = {p.alpha}, {p.beta}, {p.gamma}; θ1 = {p.theta1}, θ2 = {p.theta2}. "
             "Each case is gated whole and cut to its history (AgentClinic patient-actor fields, CMB-Clin 现病史).",
             "", *_distribution_rows(runs), ""]
    for run in runs:
        if not run.decisions:
            continue
        best = max(run.decisions, key=lambda item: item[1].completeness)
        worst = min(run.decisions, key=lambda item: item[1].completeness)
        lines += [f"### {run.dataset}, {run.variant}", ""]
        lines += _example("Richest", *best)
        lines += _example("Sparsest", *worst)
    return "\n".join(lines).rstrip() + "\n"
