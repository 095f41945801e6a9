"""KISA synthesis on a small knowledge base written for the test: graph edges backed by chunks, the longest
valid path from a rare seed, the question, its gold answer, the chunk chain and the masked guidance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.evidence.entities import default_extractor
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.sync import ingest_paths
from ebmrag.research.synthesis import EntityGraph, chain_coverage, synthesize
from ebmrag.retrieve.params import RetrievalParams
from ebmrag.retrieve.search import HybridRetriever

pytestmark = pytest.mark.model

PAGES = [
    ("alport-sym", "Alport syndrome", "symptoms", "Blood in the urine is usually the first sign. Over the years many "
     "patients progress to chronic kidney disease, and some lose hearing in both ears."),
    ("ckd-comp", "Chronic kidney disease", "complications", "As filtration falls, renal anemia becomes common and "
     "bone mineral changes follow."),
    ("anemia-tx", "Renal anemia", "treatment", "Doctors first correct iron deficiency with intravenous iron and then "
     "consider injections that stimulate red cell production."),
    ("iron-causes", "Iron deficiency", "causes", "Slow bleeding from the gut, heavy periods and poor absorption in "
     "coeliac disease are the usual reasons."),
    ("coeliac-tests", "Coeliac disease", "exams and tests", "Antibody blood tests are followed by a small bowel "
     "biopsy while the person still eats gluten."),
    ("ckd-info", "Chronic kidney disease", "information", "A long-lasting loss of kidney function."),
]


@pytest.fixture(scope="module")
def small_kb(tmp_path_factory: pytest.TempPathFactory, embedder: Any) -> HybridRetriever:
    folder = tmp_path_factory.mktemp("synth")
    corpus = folder / "pages.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "title": t, "section": s, "text": x, "authority": "textbook"}) + "\n"
                              for i, t, s, x in PAGES), encoding="utf-8")
    kb = KnowledgeBase(folder / "kb", embedder=embedder)
    assert not ingest_paths(kb, [corpus]).errors
    return HybridRetriever(kb, RetrievalParams(mode="hybrid", fusion="score", bm25_weight=0.3, dense_weight=0.7))


def test_longest_backed_path_becomes_a_question(small_kb: HybridRetriever) -> None:
    graph = EntityGraph.from_kb(small_kb.kb, default_extractor())
    made = synthesize(graph, n=3, min_hops=3)
    assert made, "no path of three hops"
    best = max(made, key=lambda q: len(q.hops))
    assert [h.target for h in best.hops][-1] == best.answer
    assert len(best.hops) >= 4
    from_alport = graph.longest_path("alport syndrome", 6, hub_max=150, branch=6)
    assert [h.target for h in from_alport][:4] == ["chronic kidney disease", "renal anemia", "iron deficiency",
                                                   "coeliac disease"]
    chunk_text = {c.chunk_id: c.text.lower() for c in small_kb.kb.reader().iter_chunks()}
    for hop in best.hops:  # every hop is stated by its chunk
        named = hop.target if hop.forward else hop.source
        assert named.split()[0] in chunk_text[hop.chunk_id]
    assert len({h.chunk_id for h in best.hops}) == len(best.hops)
    record = best.to_json()
    assert record["masked_trajectory"][0] == ["[MASK]", best.hops[0].relation, "[MASK]"]
    assert record["question"].startswith(f"Start from {best.hops[0].source}.") and best.answer not in \
        record["question"]
    coverage = chain_coverage(made, small_kb, k=10)
    assert coverage.questions == len(made) and 0 <= coverage.whole_chain_found <= 1
    assert sum(coverage.hops.values()) == len(made)


def test_hubs_never_sit_inside_a_path(small_kb: HybridRetriever) -> None:
    graph = EntityGraph.from_kb(small_kb.kb, default_extractor())
    busy = max(graph.frequency, key=lambda n: graph.frequency[n])
    path = graph.longest_path("alport syndrome", 6, hub_max=graph.frequency[busy] - 1, branch=6)
    assert busy not in [h.target for h in path]


def test_cli_writes_questions_and_measures(small_kb: HybridRetriever, tmp_path: Path) -> None:
    out = tmp_path / "q.jsonl"
    done = CliRunner().invoke(app, ["synth", "questions", "--kb", str(small_kb.kb.root), "--n", "2",
                                    "--min-hops", "3", "--out", str(out), "--measure"])
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows and all(r["hops"] >= 3 and len(r["chunk_chain"]) == r["hops"] for r in rows)
    assert "whole_chain_in_top_k" in done.stdout
