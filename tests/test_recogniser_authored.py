"""bench/recogniser_authored.py: authored examples whose spans are exact, in both languages, with positives and
negatives for every kind, the same for the same seed, and critical only where a value is beyond a critical limit."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.bench_scripts import load_script

TRAIN_KEYS = ["id", "text", "lang", "kinds", "spans", "source", "licence", "label_quality", "weight", "span_types",
              "note", "train_allowed"]  # the keys of build/recogniser_data/train.jsonl


@pytest.fixture(scope="module")
def authored() -> ModuleType:
    return load_script("recogniser_authored")


@pytest.fixture(scope="module")
def records(authored: ModuleType) -> list[dict[str, Any]]:
    return list(authored.generate(20, seed=3))


def test_spans_match_their_text(records: list[dict[str, Any]], authored: ModuleType) -> None:
    for record in records:
        assert list(record) == TRAIN_KEYS
        assert record["source"] == "authored" and record["label_quality"] == "authored" and record["train_allowed"]
        for span in record["spans"]:
            piece = record["text"][span["start"]:span["end"]]
            assert piece and piece == piece.strip() and span["type"] in authored.SPAN_TYPES, (record["text"], span)


def test_every_kind_has_positives_and_negatives_in_both_languages(records: list[dict[str, Any]]) -> None:
    counts = Counter((r["id"].split(":")[1], r["lang"], bool(r["kinds"])) for r in records)
    for kind in ("allergy", "adr", "pathology", "genetic", "critical_result"):
        for lang in ("en", "zh"):
            assert counts[(kind, lang, True)] == 10 and counts[(kind, lang, False)] == 10, (kind, lang)
    assert all(r["kinds"] in ([], [r["id"].split(":")[1]]) for r in records)
    assert len({r["text"] for r in records}) == len(records)


def test_the_same_seed_gives_the_same_output(authored: ModuleType, records: list[dict[str, Any]]) -> None:
    assert json.dumps(authored.generate(20, seed=3), ensure_ascii=False) == json.dumps(records, ensure_ascii=False)
    assert authored.generate(20, seed=4) != records


def test_critical_only_beyond_a_limit(records: list[dict[str, Any]]) -> None:
    """Where the rule reader reads every value, it agrees with the label: critical in positives, never in the
    negatives that state results (a threshold, "call if K > 6.0", is a negative the rule reader flags)."""
    from ebmrag.evidence.results import result_mentions

    for record in records:
        if not record["id"].startswith("authored:critical_result") or record["note"].endswith("threshold"):
            continue
        mentions = result_mentions(record["text"])
        values = sum(s["type"] == "VALUE" for s in record["spans"])
        if len(mentions) == values:
            assert any(m.critical for m in mentions) == bool(record["kinds"]), record["text"]


def test_main_writes_jsonl(authored: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "authored.jsonl"
    authored.main(["--out", str(out), "--per-kind", "4", "--seed", "7"])
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 5 * 2 * 4 and {r["lang"] for r in lines} == {"en", "zh"}
