from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebmrag.ingest.chunking import (
    ChunkerBySource,
    FixedChunker,
    RecursiveChunker,
    SentenceChunker,
    StructureChunker,
    word_count,
)
from ebmrag.ingest.corpora import recognise_record
from ebmrag.ingest.documents import Document, DocumentBuilder
from ebmrag.models.tokens import HuggingFaceTokenCounter

COUNTER = HuggingFaceTokenCounter()


@pytest.fixture(scope="module")
def medquad_docs(shared_data: Path) -> list[Document]:
    docs = []
    with (shared_data / "medquad" / "medquad_docs.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            docs.append(recognise_record(json.loads(line), "medquad"))
            if len(docs) == 120:
                break
    return [d for d in docs if d]


def long_document() -> Document:
    builder = DocumentBuilder()
    sentence = "Serum creatinine rose to 2.8 mg/dL after contrast exposure in the elderly patient. "
    builder.add("History", sentence * 40, "s1")
    builder.add("Labs", "Potassium 5.9 mmol/L. " * 5, "s2")
    builder.add("Plan", ("Hold metformin and repeat the panel in 48 hours. " * 30), "s3")
    return Document("doc", builder.text, "test", "txt", sections=builder.sections)


ALL = [FixedChunker(COUNTER, 64, 8), RecursiveChunker(COUNTER, 64, 8), StructureChunker(COUNTER, 64, 8),
       SentenceChunker(target_words=40)]


@pytest.mark.parametrize("chunker", ALL, ids=lambda c: c.name)
def test_offsets_quote_the_document_exactly(chunker) -> None:  # type: ignore[no-untyped-def]
    doc = long_document()
    chunks = chunker.chunk(doc)
    assert len(chunks) > 3
    assert [c.position for c in chunks] == list(range(len(chunks)))
    assert all(doc.text[c.char_start:c.char_end] == c.text for c in chunks)
    assert all(c.chunk_id == f"doc#{c.position}" for c in chunks)
    covered = set().union(*(range(c.char_start, c.char_end) for c in chunks))
    assert all(i in covered for i, ch in enumerate(doc.text) if not ch.isspace())  # nothing is lost


@pytest.mark.parametrize("chunker", ALL[:3], ids=lambda c: c.name)
def test_token_chunkers_respect_the_size(chunker) -> None:  # type: ignore[no-untyped-def]
    assert max(COUNTER.count(c.text) for c in chunker.chunk(long_document())) <= 64


@pytest.mark.parametrize("chunker", [StructureChunker(COUNTER, 64, 8), SentenceChunker(target_words=40)],
                         ids=lambda c: c.name)
def test_section_bounded_chunkers_never_cross_a_section(chunker) -> None:  # type: ignore[no-untyped-def]
    doc = long_document()
    for chunk in chunker.chunk(doc):
        section = doc.section_at(chunk.char_start)
        assert section is not None and chunk.char_end <= section.end
        assert chunk.section_id == section.section_id


def test_fixed_chunks_overlap_by_the_given_tokens() -> None:
    chunks = FixedChunker(COUNTER, 64, 16).chunk(long_document())
    first, second = chunks[0], chunks[1]
    assert second.char_start < first.char_end
    assert COUNTER.count(first.text[second.char_start - first.char_start:]) == pytest.approx(16, abs=2)


def test_sentence_chunks_end_at_sentences_and_merge_a_short_tail() -> None:
    chunks = SentenceChunker(target_words=40, overlap_share=0.15, min_tail_share=0.3).chunk(long_document())
    history = [c for c in chunks if c.section == "History"]
    assert all(c.text.endswith(".") for c in chunks)
    assert all(word_count(c.text) <= 40 for c in history[:-1])
    assert word_count(history[-1].text) >= 0.3 * 40  # the short remainder joined the chunk before it
    labs = [c for c in chunks if c.section == "Labs"]
    assert len(labs) == 1  # a short section is one chunk, not merged into a neighbour section


@pytest.mark.data
def test_medquad_chunks_keep_answer_ids(medquad_docs: list[Document]) -> None:
    chooser = ChunkerBySource(COUNTER)
    for doc in medquad_docs:
        chunks = chooser.chunk(doc)
        assert {c.section_id for c in chunks} == {s.section_id for s in doc.sections}
        assert all(doc.text[c.char_start:c.char_end] == c.text for c in chunks)
        assert all(word_count(c.text) <= 200 * 1.3 + 1 for c in chunks)
