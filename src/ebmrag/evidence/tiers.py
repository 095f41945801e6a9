"""Rule-based tier classifier: T1 pathology, genetics, high-risk allergy; T2 imaging, labs; T3 exam; T4 patient report.

The rules live in a TOML file (`rules/tiers.toml`) that a clinician can read and extend; this
module only loads, validates and applies them. The first matching rule wins and its id is kept
on the fragment, so every tier in a trace can be traced back to one line of the rule file.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.evidence.adr import SERIOUS, allergy_taken_back
from ebmrag.evidence.recogniser import CriticalRecogniser, EntitySpan, Recognition
from ebmrag.evidence.result_flags import result_flag
from ebmrag.evidence.second_reading import SecondReading, adr_in, genes_in, results_in, unsure, worth_reading
from ebmrag.kvcache import KeyValueCache, digest
from ebmrag.protocols import CHECK_EVERY, TextClassifier, checkpoint
from ebmrag.records.fragment import PatientRecord, Tier, TierDecision
from ebmrag.rules import bundled, read_user_file
from ebmrag.text.injection import fold, without_instructions
from ebmrag.vocab import genes, lexicon, negation
from ebmrag.vocab.lexicon import drug_mentions

TIER_RULES = "evidence/tiers.toml"  # the bundled tier rules, in the rules folder
SLICE = 1024  # items tiered together: fewer than the readers' memo holds (evidence.second_reading: 4,096)
MODEL_T1_MIN = 0.85  # below this the model's T1 is not taken (T1 precision; measured in docs/tiers.md)
INSTRUCTION_ONLY = TierDecision(Tier.T4, "text.instruction_like")  # every sentence addressed to a model: data only
ALWAYS_KINDS = ("allergy", "face_sheet")  # what a rule's `always` may name (a question's needs are marked per query)
BUNDLED_TIER_MODEL = Path(__file__).parent / "models" / "tier_ngram.npz"  # bench/train_tier_model.py


@dataclass(frozen=True)
class TierRule:
    id: str
    tier: Tier
    sections: tuple[re.Pattern[str], ...] = ()
    sections_none: tuple[re.Pattern[str], ...] = ()
    text_any: tuple[re.Pattern[str], ...] = ()
    text_none: tuple[re.Pattern[str], ...] = ()
    standing: bool = False
    must_keep: bool = False
    description: str = ""
    drug_within: int = 0  # > 0: a drug or drug class (vocab.lexicon) within this many characters of the match
    detector: str = ""  # a recogniser that must find something (DETECTORS); what it finds is the decision's finding
    critical: bool = False  # a critical (panic) result: packing level 2 when current, 3 when older
    always: str = ""  # packing level 1 whatever its age and encounter: "allergy" (and serious ADRs) or "face_sheet"
    severe: bool = False  # a high-risk or severe allergy: first when allergies alone overflow the window

    def matches(self, section: str, text: str) -> bool:
        return self.match(section, text.lower(), text) is not None

    def match(self, section: str, text: str, original: str) -> str | None:
        """None when the rule does not apply, else what its detector found ('' without a detector). `section`
        is normalized, `text` lower-cased; the detector reads the `original`."""
        if self.sections and (not section or not any(p.search(section) for p in self.sections)):
            return None
        if any(p.search(section) for p in self.sections_none):
            return None
        if self.text_any and not any(p.search(text) for p in self.text_any):
            return None
        if any(p.search(text) for p in self.text_none):
            return None
        if self.drug_within and not self._drug_near(text):
            return None
        return DETECTORS[self.detector](original) if self.detector else ""

    def _drug_near(self, text: str) -> bool:
        for pattern in self.text_any:
            for match in pattern.finditer(text):
                around = text[max(0, match.start() - self.drug_within): match.end() + self.drug_within]
                if drug_mentions(around):
                    return True
        return False

    def decision(self, finding: str = "") -> TierDecision:
        severe = self.severe or SERIOUS in finding.split("; ")  # an ADR detector's serious reaction
        return TierDecision(self.tier, self.id, standing=self.standing, must_keep=self.must_keep,
                            critical=self.critical, finding=finding, always=self.always, severe=severe)


def _adr(text: str) -> str | None:
    found = adr_in(text)  # both ADR rules read the same text in turn (serious first): recognised once
    return "; ".join(dict.fromkeys(m.describe() for m in found)) if found else None


def _serious_adr(text: str) -> str | None:
    found = [m for m in adr_in(text) if m.serious]
    return "; ".join(dict.fromkeys(m.describe() for m in found)) if found else None


def _results(text: str) -> str | None:
    found = results_in(text)
    return "; ".join(dict.fromkeys(f"{m.analyte} {m.value:g} {m.unit}".strip() for m in found)) if found else None


def _critical(text: str) -> str | None:
    found = [m for m in results_in(text) if m.critical]
    return "; ".join(dict.fromkeys(m.critical for m in found)) if found else None


def _genetic(text: str) -> str | None:
    """The genetic results a text states: gene, variant and the drugs CPIC pairs with the gene."""
    found = genes_in(text)
    return "; ".join(dict.fromkeys(m.describe() for m in found)) if found else None


def _vocabulary_fingerprint() -> str:
    """The detectors' code, their models and every rule file: a stored decision is stale when any of them changes."""
    here = Path(__file__).parent
    files = [here / name for name in ("tiers.py", "adr.py", "results.py", "result_tables.py", "second_reading.py",
                                      "recogniser.py")]
    files += [here.parent / "text" / "injection.py", Path(lexicon.__file__), Path(negation.__file__)]
    files += [Path(genes.__file__).with_name(name)  # the gene detector, its notations and its vocabulary's reading
              for name in ("genes.py", "variant_notation.py", "gene_vocabulary.py")]
    files += sorted((here / "models").glob("*.npz"))
    return digest(bundled().fingerprint(), *(hashlib.sha256(path.read_bytes()).hexdigest() for path in files))


def _prediction_from_json(blob: bytes) -> tuple[str, float]:
    label, probability = json.loads(blob)
    return str(label), float(probability)


def _path_digest(path: Path) -> str:
    """sha256 of a model file, or of every file under a model folder."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return digest(*(f"{f.relative_to(path) if path.is_dir() else f.name}:"
                    f"{hashlib.sha256(f.read_bytes()).hexdigest()}" for f in files))


def _flagged(decision: TierDecision, text: str) -> TierDecision:
    """The decision with what its results say (evidence.result_flags): a normal result is not a finding, an
    abnormal one ranks above the rest of its level (packing.levels)."""
    flag = result_flag(_readable(text))
    return replace(decision, flag=flag) if flag != decision.flag else decision


def _allergy_stands(text: str) -> str | None:
    """'' when an allergy or reaction the text names stands, None when every one is denied or taken back
    ("Penicillin allergy de-labelled after a negative oral challenge", "否认药物过敏史"): the shared negation
    grammar (vocab.negation), so a de-labelled allergy is never packed at level 1."""
    return None if allergy_taken_back(text) else ""


def _allergy_entry_stands(text: str) -> str | None:
    """`_allergy_stands` for an allergy section's entry, whose head names its allergy ("Penicillin - label removed
    after a negative challenge")."""
    return None if allergy_taken_back(text, entry=True) else ""


# What a rule's `detector` may name: each returns what it found, or None
DETECTORS = {"adr": _adr, "adr_serious": _serious_adr, "result": _results, "critical_result": _critical,
             "genetic": _genetic,
             "allergy": _allergy_stands, "allergy_entry": _allergy_entry_stands}


def _decision_to_json(decision: TierDecision | None) -> bytes:
    if decision is None:
        return b"null"
    return json.dumps([decision.tier.value, decision.rule_id, decision.standing, decision.must_keep,
                       decision.critical, decision.finding, decision.always, decision.severe]).encode()


def _decision_from_json(blob: bytes) -> TierDecision | None:
    value = json.loads(blob)
    if value is None:
        return None
    return TierDecision(Tier(value[0]), value[1], standing=value[2], must_keep=value[3], critical=value[4],
                        finding=value[5], always=value[6], severe=value[7])


@lru_cache(maxsize=4096)  # the rules and the second reading read a text's readable part in turn
def _readable(text: str) -> str:
    return without_instructions(text)


def _recognition_to_json(recognition: Recognition) -> bytes:
    return json.dumps([recognition.probabilities, recognition.kinds,
                       [[s.type, s.start, s.end, s.text] for s in recognition.spans]], ensure_ascii=False).encode()


def _recognition_from_json(blob: bytes) -> Recognition:
    probabilities, kinds, spans = json.loads(blob)
    return Recognition(probabilities, tuple(kinds), tuple(EntitySpan(*span) for span in spans))


_ESCAPES = re.compile(r"\\[A-Za-z]")
_UPPER = re.compile(r"[A-Z]")


def normalize_section(section: str | None) -> str:
    """'Test_Results/Biopsy' and 'test results > biopsy' look the same to the rules."""
    if not section:
        return ""
    text = section.replace("_", " ").replace("/", " > ").lower()
    return re.sub(r"\s+", " ", text).strip()


def _compile(rule_id: str, key: str, patterns: Any) -> tuple[re.Pattern[str], ...]:
    if patterns is None:
        return ()
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError(f"tier rule {rule_id!r}: {key} must be a list of strings")
    compiled = []
    for pattern in patterns:
        pattern = fold(pattern)  # rules read folded text (text.injection.fold): "µmol" and "；" read as the text does
        try:  # rules see lower-cased text; a pattern with an upper-case letter of its own still matches any case
            compiled.append(re.compile(pattern, re.IGNORECASE if _UPPER.search(_ESCAPES.sub("", pattern)) else 0))
        except re.error as exc:
            raise ConfigError(f"tier rule {rule_id!r}: {key} pattern {pattern!r} is not a valid regex: {exc}") from exc
    return tuple(compiled)


def _parse_tier(rule_id: str, value: Any) -> Tier:
    try:
        return Tier(value)
    except ValueError:
        raise ConfigError(f"tier rule {rule_id!r}: tier must be one of T1..T4, got {value!r}") from None


def parse_rule(raw: Mapping[str, Any]) -> TierRule:
    rule_id = raw.get("id")
    if not isinstance(rule_id, str) or not rule_id:
        raise ConfigError(f"tier rule without an id: {dict(raw)!r}")
    unknown = set(raw) - {"id", "tier", "sections", "sections_none", "text_any", "text_none", "standing", "must_keep",
                          "description", "drug_within", "detector", "critical", "always", "severe"}
    if unknown:
        raise ConfigError(f"tier rule {rule_id!r}: unknown keys {sorted(unknown)}")
    rule = TierRule(
        id=rule_id,
        tier=_parse_tier(rule_id, raw.get("tier")),
        sections=_compile(rule_id, "sections", raw.get("sections")),
        sections_none=_compile(rule_id, "sections_none", raw.get("sections_none")),
        text_any=_compile(rule_id, "text_any", raw.get("text_any")),
        text_none=_compile(rule_id, "text_none", raw.get("text_none")),
        standing=bool(raw.get("standing", False)),
        must_keep=bool(raw.get("must_keep", False)),
        description=str(raw.get("description", "")),
        drug_within=int(raw.get("drug_within", 0)),
        detector=str(raw.get("detector", "")),
        critical=bool(raw.get("critical", False)),
        always=str(raw.get("always", "")),
        severe=bool(raw.get("severe", False)),
    )
    if rule.always not in ("", *ALWAYS_KINDS):
        raise ConfigError(f"tier rule {rule_id!r}: always must be one of {ALWAYS_KINDS}, got {rule.always!r}")
    if (rule.always or rule.severe) and not rule.must_keep:
        raise ConfigError(f"tier rule {rule_id!r}: `always` and `severe` describe must-keep facts; "
                          "set must_keep = true")
    if rule.detector and rule.detector not in DETECTORS:
        raise ConfigError(f"tier rule {rule_id!r}: detector must be one of {sorted(DETECTORS)}, got {rule.detector!r}")
    if not rule.sections and not rule.text_any and not rule.detector:
        raise ConfigError(f"tier rule {rule_id!r}: needs `sections`, `text_any` or `detector`, else it matches "
                          "everything")
    return rule


class TierClassifier:
    """Assigns T1..T4 to fragments: section/resource type first, text cues and detectors second (see the rule
    file), and, where no rule speaks, an optional learned classifier (`model`: the bundled hashed n-gram model,
    or one over sentence embeddings). A rule hit always takes precedence over that model; a model decision
    records the model and its probability as its rule id. Then the second reading (evidence.second_reading):
    where no rule made a text T1 and it has the shape of a critical fact, the learned `recogniser` reads it and
    the more protective answer wins; a shape nobody confirms is a possible critical fact."""

    def __init__(self, rules_path: str | Path | None = None, model: TextClassifier | None = None,
                 store: KeyValueCache | None = None, recogniser: CriticalRecogniser | None = None) -> None:
        self.model = model
        self.recogniser = recogniser
        self.store = store  # rule decisions on disk, keyed by the rule file's content: a record is classified once
        self._model_fingerprint: str | None = None  # ... and the model's predictions, keyed by its file's too
        self.rules_path = Path(rules_path) if rules_path is not None else None
        if self.rules_path is None:
            path, data, source = bundled().path(TIER_RULES), bundled().read(TIER_RULES), bundled().source(TIER_RULES)
        else:
            path, (data, source) = self.rules_path, read_user_file(self.rules_path, "tier rule file")
        self.fingerprint = digest("tiers", source, _vocabulary_fingerprint())
        self.rules = self._parse_rules(data.get("rules"), path)
        self.second_reading = SecondReading.parse(data.get("recogniser") or {}, {r.id: r.decision() for r in
                                                                                self.rules}, str(path))
        self.default = TierDecision(
            _parse_tier("default", data.get("default_tier", "T4")), str(data.get("default_rule_id", "default"))
        )

    @staticmethod
    def _parse_rules(raw_rules: Any, path: Path) -> tuple[TierRule, ...]:
        if not isinstance(raw_rules, list) or not raw_rules:
            raise ConfigError(f"tier rule file {path}: expected a non-empty [[rules]] array")
        rules = tuple(parse_rule(raw) for raw in raw_rules)
        ids = [rule.id for rule in rules]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ConfigError(f"tier rule file {path}: duplicate rule ids {duplicates}")
        return rules

    def rule_decision(self, text: str, section: str | None = None) -> TierDecision | None:
        """The first matching rule's decision, or None when no rule speaks. Rules read the text without its
        instruction-like sentences (a sentence addressed to a model is never a finding, so it can neither make
        a fragment must-keep nor hide one), through the folded view (NFKC, no format characters, Latin
        look-alikes folded: text.injection)."""
        readable = _readable(text)
        if not readable.strip():
            return INSTRUCTION_ONLY
        normalized = normalize_section(fold(section) if section else section)
        lowered = fold(readable).lower()
        for rule in self.rules:  # detectors read the text unfolded: NFKC would turn "10⁹/L" into "109/L"
            finding = rule.match(normalized, lowered, readable)
            if finding is not None:
                return rule.decision(finding)
        return None

    def rule_decisions(self, items: Sequence[tuple[str, str | None]]) -> list[TierDecision | None]:
        """`rule_decision` for many items, read from and written to the disk store when there is one."""
        if self.store is None:
            return [self._checked_rule_decision(n, text, section) for n, (text, section) in enumerate(items)]
        keys = [digest(self.fingerprint, normalize_section(section), text) for text, section in items]
        stored = self.store.get_many(list(dict.fromkeys(keys)))
        fresh: dict[str, bytes] = {}
        decisions = []
        for key, (text, section) in zip(keys, items, strict=True):
            if key in stored or key in fresh:
                decisions.append(_decision_from_json(stored.get(key) or fresh[key]))
                continue
            decision = self._checked_rule_decision(len(fresh), text, section)
            fresh[key] = _decision_to_json(decision)
            decisions.append(decision)
        if fresh:
            self.store.put_many(fresh)
        return decisions

    def _checked_rule_decision(self, done: int, text: str, section: str | None) -> TierDecision | None:
        """`rule_decision`, with a checkpoint every CHECK_EVERY decisions computed (`done` so far)."""
        if done % CHECK_EVERY == 0:
            checkpoint()
        return self.rule_decision(text, section)

    def forget(self, items: Sequence[tuple[str, str | None]]) -> int:
        """Erase the stored rule decisions of these (text, section) pairs; returns the rows removed."""
        if self.store is None:
            return 0
        keys = [digest(self.fingerprint, normalize_section(section), text) for text, section in items]
        if self.model is not None:
            keys += [self._model_key(text) for text, _ in items]
        keys += [digest(self.fingerprint, "shape", without_instructions(text)) for text, _ in items]
        if self.recogniser is not None:
            keys += [self._recognition_key(without_instructions(text)) for text, _ in items]
        return self.store.forget(keys)

    def classify(self, text: str, section: str | None = None) -> TierDecision:
        return self.classify_many([(text, section)])[0]

    def classify_many(self, items: Sequence[tuple[str, str | None]]) -> list[TierDecision]:
        """Rules first; the texts no rule speaks for go to the model in one batch (or get the default tier); then
        the second reading. In slices of `SLICE` items, so that what the rules' readers found for a text is still
        in their memo when the second reading asks the same readers of it (evidence.second_reading)."""
        return [d for at in range(0, len(items), SLICE) for d in self._classify_slice(items[at:at + SLICE])]

    def _classify_slice(self, items: Sequence[tuple[str, str | None]]) -> list[TierDecision]:
        decisions = self.rule_decisions(items)
        silent = [i for i, d in enumerate(decisions) if d is None]
        if self.model is not None and silent:
            predictions = self._predictions([items[i][0] for i in silent])
            for i, (label, p) in zip(silent, predictions, strict=True):
                if label == Tier.T1.value and p < MODEL_T1_MIN:
                    continue  # T1 from text alone needs a confident model; else the default tier stands
                decisions[i] = TierDecision(Tier(label), f"model:{self.model.path.stem} p={p:.2f}",
                                            standing=label == Tier.T1.value)
        read = self._second_reading(items, [d if d is not None else self.default for d in decisions])
        return [_flagged(d, text) for d, (text, _) in zip(read, items, strict=True)]

    def _second_reading(self, items: Sequence[tuple[str, str | None]],
                        decisions: list[TierDecision]) -> list[TierDecision]:
        """The texts no rule made T1 that keep a critical fact's shape, read by the recogniser in one batch and
        merged protectively (evidence.second_reading). Instruction-like sentences are not read."""
        readable = {i: _readable(items[i][0]) for i in unsure(decisions)}
        shapes = self._shapes(list(readable.values()))
        todo = [(i, shape) for i, shape in zip(readable, shapes, strict=True) if shape]
        if not todo:
            return decisions
        confirmable = self.recogniser.confirmable if self.recogniser is not None else ()
        read = [i for i, shape in todo if worth_reading(shape, confirmable)]
        recognitions = dict(zip(read, self._recognitions([readable[i] for i in read]), strict=True)) if read else {}
        for i, shape in todo:
            decisions[i] = self.second_reading.merge(readable[i], decisions[i], shape, recognitions.get(i))
        return decisions

    def _shapes(self, texts: Sequence[str]) -> list[str]:
        """`SecondReading.shape` per text, read from and written to the disk store when there is one (a stored
        chart's texts are read once, when it is prepared)."""
        if self.store is None:
            return [self.second_reading.shape(t) for t in texts]
        keys = [digest(self.fingerprint, "shape", t) for t in texts]
        stored = self.store.get_many(list(dict.fromkeys(keys)))
        fresh = {key: self.second_reading.shape(t).encode() for key, t in zip(keys, texts, strict=True)
                 if key not in stored}
        if fresh:
            self.store.put_many(fresh)
        return [(stored[key] if key in stored else fresh[key]).decode() for key in keys]

    def _recognitions(self, texts: Sequence[str]) -> list[Recognition]:
        """The recogniser's reading per text, read from and written to the disk store when there is one."""
        if self.recogniser is None:
            raise ValueError("no recogniser")
        if self.store is None:
            return self.recogniser.run(texts)
        keys = [self._recognition_key(t) for t in texts]
        stored = self.store.get_many(list(dict.fromkeys(keys)))
        missing = list(dict.fromkeys(t for key, t in zip(keys, texts, strict=True) if key not in stored))
        fresh = {self._recognition_key(t): _recognition_to_json(r)
                 for t, r in zip(missing, self.recogniser.run(missing), strict=True)}
        if fresh:
            self.store.put_many(fresh)
        return [_recognition_from_json(stored.get(key) or fresh[key]) for key in keys]

    def _recognition_key(self, text: str) -> str:
        assert self.recogniser is not None
        return digest(self.fingerprint, "recogniser", self.recogniser.fingerprint, text)

    def _predictions(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        """The model's (label, probability) per text, read from and written to the disk store when there is one
        (a stored chart's texts are predicted once, when it is prepared)."""
        if self.model is None:
            raise ValueError("no tier model")
        if self.store is None:
            return self.model.predict([fold(without_instructions(t)) for t in texts])
        keys = [self._model_key(t) for t in texts]
        stored = self.store.get_many(list(dict.fromkeys(keys)))
        missing = list(dict.fromkeys(t for key, t in zip(keys, texts, strict=True) if key not in stored))
        fresh = {self._model_key(t): json.dumps(prediction).encode() for t, prediction in
                 zip(missing, self.model.predict([fold(without_instructions(t)) for t in missing]), strict=True)}
        if fresh:
            self.store.put_many(fresh)
        return [_prediction_from_json(stored.get(key) or fresh[key]) for key in keys]

    def _model_key(self, text: str) -> str:
        if self._model_fingerprint is None:
            self._model_fingerprint = digest(self.fingerprint, "model", _path_digest(self.model.path)
                                             if self.model is not None else "")
        return digest(self._model_fingerprint, text)

    def run(self, record: PatientRecord) -> PatientRecord:
        decisions = self.classify_many([(f.text, f.section) for f in record.fragments])
        return record.replace_fragments(f.with_decision(d) for f, d in zip(record.fragments, decisions, strict=True))

    def to_dict(self) -> dict[str, Any]:
        """The model, when there is one, is rebuilt by its owner (an embedding model needs the embedder): see
        compose.resources.load_tier_model."""
        data: dict[str, Any] = {"rules_path": str(self.rules_path) if self.rules_path else None}
        if self.model is not None:
            data["model_path"] = str(self.model.path)
        if self.recogniser is not None:
            data["recogniser"] = self.recogniser.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TierClassifier:
        """The rules and the recogniser (which needs nothing but its folder); a model is rebuilt by its owner."""
        recogniser = data.get("recogniser")
        return cls(rules_path=data.get("rules_path"),
                   recogniser=CriticalRecogniser.from_dict(recogniser) if recogniser else None)
