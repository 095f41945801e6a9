from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app

runner = CliRunner()


@pytest.mark.slow
@pytest.mark.model
def test_ingest_search_stats_delete(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "allergy.md").write_text("# Penicillin allergy\n\nAnaphylaxis to penicillin: avoid all penicillins.\n")
    (docs / "kidney.md").write_text("# Acute kidney injury\n\nCreatinine rise of 0.3 mg/dL in 48 hours.\n")
    (docs / "broken.txt").write_bytes(b"\xff\xfe")
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{tmp_path / "cache"}"\n')
    kb = str(tmp_path / "kb")

    ingested = runner.invoke(app, ["ingest", str(docs), "--kb", kb, "--config", str(config)])
    assert ingested.exit_code == 0, ingested.output
    assert "not valid UTF-8" in ingested.output and "broken.txt" in ingested.output

    found = runner.invoke(app, ["search", "penicillin anaphylaxis", "--kb", kb, "--k", "2", "--json",
                                "--config", str(config)])
    hits = json.loads(found.output)
    assert [set(h) for h in hits] == [{"chunk_id", "doc_id", "score", "section", "text", "source"}] * 2
    assert hits[0]["doc_id"] == "docs/allergy.md" and hits[0]["score"] >= hits[1]["score"]

    voted = runner.invoke(app, ["search", "Anaphylaxis after penicillin. Creatinine rose in 48 hours.", "--kb", kb,
                                "--by-document", "--mode", "bm25", "--json", "--config", str(config)])
    documents = json.loads(voted.output)
    assert sorted(d["doc_id"] for d in documents) == ["docs/allergy.md", "docs/kidney.md"]
    assert all(d["votes"] == 1 and d["chunks"][0]["doc_id"] == d["doc_id"] for d in documents)
    no_model = runner.invoke(app, ["search", "x", "--kb", kb, "--rerank-model", str(tmp_path / "none")])
    assert no_model.exit_code == 2 and "not a local directory" in no_model.output

    stats = json.loads(runner.invoke(app, ["kb", "stats", "--kb", kb, "--json"]).output)
    assert (stats["documents"], stats["chunks"], stats["generation"]) == (2, 2, 1)

    removed = runner.invoke(app, ["delete", "docs/allergy.md", "--kb", kb, "--config", str(config)])
    assert removed.exit_code == 0, removed.output
    after = json.loads(runner.invoke(app, ["search", "penicillin", "--kb", kb, "--json", "--mode", "bm25"]).output)
    assert all(h["doc_id"] != "docs/allergy.md" for h in after)
    stats = json.loads(runner.invoke(app, ["kb", "stats", "--kb", kb, "--json"]).output)
    assert (stats["documents"], stats["chunks"], stats["segments"], stats["deleted_chunks"]) == (1, 1, 1, 1)
    compacted = runner.invoke(app, ["kb", "compact", "--kb", kb, "--config", str(config)])
    assert compacted.exit_code == 0 and "1 chunks in one segment" in compacted.output, compacted.output
    stats = json.loads(runner.invoke(app, ["kb", "stats", "--kb", kb, "--json"]).output)
    assert (stats["chunks"], stats["segments"], stats["deleted_chunks"], stats["generation"]) == (1, 1, 0, 3)


def test_search_on_a_missing_kb_is_one_clear_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["search", "anything", "--kb", str(tmp_path / "nowhere")])
    assert result.exit_code == 2
    assert "not a knowledge base yet" in result.output and "Traceback" not in result.output
    bad_mode = runner.invoke(app, ["search", "x", "--kb", str(tmp_path), "--mode", "fuzzy"])
    assert bad_mode.exit_code == 2 and "mode must be one of" in bad_mode.output


def test_a_missing_kb_extra_is_one_line_naming_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine where `pip install ebmrag` ran without [kb]: no traceback, the extra to install."""
    from ebmrag.index import analyzer

    monkeypatch.setitem(sys.modules, "Stemmer", None)  # makes `import Stemmer` (PyStemmer) raise ImportError
    analyzer._stemmer.cache_clear()  # an earlier test may have loaded it
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "note.md").write_text("# Gout\nColchicine eases an acute gout flare.\n")
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{tmp_path / "cache"}"\n')
    result = runner.invoke(app, ["ingest", str(docs), "--kb", str(tmp_path / "kb"), "--config", str(config)])
    assert result.exit_code == 2
    assert "needs the 'kb' extra" in result.output and "pip install 'ebmrag[kb]'" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "kb" / "CURRENT").exists(), "nothing half-built is left serving"


def test_zero_results_is_an_error_not_the_default(tmp_path: Path) -> None:
    result = runner.invoke(app, ["search", "x", "--kb", str(tmp_path / "kb"), "--k", "0"])
    assert result.exit_code == 2 and "k must be >= 1" in result.stderr


def test_small_defects_are_named(tmp_path: Path) -> None:
    """Issue 18.9: delete created a missing KB; a lone surrogate broke later without the file's name."""
    missing = tmp_path / "nowhere"
    result = runner.invoke(app, ["delete", "doc", "--kb", str(missing)])
    assert result.exit_code == 2 and "not a knowledge base yet" in result.stderr and not missing.exists()
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text('{"id": "a", "text": "Colchicine for gout \\ud800 flares."}\n{"id": "b", "text": "Fine."}\n')
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{tmp_path / "cache"}"\n')
    ingested = runner.invoke(app, ["ingest", str(corpus), "--kb", str(tmp_path / "kb"), "--config", str(config)])
    assert "bad.jsonl:1: contains an unpaired UTF-16 surrogate" in ingested.output
    assert "Traceback" not in ingested.output


def test_a_folder_given_as_a_record_is_named_a_folder(tmp_path: Path) -> None:
    result = runner.invoke(app, ["pack", str(tmp_path), "--query", "q"])
    assert result.exit_code == 2 and "is a folder" in result.stderr
