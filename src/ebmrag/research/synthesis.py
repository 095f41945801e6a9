"""KISA question synthesis (after MedResearcher-R1): an entity graph from the knowledge base, rare seeds, the longest
valid path, a multi-hop question with its gold answer, chunk chain and masked-trajectory guidance.

Graph. A document's title is a condition node (MedQuAD-style pages: "Alport syndrome"). Each chunk of a typed
section (`RELATIONS`: symptoms, causes, treatment, exams and tests, ...) links the title to the entities the chunk
mentions: the entity lexicons' findings, tests and drugs, gene symbols in genetic sections, and the titles of
other documents. Every edge carries the chunk id that states it, so every hop of a question is backed.

Seeds and paths. Entity frequency is the number of chunks that mention it; seeds are entities at or below
`rare_max` chunks (rarest first, seeded shuffle among equals). From a seed, a depth-first search finds the
longest *valid* path: simple (no node twice), every edge backed by a chunk, no two hops from the same chunk,
no hub node (an entity in more than `hub_max` chunks, such as "pain", connects everything and says
nothing) inside the path, and a hop from an entity back to a condition only through an entity in at most
`bridge_max` chunks (otherwise "a condition with <that finding>" has too many right answers). Branching is
capped at `branch` neighbours per node, rarest first, so the search is
bounded: O(n_seeds · branch^max_hops) at worst.

Questions. Offline, a template walks the path step by step from the seed ("Start from X. Find a condition that
lists it among its symptoms. Then a treatment of that condition. ..."); with a model, the steps are rewritten
into one natural question (the template stays when the reply is unusable; the prompt is the `question_synthesis`
step of llm/prompts/steps/{en,zh}.toml). The gold answer is the path's last entity. The masked guidance replaces
every entity by [MASK] and keeps the relations.
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.evidence.entities import EntityExtractor, EntityKind
from ebmrag.index.backend import KnowledgeStore
from ebmrag.llm.prompts import step_prompt
from ebmrag.protocols import ChatClient, ChatMessage
from ebmrag.retrieve.search import HybridRetriever

# section type -> (relation, forward phrase "X's ...", backward phrase "a condition with ... X", answer kind)
RELATIONS: dict[str, tuple[str, str, str]] = {
    "symptoms": ("has_symptom", "a symptom of", "lists it among its symptoms"),
    "causes": ("has_cause", "a cause of", "has it among its causes"),
    "genetic changes": ("has_genetic_cause", "a gene involved in", "involves that gene"),
    "inheritance": ("has_inheritance", "the inheritance of", "is inherited that way"),
    "treatment": ("treated_with", "a treatment of", "is treated with it"),
    "exams and tests": ("diagnosed_by", "a test used to diagnose", "is diagnosed with that test"),
    "complications": ("has_complication", "a complication of", "has it as a complication"),
    "susceptibility": ("has_risk_factor", "a risk factor for", "has it as a risk factor"),
    "prevention": ("prevented_by", "a way to prevent", "is prevented that way"),
}
_GENE = re.compile(r"\b[A-Z][A-Z0-9]{1,7}\d[A-Z0-9]*\b|\b[A-Z]{3,6}\b")
_NOT_GENES = frozenset("DNA RNA MRI CT HIV AIDS USA FDA NIH THE AND ECG EKG BMI".split())
_WORD = re.compile(r"[a-z0-9][a-z0-9-]*")


@dataclass(frozen=True)
class Edge:
    condition: str  # the document title node
    relation: str
    section: str
    entity: str
    chunk_id: str


@dataclass(frozen=True)
class Hop:
    source: str
    relation: str
    target: str
    forward: bool  # condition -> entity (True) or entity -> condition
    chunk_id: str
    section: str

    @property
    def triple(self) -> tuple[str, str, str]:
        """(condition, relation, entity), whichever way the hop walks it."""
        return (self.source, self.relation, self.target) if self.forward else \
            (self.target, self.relation, self.source)

    def query(self) -> str:
        """What an agent would search at this step, knowing only `source`."""
        if self.forward:
            return f"What are the {self.section} of {self.source}?"
        return f"Which conditions have {self.source} among their {self.section}?"


@dataclass(frozen=True)
class SynthQuestion:
    question: str
    answer: str
    hops: tuple[Hop, ...]
    seed_frequency: int
    phrased_by: str  # template | model

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "hops": len(self.hops),
                "path": [{"from": h.source, "to": h.target, "triple": list(h.triple), "chunk_id": h.chunk_id}
                         for h in self.hops],
                "chunk_chain": [h.chunk_id for h in self.hops],
                "masked_trajectory": [["[MASK]", h.relation, "[MASK]"] for h in self.hops],
                "seed": self.hops[0].source, "seed_frequency": self.seed_frequency, "phrased_by": self.phrased_by}


class EntityGraph:
    """Condition titles linked to the entities their typed sections mention, each edge backed by a chunk."""

    def __init__(self, edges: Iterable[Edge], frequency: Counter[str]) -> None:
        self.frequency = frequency
        self.adjacent: dict[str, list[Edge]] = defaultdict(list)
        self.edges = 0
        for edge in edges:
            self.adjacent[edge.condition].append(edge)
            self.adjacent[edge.entity].append(edge)
            self.edges += 1

    @classmethod
    def from_kb(cls, kb: KnowledgeStore, extractor: EntityExtractor) -> EntityGraph:
        """`extractor`: the composition root's (compose.Resources.extractor)."""
        reader = kb.reader()
        titles = {d.doc_id: _norm(d.title) for d in reader.documents().values() if len(_norm(d.title)) >= 4}
        title_set = set(titles.values())
        edges: list[Edge] = []
        frequency: Counter[str] = Counter()
        for chunk in reader.iter_chunks():
            mentioned = _mentions(chunk.text, chunk.section, extractor, title_set)
            frequency.update(mentioned)
            relation = RELATIONS.get(chunk.section.lower())
            condition = titles.get(chunk.doc_id)
            if relation and condition:
                edges += [Edge(condition, relation[0], chunk.section.lower(), e, chunk.chunk_id)
                          for e in sorted(mentioned) if e != condition]
        return cls(edges, frequency)

    def seeds(self, rare_max: int, rng: random.Random) -> list[str]:
        rare = [n for n in self.adjacent if 0 < self.frequency.get(n, 0) <= rare_max]
        rng.shuffle(rare)
        return sorted(rare, key=lambda n: self.frequency[n])

    def longest_path(self, seed: str, max_hops: int, hub_max: int, branch: int, bridge_max: int = 3) -> list[Hop]:
        best: list[Hop] = []
        stack: list[tuple[str, list[Hop], frozenset[str], frozenset[str]]] = [(seed, [], frozenset([seed]),
                                                                                frozenset())]
        while stack:
            node, path, seen, chunks = stack.pop()
            if len(path) > len(best):
                best = path
            if len(path) == max_hops:
                continue
            for hop in self._next_hops(node, seen, chunks, hub_max, branch, bridge_max):
                stack.append((hop.target, [*path, hop], seen | {hop.target}, chunks | {hop.chunk_id}))
        return best

    def _next_hops(self, node: str, seen: frozenset[str], chunks: frozenset[str], hub_max: int,
                   branch: int, bridge_max: int) -> list[Hop]:
        hops = []
        for edge in self.adjacent.get(node, []):
            forward = edge.condition == node
            if not forward and self.frequency.get(node, 0) > bridge_max:
                continue  # "a condition that has <common finding>" has too many answers to be a question
            target = edge.entity if forward else edge.condition
            if target in seen or edge.chunk_id in chunks or self.frequency.get(target, 0) > hub_max:
                continue
            hops.append(Hop(node, edge.relation, target, forward, edge.chunk_id, edge.section))
        unique = {(h.target, h.relation): h for h in hops}
        return sorted(unique.values(), key=lambda h: (self.frequency.get(h.target, 0), h.target))[:branch]


def _norm(text: str) -> str:
    """Lower case, possessives dropped ("Alzheimer's disease" = "Alzheimer disease"), punctuation to spaces."""
    text = re.sub(r"['’]s\b", "", text.lower())
    return re.sub(r"\s+", " ", re.sub(r"[^a-z0-9 -]", " ", text)).strip()


def _mentions(text: str, section: str, extractor: EntityExtractor, titles: set[str]) -> set[str]:
    found = {_norm(e.text) for e in extractor.extract(text)
             if e.kind in (EntityKind.FINDING, EntityKind.TEST, EntityKind.DRUG) and not e.negated}
    if "genetic" in section.lower():
        found |= {g.lower() for g in _GENE.findall(text) if g not in _NOT_GENES}
    words = _WORD.findall(_norm(text))
    for size in range(1, 7):
        found |= {" ".join(words[i:i + size]) for i in range(len(words) - size + 1)} & titles
    return {f for f in found if len(f) >= 4}


def phrase(hops: Sequence[Hop]) -> str:
    """The offline template: the path as numbered steps from the seed."""
    steps = [f"Start from {hops[0].source}."]
    for n, hop in enumerate(hops, 1):
        _, forward_phrase, backward_phrase = RELATIONS[hop.section]
        if hop.forward:  # a forward hop always leaves a condition
            steps.append(f"Step {n}: find {forward_phrase} {hops[0].source if n == 1 else 'that condition'}.")
        else:
            steps.append(f"Step {n}: find a condition that {backward_phrase}.")
    steps.append("What do you reach at the last step?")
    return " ".join(steps)


def synthesize(graph: EntityGraph, n: int, min_hops: int = 3, max_hops: int = 6, rare_max: int = 3,
               hub_max: int = 150, branch: int = 6, seed: int = 13, bridge_max: int = 3,
               client: ChatClient | None = None, language: str = "en") -> list[SynthQuestion]:
    """`language` (en, zh) is the language the model is asked to phrase the questions in."""
    if n < 1 or not 1 <= min_hops <= max_hops:
        raise ValueError("n must be >= 1 and 1 <= min_hops <= max_hops")
    rng = random.Random(seed)
    out: list[SynthQuestion] = []
    used_answers: set[str] = set()
    for start in graph.seeds(rare_max, rng):
        path = graph.longest_path(start, max_hops, hub_max, branch, bridge_max)
        if len(path) < min_hops or path[-1].target in used_answers:
            continue
        used_answers.add(path[-1].target)
        template = phrase(path)
        question, by = _rephrased(client, template, language)
        out.append(SynthQuestion(question, path[-1].target, tuple(path), graph.frequency[start], by))
        if len(out) == n:
            break
    return out


def _rephrased(client: ChatClient | None, template: str, language: str = "en") -> tuple[str, str]:
    if client is None:
        return template, "template"
    prompt = step_prompt("question_synthesis", language).render("user", steps=template)
    try:
        reply = client.complete([ChatMessage("user", prompt)], 0.3, 200).text.strip()
    except Exception:  # a failing model leaves the template, never the run
        return template, "template"
    return (reply, "model") if 20 <= len(reply) <= 600 else (template, "template")


@dataclass(frozen=True)
class ChainCoverage:
    questions: int
    hops: Counter[int]
    mean_hops: float
    whole_chain_found: float  # share of questions whose every hop's chunk is in the top k for that hop's query
    hop_found: float
    forward_found: float  # hops from a condition to what its section says
    backward_found: float  # hops from an entity to a condition that mentions it

    def to_json(self) -> dict[str, Any]:
        return {"questions": self.questions, "hop_distribution": dict(sorted(self.hops.items())),
                "mean_hops": round(self.mean_hops, 2), "whole_chain_in_top_k": round(self.whole_chain_found, 4),
                "hops_in_top_k": round(self.hop_found, 4), "forward_hops_in_top_k": round(self.forward_found, 4),
                "backward_hops_in_top_k": round(self.backward_found, 4)}


def chain_coverage(questions: Sequence[SynthQuestion], retriever: HybridRetriever, k: int = 10) -> ChainCoverage:
    """Per hop, search `Hop.query()` (what an agent knows at that step) and check the hop's backing chunk is in the
    top k."""
    whole = 0
    found: dict[bool, list[bool]] = {True: [], False: []}
    for q in questions:
        results = retriever.run_many([h.query() for h in q.hops], k)
        hits = [h.chunk_id in {r.chunk_id for r in result} for h, result in zip(q.hops, results, strict=True)]
        whole += all(hits)
        for hop, hit in zip(q.hops, hits, strict=True):
            found[hop.forward].append(hit)
    n = max(len(questions), 1)
    every = found[True] + found[False]
    return ChainCoverage(len(questions), Counter(len(q.hops) for q in questions),
                         sum(len(q.hops) for q in questions) / n, whole / n, _share(every), _share(found[True]),
                         _share(found[False]))


def _share(hits: Sequence[bool]) -> float:
    return sum(hits) / len(hits) if hits else 0.0
