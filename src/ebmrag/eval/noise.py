"""Noise injection as in the EBM-Pack paper's experiments: an overflowing record around each case's signal.

Per case, N noise fragments are added (default N = 12 per signal fragment, the paper's 1:12):
40 % templated filler (routine follow-up and administrative lines, generated here from our own
templates), 30 % pieces of other cases (consecutive sentences, sometimes cut mid-sentence), 30 %
cross-department splices (the first half of one other case's passage joined to the second half of
another's). Each noise fragment is shaped like the case's own signal (a random signal fragment's
length x 0.5-1.0), so the candidate volume lands in the paper's 10-15x the signal. Noise is dated over the
`history_days` before the encounter day, so time decay has something to act on; `recent_share` puts
that share of it on the encounter day itself, where it competes with the signal on equal terms (a
harder protocol than the paper's). The record order, which is all FIFO truncation sees, is a seeded
shuffle by default: the paper's FIFO retention (14.1 % at 256 tokens) matches a random queue, while a
time-ordered export with the encounter last would give FIFO 0 %.
Everything is drawn from `random.Random(seed, case id)`: the same seed gives the same records.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from ebmrag.eval.cases import ENCOUNTER, EvalCase
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.text.sentences import split_sentences

_FILLER_EN = (
    "Patient took {drug_class} as prescribed; no missed doses reported at the {n}-week review.",
    "Routine follow-up call on day {n}: the patient states things are about the same.",
    "Appointment rescheduled to {weekday} at the patient's request.",
    "Nursing round {hh}:00: resting in bed, call bell within reach, no new concerns raised.",
    "Insurance pre-authorisation form faxed to the payer; reference number pending.",
    "Discharge paperwork reviewed with the family; copy placed in the chart.",
    "Patient educated on hand hygiene and the visiting hours of ward {ward}.",
    "Telephone contact attempted at {hh}:{mm}; voicemail left asking to call back.",
    "Meal tray delivered; patient ate about {pct} percent of lunch.",
    "Transport booked for the outpatient visit on {weekday}.",
    "Chart audit completed by the ward clerk; no missing signatures.",
    "Patient ambulated in the corridor twice with a steady gait.",
    "Pharmacy confirmed the home medication list; no changes today.",
    "Social work note: the patient lives with a {relative} who helps with shopping.",
    "Interpreter not required; consent discussion documented in the usual form.",
    "Follow-up letter posted to the registered address on {weekday}.",
    "Bed linen changed and personal belongings checked on shift handover.",
    "Patient watched television and slept well overnight per night staff.",
    "Clinic reminder text message sent {n} days before the visit.",
    "Parking voucher issued for the {weekday} appointment.",
)
_FILLER_ZH = (
    "患者遵医嘱按时服药，第{n}周随访未诉漏服。",
    "第{n}天电话随访：患者自述情况与前相仿。",
    "应患者要求，复诊时间改至{weekday_zh}。",
    "{hh}时护理巡视：患者卧床休息，呼叫器在手边，未诉新的不适。",
    "医保预授权材料已提交，等待审批编号。",
    "已向家属交代出院手续，复印件归档。",
    "已向患者宣教手卫生及{ward}病区探视时间。",
    "{hh}时{mm}分电话联系患者未接通，已留言请回电。",
    "患者午餐进食约{pct}%。",
    "已预约{weekday_zh}门诊复诊的转运。",
    "病历质控完成，签字齐全。",
    "患者在走廊内行走两次，步态平稳。",
    "药房核对居家用药清单，今日无变更。",
    "社工记录：患者与{relative_zh}同住，日常购物由其协助。",
    "夜班记录：患者夜间睡眠可，看电视后入睡。",
    "复诊提醒短信已于就诊前{n}天发送。",
)
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
_WEEKDAYS_ZH = ("周一", "周二", "周三", "周四", "周五")
_RELATIVES = ("daughter", "son", "spouse", "neighbour", "sister")
_RELATIVES_ZH = ("女儿", "儿子", "配偶", "邻居", "姐姐")
_DRUG_CLASSES = ("the usual tablets", "the inhaler", "the vitamin supplement", "the eye drops")


@dataclass(frozen=True)
class NoiseConfig:
    """ratio: noise fragments per signal fragment; count (if set) fixes N instead, for the noise sweep."""

    ratio: int = 12
    count: int | None = None
    filler_share: float = 0.4
    other_case_share: float = 0.3
    seed: int = 0
    history_days: int = 720
    recent_share: float = 0.0  # noise written on the encounter day itself, as recent as the signal
    order: str = "shuffled"  # record order: "shuffled" (the paper's queue) or "time" (an EHR export)

    def __post_init__(self) -> None:
        if self.ratio < 0 or (self.count is not None and self.count < 0):
            raise ValueError("noise ratio and count must be >= 0")
        shares = (self.filler_share, self.other_case_share)
        if min(shares) < 0 or sum(shares) > 1:
            raise ValueError("filler_share and other_case_share must be >= 0 and sum to <= 1 (the rest is splices)")
        if not 0 <= self.recent_share <= 1:
            raise ValueError(f"recent_share must be in [0, 1], got {self.recent_share}")
        if self.order not in ("shuffled", "time"):
            raise ValueError(f"order must be 'shuffled' or 'time', got {self.order!r}")
        if self.history_days < 1:
            raise ValueError(f"history_days must be >= 1, got {self.history_days}")

    def noise_count(self, signal_fragments: int) -> int:
        return self.count if self.count is not None else self.ratio * signal_fragments


def filler_line(rng: random.Random, language: str = "en") -> str:
    template = rng.choice(_FILLER_ZH if language == "zh" else _FILLER_EN)
    return template.format(
        n=rng.randint(1, 12), hh=f"{rng.randint(6, 22):02d}", mm=f"{rng.randint(0, 59):02d}",
        pct=rng.choice((25, 50, 75)), ward=rng.choice("ABCDEFG") + str(rng.randint(1, 9)),
        weekday=rng.choice(_WEEKDAYS), weekday_zh=rng.choice(_WEEKDAYS_ZH), relative=rng.choice(_RELATIVES),
        relative_zh=rng.choice(_RELATIVES_ZH), drug_class=rng.choice(_DRUG_CLASSES))


def _sentences(case: EvalCase) -> list[str]:
    return [s.text for f in case.record.fragments for s in split_sentences(f.text)]


def _join(parts: Sequence[str]) -> str:
    text = ""
    for part in parts:
        text += part if not text or not text[-1].isascii() else " " + part
    return text


def _span(rng: random.Random, pool: Sequence[str], target: int) -> str:
    """Consecutive sentences of one donor case from a random start, until about `target` characters."""
    index, length = rng.randrange(len(pool)), 0
    parts: list[str] = []
    while index < len(pool) and (not parts or length < target):
        parts.append(pool[index])
        length += len(pool[index])
        index += 1
    return _join(parts)


def _piece(rng: random.Random, text: str) -> str:
    """The text, or cut after a clause boundary in its last third: the paper's 'broken sentence fragments'."""
    cuts = [i + 1 for i, ch in enumerate(text) if ch in ",;，；" and 2 * len(text) // 3 <= i < len(text) - 10]
    return text[: rng.choice(cuts)].rstrip(",;，； ") if cuts and rng.random() < 0.5 else text


def _splice(rng: random.Random, first: str, second: str) -> str:
    head = first[: max(12, len(first) // 2)].rsplit(" ", 1)[0] if " " in first else first[: len(first) // 2]
    tail = second[len(second) // 2 :].split(" ", 1)[-1] if " " in second else second[len(second) // 2 :]
    joiner = "" if not head.isascii() else " "
    return f"{head.rstrip(',;，；')}{joiner}{tail}".strip()


def _rng(config: NoiseConfig, case_id: str, purpose: str) -> random.Random:
    """Separate streams for text, time and order: changing the timing keeps the same noise texts."""
    digest = hashlib.sha256(f"{config.seed}:{case_id}:{purpose}".encode()).hexdigest()
    return random.Random(int(digest[:16], 16))


def _stamp(rng: random.Random, config: NoiseConfig, signal_fragments: int) -> datetime:
    if rng.random() < config.recent_share:
        return ENCOUNTER + timedelta(minutes=rng.randint(-24 * 60, signal_fragments))
    return ENCOUNTER - timedelta(minutes=rng.randint(24 * 60, config.history_days * 24 * 60))


def inject_noise(case: EvalCase, others: Sequence[EvalCase], config: NoiseConfig) -> EvalCase:
    """The case with noise fragments added, in time order; gold tiers (signal only) are unchanged."""
    rng, clock = _rng(config, case.case_id, "text"), _rng(config, case.case_id, "time")
    donors = [o for o in others if o.case_id != case.case_id and o.language == case.language]
    pools = [_sentences(o) for o in donors]
    pools = [p for p in pools if p]
    patient, signal = case.record.patient_id, len(case.record.fragments)
    lengths = [len(f.text) for f in case.record.fragments]
    noise = []
    for index in range(config.noise_count(len(case.record.fragments))):
        target = max(20, int(rng.choice(lengths) * rng.uniform(0.5, 1.0)))  # noise shaped like the signal
        draw = rng.random()
        if draw < config.filler_share or not pools:
            lines = [filler_line(rng, case.language)]
            while sum(map(len, lines)) < target:
                lines.append(filler_line(rng, case.language))
            text = _join(lines)
        elif draw < config.filler_share + config.other_case_share or len(pools) < 2:
            text = _piece(rng, _span(rng, rng.choice(pools), target))
        else:
            first_pool, second_pool = rng.sample(pools, 2)
            text = _splice(rng, _span(rng, first_pool, target), _span(rng, second_pool, target))
        noise.append(Fragment(f"{patient}-n{index}", patient, text, None, _stamp(clock, config, signal), "noise"))
    fragments = [*case.record.fragments, *noise]
    if config.order == "time":
        fragments.sort(key=lambda f: (f.timestamp or ENCOUNTER, f.id))
    else:
        _rng(config, case.case_id, "order").shuffle(fragments)
    record = PatientRecord(patient, tuple(fragments), case.record.origin)
    return replace(case, record=record)


def noisy_cases(cases: Sequence[EvalCase], config: NoiseConfig) -> list[EvalCase]:
    return [inject_noise(case, cases, config) for case in cases]
