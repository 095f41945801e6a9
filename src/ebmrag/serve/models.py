"""Request bodies of the service, validated by pydantic (FastAPI turns a violation into a 422 problem)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ebmrag.packing.types import MAX_WINDOW

MAX_TEXT = 4000  # characters of a question or query, on every transport (HTTP, MCP)


def bounded_text(name: str, text: str) -> str:
    """A question or query as every transport accepts it: not empty, at most MAX_TEXT characters."""
    if not text.strip():
        raise ValueError(f"{name} is empty")
    if len(text) > MAX_TEXT:
        raise ValueError(f"{name} is longer than {MAX_TEXT:,} characters ({len(text):,})")
    return text


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not a silent default


class AskBody(_Body):
    question: str = Field(min_length=1, max_length=MAX_TEXT)
    window: int | None = Field(default=None, ge=1, le=MAX_WINDOW)
    retrieval: Literal["auto", "always", "never"] | None = None
    wait_ms: int = Field(default=0, ge=0, le=600_000)  # wait this long for announced results before packing


class PackBody(_Body):
    query: str = Field(min_length=1, max_length=MAX_TEXT)
    window: int = Field(ge=1, le=MAX_WINDOW)
    strategy: str | None = None


_PRINTABLE_ID = r"^[^\x00-\x1f\x7f]+$"  # an id with a line break or a NUL could be stored but never named again


class UploadedDocument(_Body):
    doc_id: str = Field(min_length=1, max_length=300, pattern=_PRINTABLE_ID)
    text: str = Field(min_length=1)
    title: str = ""
    source: str = Field(default="upload", pattern=_PRINTABLE_ID)
    date: str = ""
    authority: Literal["guideline", "systematic_review", "trial", "textbook", "other"] = "other"


class UploadBody(_Body):
    documents: list[UploadedDocument] = Field(min_length=1, max_length=5000)


class SearchBody(_Body):
    query: str = Field(min_length=1, max_length=MAX_TEXT)
    k: int = Field(default=10, ge=1, le=200)
    mode: Literal["bm25", "dense", "hybrid"] | None = None
