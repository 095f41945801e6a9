"""Shapes of public medical corpora in JSONL, recognised per line so that no mapping is needed.

- MedQuAD documents (`doc_key`, `qa`): one document per disease/topic, one section per answer; the
  section id is the answer id (`CancerGov_0000001_1_Sec1`) that LiveQA-Med relevance judgements use.
  The questions are not indexed: MedQuAD's own evaluation asks them.
- LiveQA-Med judged answers (`answer_id`, `text`): one document and one section per answer.
- PubMedQA abstracts (`pmid`, `contexts`): one document per abstract, sections by label.
"""

from __future__ import annotations

import re
from typing import Any

from ebmrag.errors import IngestError
from ebmrag.ingest.documents import Document, DocumentBuilder

_JUDGED = re.compile(r"^Question:\s*(?P<question>.*?)\s*\nURL:\s*(?P<url>\S*)\s*\nAnswer:\s*(?P<answer>.*)\Z", re.S)


def recognise_record(record: dict[str, Any], source: str) -> Document | None:
    """A Document when the record has a known corpus shape, else None (the caller applies a FieldMap)."""
    if "doc_key" in record and isinstance(record.get("qa"), list):
        return medquad_document(record, source)
    if set(record) == {"answer_id", "text"}:
        return judged_answer_document(record, source)
    if "pmid" in record and isinstance(record.get("contexts"), list):
        return pubmed_document(record, source)
    return None


def _build(builder: DocumentBuilder, doc_id: str, source: str) -> DocumentBuilder:
    if not builder.text:
        raise IngestError(f"{source}#{doc_id}", "record has no text")
    return builder


def medquad_document(record: dict[str, Any], source: str) -> Document:
    doc_id = str(record["doc_key"])
    builder = DocumentBuilder()
    for qa in record["qa"]:
        builder.add(str(qa.get("qtype", "")), str(qa.get("answer", "")), str(qa.get("answer_id", "")))
    _build(builder, doc_id, source)
    return Document(
        doc_id, builder.text, f"MedQuAD/{record.get('source', '')}", "medquad", title=str(record.get("focus", "")),
        sections=builder.sections, authority="textbook",
        metadata={"url": str(record.get("url", "")), "category": str(record.get("category") or "")},
    )


def judged_answer_document(record: dict[str, Any], source: str) -> Document:
    answer_id = str(record["answer_id"])
    text = str(record["text"])
    match = _JUDGED.match(text.strip())
    question, url, answer = (match["question"], match["url"], match["answer"]) if match else ("", "", text)
    builder = DocumentBuilder()
    builder.add("answer", answer, answer_id)
    _build(builder, answer_id, source)
    title = re.sub(r"\s*\(Also called:.*\)\s*$", "", question)
    return Document(answer_id, builder.text, "LiveQA-Med/judged", "judged_answer", title=title,
                    sections=builder.sections, authority="textbook", metadata={"url": url})


def pubmed_document(record: dict[str, Any], source: str) -> Document:
    doc_id = str(record["pmid"])
    labels = record.get("labels") or []
    builder = DocumentBuilder()
    for index, context in enumerate(record["contexts"]):
        label = str(labels[index]) if index < len(labels) else ""
        builder.add(label.title(), str(context), f"{doc_id}:{index}")
    _build(builder, doc_id, source)
    return Document(doc_id, builder.text, "PubMed", "pubmed_abstract", sections=builder.sections,
                    date=str(record.get("year") or ""), authority="other",
                    metadata={"meshes": "; ".join(map(str, record.get("meshes") or []))})
