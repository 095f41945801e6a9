"""The optional LLM relevance filter (ICA-RAG): keep a retrieved document only when a
model, shown the patient's key findings, judges it useful for the differential diagnosis.

The reply must be {"status": true|false}. A malformed reply is asked again once; if it is still
malformed, or the model cannot be reached, the document is kept (losing evidence silently is worse
than keeping a weak document) and the fault is recorded for the trace. The prompt is the `relevance_filter` step of
llm/prompts/steps/{en,zh}.toml, in the question's language unless the caller names one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, StrictBool

from ebmrag.generate.injection import neutralise
from ebmrag.llm.completion import complete_json
from ebmrag.llm.prompts import step_prompt
from ebmrag.protocols import ChatClient
from ebmrag.retrieve.vote import DocumentHit
from ebmrag.text.language import prompt_language


@dataclass(frozen=True)
class RelevanceVerdict:
    doc_id: str
    keep: bool
    status: bool | None  # the model's verdict; None when it gave none
    fault: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"doc_id": self.doc_id, "keep": self.keep, "status": self.status, "fault": self.fault}


class RelevanceReply(BaseModel):
    status: StrictBool


class RelevanceFilter:
    """Pipeline step: documents -> the ones the model calls relevant, with a verdict per document."""

    def __init__(self, client: ChatClient, max_chars: int = 3000, max_tokens: int = 20) -> None:
        if max_chars < 100 or max_tokens < 5:
            raise ValueError(f"max_chars must be >= 100 and max_tokens >= 5, got {max_chars}, {max_tokens}")
        self.client, self.max_chars, self.max_tokens = client, max_chars, max_tokens

    def run(self, question: str, findings: Sequence[str], documents: Sequence[DocumentHit],
            language: str | None = None) -> tuple[list[DocumentHit], list[RelevanceVerdict]]:
        """`language` picks the prompt (en, zh); without it, the question's own."""
        language = language or prompt_language(question)
        verdicts = [self._judge(question, findings, document, language) for document in documents]
        return [d for d, v in zip(documents, verdicts, strict=True) if v.keep], verdicts

    def _judge(self, question: str, findings: Sequence[str], document: DocumentHit,
               language: str) -> RelevanceVerdict:
        text = neutralise("\n".join(chunk.text for chunk in document.chunks)[: self.max_chars])[0]
        shown = [neutralise(f)[0] for f in findings]  # record and corpus text: data, never instructions
        prompt = step_prompt("relevance_filter", language)
        listed = "\n".join(f"- {f}" for f in shown) or prompt.render("no_findings")
        done = complete_json(self.client, prompt.messages(findings=listed, question=question, document=text),
                             RelevanceReply, max_tokens=self.max_tokens, retry_hint=prompt.render("retry_hint"))
        if done.value is not None:
            return RelevanceVerdict(document.doc_id, done.value.status, done.value.status)
        if done.status == "failed":
            return RelevanceVerdict(document.doc_id, True, None, f"kept: the model failed ({done.error})")
        return RelevanceVerdict(document.doc_id, True, None, f"kept: malformed reply twice ({done.error})")

    def to_dict(self) -> dict[str, Any]:
        return {"max_chars": self.max_chars, "max_tokens": self.max_tokens}
