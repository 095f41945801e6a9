"""Upgrading: a knowledge base written by an older ebmrag is refused by `ask` in one line naming the command that
converts it, `kb compact` converts it (no re-embedding), and `ask` then answers from it; one of a newer format, or
with no format recorded, is refused in one line before any model loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.index.reader import FORMAT_VERSION

pytestmark = pytest.mark.model
runner = CliRunner()
QUESTION = "Which antibiotic is safe for his wound infection, given his allergy?"


def as_format_1(kb: Path, old: Path) -> None:
    """`kb` (one segment) rewritten in the first on-disk format: the index files in the generation folder."""
    manifest = json.loads((kb / "gen-000001" / "manifest.json").read_text())
    segment = kb / "segments" / manifest["segments"][0]["name"]
    (old / "gen-000001").mkdir(parents=True)
    for name in ("kb.sqlite", "vectors.npy", "dense.hnsw"):
        if (segment / name).exists():
            shutil.copy2(segment / name, old / "gen-000001" / name)
    manifest.update(format=1)
    del manifest["segments"]
    (old / "gen-000001" / "manifest.json").write_text(json.dumps(manifest))
    (old / "CURRENT").write_text("gen-000001")


def rewritten(kb: Path, target: Path, **changes: object) -> Path:
    shutil.copytree(kb, target)
    manifest = target / "gen-000001" / "manifest.json"
    data = json.loads(manifest.read_text())
    data.update(changes)
    if changes.get("format") is None:
        del data["format"]
    manifest.write_text(json.dumps(data))
    return target


def one_line_error(result: object, says: str) -> None:
    output = result.output  # type: ignore[attr-defined]
    assert result.exit_code == 2, output  # type: ignore[attr-defined]
    assert says in output and "Traceback" not in output and len(output.strip().splitlines()) == 1, output


@pytest.mark.slow
def test_an_older_kb_is_refused_then_converted_and_answers(tmp_path: Path) -> None:
    config = tmp_path / "ebmrag.toml"
    config.write_text(f'[models]\ncache_dir = "{tmp_path / "cache"}"\n')
    corpus = tmp_path / "guides.jsonl"
    corpus.write_text(json.dumps({"id": "local-ssi", "title": "Local protocol: wound infection after colectomy",
                                  "text": "After a penicillin anaphylaxis, treat a wound infection after colectomy "
                                          "with vancomycin; avoid all penicillins and cephalosporins."}) + "\n")
    kb, old = tmp_path / "kb", tmp_path / "old"
    assert runner.invoke(app, ["ingest", str(corpus), "--kb", str(kb), "--config", str(config)]).exit_code == 0
    as_format_1(kb, old)
    ask = ["ask", QUESTION, "--patient", "demo-colon", "--retrieval", "always", "--json", "--config", str(config)]

    one_line_error(runner.invoke(app, [*ask, "--kb", str(old)]), f"convert it once with `ebmrag kb compact --kb {old}`")
    converted = runner.invoke(app, ["kb", "compact", "--kb", str(old), "--config", str(config)])
    assert converted.exit_code == 0 and "1 chunks in one segment" in converted.output, converted.output
    live = old / (old / "CURRENT").read_text().strip()
    assert json.loads((live / "manifest.json").read_text())["format"] == FORMAT_VERSION
    answered = runner.invoke(app, [*ask, "--kb", str(old)])
    assert answered.exit_code == 0, answered.output
    assert [d["doc_id"] for d in json.loads(answered.output)["trace"]["retrieved"]] == ["local-ssi"]

    newer = rewritten(kb, tmp_path / "newer", format=FORMAT_VERSION + 1)
    one_line_error(runner.invoke(app, [*ask, "--kb", str(newer)]), "written by a newer ebmrag")
    assert "upgrade ebmrag" in runner.invoke(app, [*ask, "--kb", str(newer)]).output
    unversioned = rewritten(kb, tmp_path / "unversioned", format=None)
    one_line_error(runner.invoke(app, [*ask, "--kb", str(unversioned)]), "records no on-disk format")
    one_line_error(runner.invoke(app, [*ask, "--kb", str(tmp_path / "nowhere")]),
                   f"holds no knowledge base yet; create it with `ebmrag ingest FILES --kb {tmp_path / 'nowhere'}`")
