"""Packing evaluation: RRCE, entity-level RRCE and its ceiling, T1 retention, utility ratio, time per pack.

Definitions (percentages, pooled over all critical fragments of all cases):
- critical fragment: a signal fragment whose gold tier is T1 or T2 (gold = field label or classifier,
  see eval.cases); noise is never critical.
- RRCE (the EBM-Pack paper's retention rate of critical evidence): share of critical fragments packed in any state.
- entity RRCE: share of critical fragments packed with every key entity intact (all non-date
  entities of the fragment appear in its packed text); catches a fragment kept but cut.
- entity ceiling: the best entity RRCE any packing can reach in the window. Every critical fragment
  is worth 1 if packed in a state that keeps all its entities, at that state's token cost; with
  equal values, taking the cheapest first is optimal, so a sort solves it exactly.
- T1 retention: share of gold-T1 fragments packed (None when the cases hold no T1 fragment).
- utility ratio: mean over cases of the strategy's utility / the ebm-exact utility (the optimum under
  the same must-keep and quota constraints; a strategy that ignores them can exceed 100).
- ms per pack: median time of the packing step alone; candidate building is shared by all strategies.
- findings RRCE: RRCE over the critical fragments that are findings, i.e. not results the tiering reads as normal
  (evidence.result_flags): a normal result competes by utility (packing.levels), so RRCE counts what the order
  sets aside on purpose and this counts what it protects.
- history retention: share of the noise's level-3 fragments (packing.levels: pathology, genetics, chronic
  diagnoses and critical results of other visits) that are packed, so the cost of the clinical order is shown.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace

from ebmrag.eval.cases import EvalCase
from ebmrag.evidence.entities import EntityExtractor, EntityKind
from ebmrag.evidence.result_flags import NORMAL
from ebmrag.evidence.tiering import Tiering
from ebmrag.packing.dedup import collapse_duplicates
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.levels import Level
from ebmrag.packing.packer import Packer
from ebmrag.packing.types import Candidate, DroppedFragment, PackResult
from ebmrag.packing.utility import CandidateBuilder, MeasuredFragment, UtilityParams, score_candidates
from ebmrag.protocols import Progress
from ebmrag.records.fragment import Tier


def entity_keys(text: str, extractor: EntityExtractor) -> frozenset[tuple[str, str, bool]]:
    return frozenset(e.key for e in extractor.extract(text) if e.kind is not EntityKind.DATE)


@dataclass(frozen=True)
class PreparedCase:
    """A noisy case tiered and measured once; any utility parameters can then be applied cheaply. `extractor`
    reads the entity keys of the critical fragments and of what a pack kept of them."""

    case: EvalCase
    measured: tuple[MeasuredFragment, ...]
    critical_keys: dict[str, frozenset[tuple[str, str, bool]]]
    extractor: EntityExtractor = field(compare=False, repr=False)

    def candidates(self, params: UtilityParams) -> list[Candidate]:
        return score_candidates(self.measured, params)





def _prefetch_embeddings(cases: Sequence[EvalCase], builder: CandidateBuilder, label: str,
                         progress: Progress | None, batch: int = 2048) -> None:
    """Embeds every question and fragment up front in large calls (the embedder then batches similar
    lengths across cases); measuring each case afterwards hits the embedder's cache."""
    texts = list(dict.fromkeys([*(c.question for c in cases), *(f.text for c in cases for f in c.record.fragments)]))
    for start in range(0, len(texts), batch):
        if progress:
            progress(f"embedding {label}", start, len(texts))
        builder.embedder.embed(texts[start:start + batch])
    if progress:
        progress(f"embedding {label}", len(texts), len(texts))


def prepare(cases: Iterable[EvalCase], builder: CandidateBuilder, tiering: Tiering, extractor: EntityExtractor,
            progress: Progress | None = None, label: str = "cases") -> list[PreparedCase]:
    """Each case tiered and measured. `tiering` and `extractor` are the composition root's (compose.build_tiering,
    compose.Resources.extractor: the one state B is built with, so a kept state is judged by the entities it was
    built to keep)."""
    cases = list(cases)
    _prefetch_embeddings(cases, builder, label, progress)
    prepared = []
    for done, case in enumerate(cases):
        if progress:
            progress(f"measuring {label}", done, len(cases))
        record = tiering.run(case.record)
        measured = builder.measure(record, case.question)
        texts = {f.id: f.text for f in case.record.fragments}
        keys = {fid: entity_keys(texts[fid], extractor) for fid in case.critical_ids}
        prepared.append(PreparedCase(case, tuple(measured), keys, extractor))
    if progress:
        progress(f"measuring {label}", len(cases), len(cases))
    return prepared


@dataclass
class CaseScore:
    critical: int = 0
    kept: int = 0
    entity_kept: int = 0
    ceiling: int = 0
    t1: int = 0
    t1_kept: int = 0
    utility_ratio: float = 100.0
    ms: float = 0.0
    history: int = 0  # the noise's level-3 fragments (other visits' pathology, genetics, chronic diagnoses)
    history_kept: int = 0
    findings: int = 0  # critical fragments that are not normal results
    findings_kept: int = 0


def _body(candidate: Candidate, line: str) -> str:
    return line[len(candidate.header) + 1 :] if line.startswith(candidate.header) else line


def complete_costs(prepared: PreparedCase, candidates: Sequence[Candidate],
                   copies: Sequence[DroppedFragment] = ()) -> list[int]:
    """Per critical fragment, the cheapest state that keeps all its entities; sorted. Window-independent.
    A critical copy whose kept twin is critical too rides along with it at no cost."""
    costs = []
    for candidate in candidates:
        keys = prepared.critical_keys.get(candidate.fragment.id)
        if keys is None:
            continue
        complete = [o.tokens for o in candidate.options
                    if keys <= entity_keys(_body(candidate, o.text), prepared.extractor)]
        if complete:
            costs.append(min(complete))
    costs += [0 for d in copies if d.fragment_id in prepared.critical_keys and d.duplicate_of in prepared.critical_keys]
    return sorted(costs)


def fit_count(sorted_costs: Sequence[int], window: int) -> int:
    fitted, room = 0, window
    for cost in sorted_costs:
        if cost > room:
            break
        room -= cost
        fitted += 1
    return fitted


def entity_ceiling(prepared: PreparedCase, candidates: Sequence[Candidate], window: int) -> int:
    """How many critical fragments some packing can hold with all entities intact (cheapest-first is exact)."""
    return fit_count(complete_costs(prepared, candidates), window)


def score_pack(prepared: PreparedCase, candidates: Sequence[Candidate], result: PackResult) -> CaseScore:
    """A critical fragment collapsed as a copy counts as kept when the fragment kept in its place is packed
    (its text, numbers included, is in the context); its entities are then checked in that text."""
    by_id = {c.fragment.id: c for c in candidates}
    packed = {p.fragment_id: p for p in result.packed}
    twin = {d.fragment_id: d.duplicate_of for d in result.dropped if d.duplicate_of}
    score = CaseScore()
    for fragment_id, tier in prepared.case.gold_tiers.items():
        if tier not in (Tier.T1, Tier.T2):
            continue
        holder = twin.get(fragment_id, fragment_id)
        entry = packed.get(holder)
        decision = by_id[holder].fragment.decision if holder in by_id else None
        finding = decision is None or decision.flag != NORMAL
        score.critical += 1
        score.t1 += tier is Tier.T1
        score.findings += finding
        if entry is None:
            continue
        score.kept += 1
        score.findings_kept += finding
        score.t1_kept += tier is Tier.T1
        body = _body(by_id[holder], entry.text)
        score.entity_kept += prepared.critical_keys[fragment_id] <= entity_keys(body, prepared.extractor)
    history = [c.fragment.id for c in candidates
               if c.level is Level.STANDING_HISTORY and c.fragment.id not in prepared.case.gold_tiers]
    score.history = len(history)
    score.history_kept = sum(twin.get(fid, fid) in packed for fid in history)
    return score


@dataclass(frozen=True)
class PackingRow:
    """One line of `results.json` (the shape is fixed by issue 3)."""

    dataset: str
    strategy: str
    window: int
    cases: int
    rrce: float
    entity_rrce: float
    entity_ceiling: float
    t1_retention: float | None
    utility_ratio: float
    ms_per_pack: float
    history_retention: float | None = None  # share of the noise's level-3 fragments packed (the cost of the order)
    findings_rrce: float | None = None  # RRCE over the critical fragments that are not normal results

    def to_json(self) -> dict[str, object]:
        row = asdict(self)
        for key, value in row.items():
            if isinstance(value, float):
                row[key] = round(value, 3)
        return row


def _share(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 100.0


def summarize(dataset: str, strategy: str, window: int, scores: Sequence[CaseScore]) -> PackingRow:
    critical = sum(s.critical for s in scores)
    t1 = sum(s.t1 for s in scores)
    history = sum(s.history for s in scores)
    return PackingRow(
        dataset, strategy, window, len(scores), _share(sum(s.kept for s in scores), critical),
        _share(sum(s.entity_kept for s in scores), critical), _share(sum(s.ceiling for s in scores), critical),
        _share(sum(s.t1_kept for s in scores), t1) if t1 else None,
        statistics.fmean(s.utility_ratio for s in scores) if scores else 100.0,
        statistics.median(s.ms for s in scores) if scores else 0.0,
        _share(sum(s.history_kept for s in scores), history) if history else None,
        _share(sum(s.findings_kept for s in scores), sum(s.findings for s in scores)))


def evaluate(prepared: Sequence[PreparedCase], packers: Sequence[Packer], windows: Sequence[int],
             params: UtilityParams | None = None, k_min: int = 1) -> list[PackingRow]:
    """Every packer at every window on every case; one row per (packer, window)."""
    params = params or UtilityParams()
    reference = next((p for p in packers if isinstance(p, ExactPacker) and p.k_min == k_min), ExactPacker(k_min))
    dataset = prepared[0].case.dataset if prepared else ""
    scores: dict[tuple[str, int], list[CaseScore]] = {(p.name, w): [] for p in packers for w in windows}
    for item in prepared:
        candidates, copies = collapse_duplicates(item.candidates(params))  # as ContextPacker.run does
        costs = complete_costs(item, candidates, copies)
        for window in windows:
            results = {id(p): _timed(p, candidates, window, copies) for p in packers}
            own = results.get(id(reference))
            optimum = own[0].utility if own else reference.pack(candidates, window).utility
            for packer in packers:
                result, elapsed = results[id(packer)]
                score = score_pack(item, candidates, result)
                score.ms, score.ceiling = elapsed, fit_count(costs, window)
                score.utility_ratio = 100.0 * result.utility / optimum if optimum > 0 else 100.0
                scores[(packer.name, window)].append(score)
    return [summarize(dataset, name, window, rows) for (name, window), rows in scores.items()]


def _timed(packer: Packer, candidates: Sequence[Candidate], window: int,
           copies: Sequence[DroppedFragment] = ()) -> tuple[PackResult, float]:
    started = time.perf_counter()
    result = packer.pack(candidates, window)
    elapsed = (time.perf_counter() - started) * 1000
    return replace(result, dropped=(*result.dropped, *copies)), elapsed
