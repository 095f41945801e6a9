"""The agent's own context, kept inside the model's window by the same EBM-Pack that packs patient records.

Fixed parts (system prompt, tool schemas, the question, the model's own turns) always stay. Observations are
the packable part: while they fit, every one is sent in full; when they do not, they become evidence items
(one per observation, aged one `step_age` per step since it arrived, so older ones decay) and the packer decides,
for the question, which stay full, which are compressed (state B: entity-preserving) and which are dropped.
The newest observation is always sent (cut at a line end only if it alone exceeds the room): the model must
see the answer to the call it just made; the older ones share what is left. Every
decision is recorded with its reason (`PackEvent`), and a dropped observation's sources stay citable —
they did appear in an observation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

from ebmrag.evidence.tiering import Tiering
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.types import EvidenceItem, State
from ebmrag.protocols import TokenCounter

DROPPED_NOTE = "[observation left out of the context by EBM-Pack ({reason}); its sources remain citable]"
CUT_NOTE = "[... cut to fit the window]"


@dataclass(frozen=True)
class PackEvent:
    step: int  # the model call at which the decision was made
    observation: str  # the observation's id (its tool call id)
    state: str  # full | compressed | dropped | cut
    reason: str


class ObservationMemory:
    """`fit(observations, fixed_tokens, question, step)` -> the text to send for each observation."""

    def __init__(self, packer: ContextPacker, tiering: Tiering, window: int, output_reserve: int, *,
                 token_counter: TokenCounter, step_age: timedelta = timedelta(days=30)) -> None:
        """`tiering` gives each observation its tier before the packer weighs it (the packer packs tiered items)."""
        if window <= output_reserve:
            raise ValueError(f"window ({window}) must exceed output_reserve ({output_reserve})")
        self.packer, self.window, self.output_reserve, self.step_age = packer, window, output_reserve, step_age
        self.tiering = tiering
        self.token_counter = token_counter
        self.events: list[PackEvent] = []
        self._last: dict[str, str] = {}

    def reset(self) -> None:
        """Forget the previous run's decisions (an agent serves many questions with one memory)."""
        self.events, self._last = [], {}

    def count(self, text: str) -> int:
        return self.token_counter.count(text)

    def fit(self, observations: list[tuple[str, str]], fixed_tokens: int, question: str, step: int) -> dict[str, str]:
        """observations: (id, text) oldest first. Returns id -> text to send (full, compressed or a drop note)."""
        budget = self.window - self.output_reserve - fixed_tokens
        if budget < 64:
            raise ValueError(f"the agent's window of {self.window} tokens leaves {budget} for observations after the "
                             f"question, the tools and the model's turns; raise [research] window")
        if not observations or sum(self.count(t) for _, t in observations) <= budget:
            return dict(observations)
        newest_id, newest = observations[-1]
        if self.count(newest) > budget:
            newest = self._cut(newest, budget)
            self._note(step, newest_id, "cut", "the newest observation alone exceeds the window: cut at a line end")
        out = self._pack_older(observations[:-1], budget - self.count(newest), question, step)
        out[newest_id] = newest
        return out

    def _pack_older(self, older: list[tuple[str, str]], budget: int, question: str, step: int) -> dict[str, str]:
        if sum(self.count(t) for _, t in older) <= budget:
            return dict(older)
        out: dict[str, str] = {}
        if budget < 32:
            for oid, _ in older:
                out[oid] = DROPPED_NOTE.format(reason="capacity")
                self._note(step, oid, "dropped", "capacity")
            return out
        steps = len(older) - 1
        items = self._tiered([self._item(steps - i, oid, text) for i, (oid, text) in enumerate(older)])
        result = self.packer.run(None, question, budget, evidence=items)
        for packed in result.packed:
            body = packed.body or packed.text
            out[packed.fragment_id] = body if packed.state == State.FULL else f"[compressed by EBM-Pack] {body}"
            self._note(step, packed.fragment_id, packed.state.value, packed.reason.value)
        for dropped in result.dropped:
            out[dropped.fragment_id] = DROPPED_NOTE.format(reason=dropped.reason.value)
            self._note(step, dropped.fragment_id, "dropped", dropped.reason.value)
        return out

    def _cut(self, text: str, budget: int) -> str:
        kept: list[str] = []
        for line in text.splitlines():
            if self.count("\n".join([*kept, line, CUT_NOTE])) > budget:
                break
            kept.append(line)
        return "\n".join([*kept, CUT_NOTE])

    def _tiered(self, items: list[EvidenceItem]) -> list[EvidenceItem]:
        """The observations with their tier decisions, decided in one batch."""
        decisions = self.tiering.decide([(item.text, item.section) for item in items])
        return [replace(item, decision=decision) for item, decision in zip(items, decisions, strict=True)]

    def _item(self, steps_ago: int, observation_id: str, text: str) -> EvidenceItem:
        """An observation ages by the steps since it arrived; its tier is the tiering step's (`_tiered`), and like
        a chart note it may be compressed (state B) or collapsed with a near-copy."""
        return EvidenceItem(observation_id, text, section="observation", source="agent",
                            age=steps_ago * self.step_age, compressible=True)

    def _note(self, step: int, observation: str, state: str, reason: str) -> None:
        """Record a decision when it changes (the same observation packed the same way is not repeated)."""
        if self._last.get(observation) != state:
            self._last[observation] = state
            self.events.append(PackEvent(step, observation, state, reason))
