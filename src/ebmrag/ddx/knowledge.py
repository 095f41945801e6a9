"""The condition knowledge base of the differential-diagnosis engine: evidences, conditions, likelihoods.

One JSON file (format `ebmrag-ddx-kb/1`) so a site can swap in its own conditions without code:

    {"format": "ebmrag-ddx-kb/1", "name": ..., "attribution": ...,
     "evidences": {CODE: {"question", "kind": binary|categorical|multi, "antecedent", "parent", "default",
                          "values": {VALUE: meaning}}},
     "conditions": {NAME: {"icd10", "severity", "prior": count or weight, "likelihoods": {CODE: P(present | D)},
                           "sex": "F"|"M"|"", "age_min": int|null, "age_max": int|null}}}

Likelihoods are sparse: an evidence a condition does not list has P = 0 before smoothing (see
`engine.Smoothing`). A categorical or multi-choice evidence counts as *present* when it was asked at all
(any value), which is how the DDXPlus likelihoods were counted; its value is kept for display only.
The default knowledge base is built from DDXPlus (CC-BY 4.0) by `from_ddxplus` and ships in
`ddx/data/` with its attribution.
"""

from __future__ import annotations

import ast
import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ebmrag.errors import EbmragError

FORMAT = "ebmrag-ddx-kb/1"
KINDS = {"B": "binary", "C": "categorical", "M": "multi"}
DEFAULT_KB = "ddxplus_kb.json"


class KnowledgeFileError(EbmragError):
    """A condition knowledge base that cannot be used, with the file and the entry at fault."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")


@dataclass(frozen=True)
class Evidence:
    code: str
    question: str
    kind: str = "binary"
    antecedent: bool = False
    parent: str = ""  # the question this one follows up (pain -> pain location); "" when it stands alone
    default: str = ""
    values: Mapping[str, str] = field(default_factory=dict)

    @property
    def follow_up(self) -> bool:
        """Asked only when another evidence is present (its value is then the answer)."""
        return bool(self.parent) and self.parent != self.code


@dataclass(frozen=True)
class Condition:
    name: str
    icd10: str
    prior: float
    likelihoods: Mapping[str, float]
    severity: int = 0
    sex: str = ""
    age_min: int | None = None
    age_max: int | None = None
    aliases: tuple[str, ...] = ()  # other names (DDXPlus's French ones), matched like the name


@dataclass(frozen=True)
class ConditionKB:
    name: str
    attribution: str
    evidences: Mapping[str, Evidence]
    conditions: Mapping[str, Condition]

    def condition_named(self, name: str) -> Condition | None:
        """The condition with this name or alias (case-insensitive), else None."""
        wanted = name.strip().casefold()
        for condition in self.conditions.values():
            if wanted in (n.casefold() for n in (condition.name, *condition.aliases)):
                return condition
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "name": self.name, "attribution": self.attribution,
            "evidences": {c: {"question": e.question, "kind": e.kind, "antecedent": e.antecedent, "parent": e.parent,
                              "default": e.default, "values": dict(e.values)} for c, e in self.evidences.items()},
            "conditions": {n: {"icd10": c.icd10, "severity": c.severity, "prior": c.prior, "sex": c.sex,
                               "age_min": c.age_min, "age_max": c.age_max, "aliases": list(c.aliases),
                               "likelihoods": {k: round(v, 6) for k, v in sorted(c.likelihoods.items())}}
                           for n, c in self.conditions.items()},
        }

    def save(self, path: Path) -> None:
        """Atomic: a crash leaves the previous file."""
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(self.to_json(), ensure_ascii=False, indent=1), encoding="utf-8")
        partial.replace(path)


def load_kb(path: Path | None = None) -> ConditionKB:
    """The knowledge base in `path`, or the bundled DDXPlus one."""
    if path is None:
        text = resources.files("ebmrag.ddx").joinpath("data", DEFAULT_KB).read_text(encoding="utf-8")
        return parse_kb(json.loads(text), f"ebmrag/ddx/data/{DEFAULT_KB}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise KnowledgeFileError(str(path), f"not JSON (line {exc.lineno}: {exc.msg})") from None
    return parse_kb(data, str(path))


def parse_kb(data: Any, where: str) -> ConditionKB:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise KnowledgeFileError(where, f"not a condition knowledge base (expected \"format\": \"{FORMAT}\")")
    evidences = {code: _evidence(code, raw, f"{where}: evidence {code!r}")
                 for code, raw in _mapping(data, "evidences", where).items()}
    for code, evidence in evidences.items():
        if evidence.parent and evidence.parent not in evidences:
            raise KnowledgeFileError(where, f"evidence {code!r} follows up unknown evidence {evidence.parent!r}")
    conditions = {name: _condition(name, raw, evidences, f"{where}: condition {name!r}")
                  for name, raw in _mapping(data, "conditions", where).items()}
    if not conditions:
        raise KnowledgeFileError(where, "no conditions")
    return ConditionKB(str(data.get("name", "")), str(data.get("attribution", "")), evidences, conditions)


def _mapping(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise KnowledgeFileError(where, f"{key!r} must be an object")
    return value


def _evidence(code: str, raw: Any, where: str) -> Evidence:
    if not isinstance(raw, dict) or not str(raw.get("question", "")).strip():
        raise KnowledgeFileError(where, "needs a non-empty \"question\"")
    kind = raw.get("kind", "binary")
    if kind not in KINDS.values():
        raise KnowledgeFileError(where, f"kind {kind!r} is not one of {sorted(KINDS.values())}")
    return Evidence(code, str(raw["question"]), kind, bool(raw.get("antecedent", False)), str(raw.get("parent", "")),
                    str(raw.get("default", "")), {str(k): str(v) for k, v in (raw.get("values") or {}).items()})


def _condition(name: str, raw: Any, evidences: Mapping[str, Evidence], where: str) -> Condition:
    if not isinstance(raw, dict):
        raise KnowledgeFileError(where, "must be an object")
    prior = raw.get("prior")
    if not isinstance(prior, int | float) or prior <= 0:
        raise KnowledgeFileError(where, f"prior must be a positive number, got {prior!r}")
    likelihoods = raw.get("likelihoods") or {}
    for code, p in likelihoods.items():
        if code not in evidences:
            raise KnowledgeFileError(where, f"likelihood of unknown evidence {code!r}")
        if not isinstance(p, int | float) or not 0 <= p <= 1:
            raise KnowledgeFileError(where, f"likelihood of {code!r} must be in [0, 1], got {p!r}")
    sex = str(raw.get("sex") or "")
    if sex not in ("", "F", "M"):
        raise KnowledgeFileError(where, f"sex must be 'F', 'M' or empty, got {sex!r}")
    return Condition(name, str(raw.get("icd10", "")), float(prior), {k: float(v) for k, v in likelihoods.items()},
                     int(raw.get("severity") or 0), sex, raw.get("age_min"), raw.get("age_max"),
                     tuple(str(a) for a in raw.get("aliases") or ()))


def from_ddxplus(folder: Path) -> ConditionKB:
    """Build the knowledge base from DDXPlus release files (the layout of ../shared/data/ddxplus): the v0
    evidence and condition files, the per-condition evidence frequencies over the 1,025,602 training patients
    (`symptom_condition_probs_v1_derived.json`) and the v0 <-> v1 code map."""
    raw_evidences = _read_release(folder, "release_evidences_v0.json")
    raw_conditions = _read_release(folder, "release_conditions_v0.json")
    probs = _read_release(folder, "symptom_condition_probs_v1_derived.json")
    with (folder / "evidence_code_map_v0_v1.tsv").open(encoding="utf-8") as handle:
        v1_to_v0 = {row["v1_code"]: row["v0_name"] for row in csv.DictReader(handle, delimiter="\t")}
    evidences = {code: Evidence(code, raw["question_en"], KINDS[raw["data_type"]], bool(raw["is_antecedent"]),
                                raw["code_question"] if raw["code_question"] in raw_evidences else "",
                                str(raw["default_value"]), _english_values(raw))
                 for code, raw in raw_evidences.items()}
    conditions = {}
    for raw in raw_conditions.values():
        name = raw["cond-name-eng"]
        table = probs["probabilities"].get(name)
        if table is None:
            raise KnowledgeFileError(str(folder), f"no likelihoods for condition {name!r}")
        likelihoods = {v1_to_v0[code]: p for code, p in table.items() if p > 0 and code in v1_to_v0}
        prior = float(probs["condition_counts"][name])
        conditions[name] = Condition(name, str(raw["icd10-id"]).upper(), prior, likelihoods,
                                     int(raw.get("severity") or 0), aliases=(raw["cond-name-fr"],))
    attribution = ("DDXPlus (Fansi Tchango et al., NeurIPS 2022 Datasets and Benchmarks), CC-BY 4.0, "
                   "github.com/mila-iqia/ddxplus; likelihoods are evidence frequencies per condition over its "
                   "1,025,602 training patients as derived by github.com/mohammedadnansohail1-pixel/medical-triage-moc "
                   "(MIT). Converted by ebmrag (ddx.knowledge.from_ddxplus).")
    return ConditionKB("ddxplus", attribution, evidences, conditions)


def _read_release(folder: Path, name: str) -> Any:
    path = folder / name
    if not path.exists():
        raise KnowledgeFileError(str(folder), f"missing {name} (expected the DDXPlus release layout)")
    return json.loads(path.read_text(encoding="utf-8"))


def _english_values(raw: dict[str, Any]) -> dict[str, str]:
    meanings = raw.get("value_meaning") or {}
    return {str(v): str(meanings.get(str(v), {}).get("en", v)) if isinstance(meanings.get(str(v)), dict) else str(v)
            for v in raw.get("possible-values") or []}


def patient_evidence(codes_field: str) -> dict[str, str]:
    """A DDXPlus EVIDENCES cell ("['fievre', 'trav1_@_N', ...]") -> {code: value ("" for a binary evidence)};
    a multi-choice evidence with several values keeps them joined by '|'."""
    found: dict[str, str] = {}
    for item in ast.literal_eval(codes_field):
        code, _, value = str(item).partition("_@_")
        found[code] = f"{found[code]}|{value}" if found.get(code) and value else value
    return found
