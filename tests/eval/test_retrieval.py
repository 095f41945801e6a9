from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ebmrag.eval.retrieval import (
    Query,
    evaluate_retrieval,
    liveqa_queries,
    load_queries,
    score_ranking,
    select_split,
    split_of,
)
from ebmrag.index.kb import KnowledgeBase
from ebmrag.index.sync import ingest_paths


def test_graded_ndcg_recall_and_mrr() -> None:
    gains = {"a": 3.0, "b": 1.0}
    scores = score_ranking(["x", "b", "a"], gains)
    dcg = 1.0 / math.log2(3) + 3.0 / math.log2(4)
    ideal = 3.0 + 1.0 / math.log2(3)
    assert scores.ndcg_at_10 == pytest.approx(dcg / ideal)
    assert (scores.recall_at_10, scores.mrr) == (1.0, 0.5)
    assert score_ranking(["x"] * 3, gains).ndcg_at_10 == 0.0


@pytest.mark.data
def test_liveqa_queries_use_the_consumer_text_and_graded_gains(shared_data: Path) -> None:
    queries = liveqa_queries(shared_data / "liveqa_med_2017")
    assert len(queries) == 62  # shared questions with at least one answer graded above "Incorrect"
    assert all(q.gains and min(q.gains.values()) >= 1 for q in queries)
    rows = [json.loads(line) for line in (shared_data / "liveqa_med_2017" / "test_questions_shared.jsonl").open()]
    message = {r["qid"]: r["message"] for r in rows}
    assert all(message[q.query_id] in q.text for q in queries)


@pytest.mark.slow
@pytest.mark.data
@pytest.mark.model
def test_pubmedqa_slice_end_to_end(shared_data: Path, tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    """30 questions and 50 distractors: embedding the abstracts is most of the time (60 and 100 took twice as long
    for the same ranking of the modes; issue 44)."""
    source = shared_data / "pubmedqa"
    questions = json.loads((source / "ori_pqal_shared.json").read_text(encoding="utf-8"))
    chosen = dict(list(questions.items())[:30])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "ori_pqal_slice.json").write_text(json.dumps(chosen), encoding="utf-8")
    corpus = tmp_path / "abstracts.jsonl"
    with (source / "pubmedqa_corpus_contexts.jsonl").open(encoding="utf-8") as handle:
        lines = list(handle)
    gold = [line for line in lines if json.loads(line)["pmid"] in chosen]
    distractors = [line for line in lines if json.loads(line)["pmid"] not in chosen][:50]
    corpus.write_text("".join(gold + distractors), encoding="utf-8")
    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    ingest_paths(kb, [corpus])
    queries = load_queries("pubmedqa", tmp_path / "data", [])
    assert len(queries) == 30 and all(q.gains == {q.query_id: 1.0} for q in queries)
    report = evaluate_retrieval(kb, "pubmedqa", queries, "score", (0.3, 0.7), ablation=True)
    for mode in ("bm25", "dense", "hybrid"):
        assert report.modes[mode].ndcg_at_10 > 0.85, mode
    assert report.modes["hybrid"].ndcg_at_10 >= max(report.modes["bm25"].ndcg_at_10,
                                                    report.modes["dense"].ndcg_at_10) - 0.02
    assert len(report.ablation) == 13
    assert set(report.to_json()["modes"]) == {"bm25", "dense", "hybrid"}  # type: ignore[arg-type]


def test_unknown_dataset_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_queries("trec", tmp_path, [])
    assert Query("q", "t", {"a": 1.0}).gains == {"a": 1.0}


def test_hash_split_is_fixed_disjoint_and_complete() -> None:
    queries = [Query(f"TQ{i}", "t", {"a": 1.0}) for i in range(200)]
    tune, check = select_split(queries, "tune"), select_split(queries, "check")
    assert {q.query_id for q in tune}.isdisjoint({q.query_id for q in check})
    assert len(tune) + len(check) == 200 and 70 < len(tune) < 130
    assert [q.query_id for q in select_split(queries, "tune")] == [q.query_id for q in tune]
    assert split_of("TQ1") == split_of("TQ1") and select_split(queries, "all") == queries
    with pytest.raises(ValueError, match="split must be one of"):
        select_split(queries, "train")
