"""`ebmrag eval ...` through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from ebmrag.cli import app

ABSTRACTS = {
    "101": ("Does early oral vancomycin shorten recurrent colitis?",
            "Oral vancomycin given early cut recurrence of clostridial colitis in older inpatients."),
    "102": ("Is serum lactate a guide to resuscitation in septic shock?",
            "Falling lactate during fluid resuscitation tracked survival in septic shock."),
    "103": ("Do statins lower stroke risk after a transient ischaemic attack?",
            "Statin therapy after a transient ischaemic attack lowered the rate of later stroke."),
}


def mini_pubmedqa(tmp_path: Path, extra_config: str = "") -> tuple[Path, Path, Path]:
    """Three PubMedQA-shaped questions, their abstracts as a corpus file, and a config with a private cache."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "ori_pqal_mini.json").write_text(json.dumps({k: {"QUESTION": q} for k, (q, _) in ABSTRACTS.items()}))
    corpus = tmp_path / "abstracts.jsonl"
    corpus.write_text("".join(json.dumps({"pmid": k, "contexts": [text], "labels": ["RESULTS"]}) + "\n"
                              for k, (_, text) in ABSTRACTS.items()))
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{tmp_path / "cache"}"\n{extra_config}')
    return data, corpus, config


def test_eval_retrieval_json_is_alone_on_stdout(tmp_path: Path) -> None:
    """Building the KB prints an ingest report; with --json it goes to stderr and stdout stays pure JSON."""
    data, corpus, config = mini_pubmedqa(tmp_path)
    result = CliRunner().invoke(app, ["eval", "retrieval", "--dataset", "pubmedqa", "--data-dir", str(data),
                                      "--kb", str(tmp_path / "kb"), "--corpus", str(corpus), "--json",
                                      "--config", str(config)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["modes"]["hybrid"]["ndcg@10"] > 0.9
    assert "generation" in result.stderr, "the ingest report still reaches the user, on stderr"


def test_eval_retrieval_scores_the_model_rewrite_when_configured(tmp_path: Path) -> None:
    """`[retrieval] query_variants` with a model adds "hybrid+rewrite" (the fake server rewords every question)."""
    from tests.fake_openai import FakeOpenAI, serve

    data, corpus, config = mini_pubmedqa(tmp_path, "[retrieval]\nquery_variants = 1\n")
    with serve(FakeOpenAI(default=("text", '{"queries": ["a reworded question"]}'))) as url:
        result = CliRunner().invoke(app, ["eval", "retrieval", "--dataset", "pubmedqa", "--data-dir", str(data),
                                          "--kb", str(tmp_path / "kb"), "--corpus", str(corpus), "--json",
                                          "--config", str(config), "--llm", "openai", "--base-url", url,
                                          "--model", "m"])
    assert result.exit_code == 0, result.output
    modes = json.loads(result.stdout)["modes"]
    assert set(modes) == {"bm25", "dense", "hybrid", "hybrid+rewrite"} and modes["hybrid+rewrite"]["ndcg@10"] > 0.5
    offline = CliRunner().invoke(app, ["eval", "retrieval", "--dataset", "pubmedqa", "--data-dir", str(data),
                                       "--kb", str(tmp_path / "kb"), "--config", str(config)])
    assert offline.exit_code == 2 and "need a model" in offline.output
