"""The contracts every stage shares, at the bottom of the import graph (see ARCHITECTURE.md).

Protocols, not base classes: a user plugs in their own embedder, tokenizer or chat endpoint by
shape, and the modules that consume them never import the concrete implementations
(`models.embeddings.SentenceEmbedder`, `models.tokens`, `llm.openai.OpenAIChatClient`).
The chat message and reply types live here because they are the ChatClient contract's vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]

# progress(stage, done, total): long work reports to the CLI's progress bars (or to a test) through this.
Progress = Callable[[str, int, int], None]


def no_progress(stage: str, done: int, total: int) -> None:
    """The default `Progress`: report nothing."""


class WorkCancelled(BaseException):
    """Raised at a `checkpoint()` when nobody wants the work any more (its request timed out or went away).

    A BaseException, like asyncio.CancelledError, so that an `except Exception` fallback on the way (a model
    stage, a detector) cannot swallow it and carry on with work whose answer nobody will read."""


CHECK_EVERY = 128  # items of a long loop (fragments, decisions) between two checkpoints

_CHECKPOINT: ContextVar[Callable[[], None] | None] = ContextVar("ebmrag_checkpoint", default=None)


def checkpoint() -> None:
    """Long loops call this between batches (embedding a chart, tiering, compressing, packing). The host that
    runs the work (the service's scheduler) may stop it here (`WorkCancelled`) or let another request run first;
    without a host it does nothing, at the cost of one context-variable read."""
    hook = _CHECKPOINT.get()
    if hook is not None:
        hook()


@contextmanager
def checkpoints(hook: Callable[[], None]) -> Iterator[None]:
    """Call `hook` at every `checkpoint()` reached by the body (this thread's context only)."""
    token = _CHECKPOINT.set(hook)
    try:
        yield
    finally:
        _CHECKPOINT.reset(token)


class TextClassifier(Protocol):
    """A saved classifier of short texts (the tier model): (label, probability) per text."""

    path: Path
    labels: list[str]

    def predict(self, texts: Sequence[str]) -> list[tuple[str, float]]: ...


class Embedder(Protocol):
    """Texts -> one L2-normalized row per text (cosine similarity is a dot product)."""

    def embed(self, texts: Sequence[str]) -> Vectors: ...


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens the way the answering model will, so a window means the same thing on both sides."""

    name: str

    def count(self, text: str) -> int: ...

    def count_many(self, texts: Sequence[str]) -> list[int]: ...


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str

    def to_json(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class LLMReply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool
    model: str


class ChatClient(Protocol):
    """One chat completion; raises `errors.LLMError` when no usable reply comes back."""

    def complete(self, messages: list[ChatMessage], temperature: float = 0.0, max_tokens: int = 512) -> LLMReply: ...


@runtime_checkable
class SchemaChatClient(Protocol):
    """A client that can hold its reply to a JSON schema while it decodes (a grammar): a small local model then
    cannot break the format. `llm.completion.complete_json` uses it when the client offers it."""

    def complete_schema(self, messages: list[ChatMessage], schema: dict[str, Any], temperature: float = 0.0,
                        max_tokens: int = 512) -> LLMReply: ...


@dataclass(frozen=True)
class ToolCall:
    """One function call the model asked for; `arguments` is the raw JSON text, parsed (and judged) by the caller."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolReply:
    text: str  # the model's visible content: its thought, or the final answer when it calls no tool
    tool_calls: tuple[ToolCall, ...]
    prompt_tokens: int
    completion_tokens: int
    cached: bool
    model: str


class ToolChatClient(Protocol):
    """Chat with OpenAI-style tool calling. `messages` are raw chat messages (assistant turns may carry
    `tool_calls`, tool turns a `tool_call_id`); raises `errors.LLMError` when no usable reply comes back."""

    def complete_tools(self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
                       temperature: float = 0.0, max_tokens: int = 512) -> ToolReply: ...

    def complete(self, messages: list[ChatMessage], temperature: float = 0.0, max_tokens: int = 512) -> LLMReply: ...
