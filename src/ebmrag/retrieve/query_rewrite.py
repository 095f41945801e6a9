"""Query-side retrieval help from a model: query expansion and HyDE.

- `QueryExpander`: N rewordings of the question (synonyms, the clinical term for a lay one, the condition a drug
  treats) that the retriever runs beside the question (`HybridRetriever.run(variants=...)`).
- `HypotheticalAnswer` (HyDE): a short passage written as if it answered the question; the retriever searches the
  dense route with the mean of its vector and the question's, because a passage looks more like the knowledge
  base's chunks than a question does.
Both are typed JSON steps (`llm.completion`): one retry with the problem fed back, and a failure becomes a
recorded fault with the plain question searched, never an exception. Replies are cached by the client like every
model reply, so the same question costs no second call. Neither runs without a model; neither is on by default
(`[retrieval] expansion`, `hyde`); on LiveQA-Med they were not measured here (no model on this machine).
The prompts are the `query_rewrite` step of llm/prompts/steps/{en,zh}.toml, in the language the caller names
(English by default: the caller knows the question's language, this layer does not detect it).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

from ebmrag.llm.completion import Completion, T, complete_json
from ebmrag.llm.prompts import step_prompt
from ebmrag.protocols import ChatClient


class Variants(BaseModel):
    queries: list[str] = Field(description="rewordings of the question, most useful first")


class Passage(BaseModel):
    passage: str = Field(min_length=1)


def _ask(client: ChatClient, template: str, language: str, schema: type[T], max_tokens: int,
         **values: object) -> Completion[T]:
    messages = step_prompt("query_rewrite", language).messages(template, **values)
    return complete_json(client, messages, schema, max_tokens=max_tokens)


@dataclass(frozen=True)
class Rewrite:
    """What a step produced for one question, and its fault ('' when it worked) for the trace."""

    variants: tuple[str, ...] = ()
    hypothesis: str = ""
    fault: str = ""


class QueryExpander:
    def __init__(self, client: ChatClient, n: int = 3) -> None:
        if not 1 <= n <= 8:
            raise ValueError(f"the number of query variants must be 1 to 8, got {n}")
        self.client, self.n = client, n

    def run(self, question: str, language: str = "en") -> Rewrite:
        reply = _ask(self.client, "expansion", language, Variants, 300, question=question, n=self.n)
        if reply.value is None:
            return Rewrite(fault=f"query expansion failed: {reply.error}")
        kept = [q.strip() for q in reply.value.queries if q.strip() and q.strip() != question.strip()]
        return Rewrite(variants=tuple(dict.fromkeys(kept))[: self.n])


class HypotheticalAnswer:
    def __init__(self, client: ChatClient, max_tokens: int = 300) -> None:
        if max_tokens < 32:
            raise ValueError(f"max_tokens must be >= 32, got {max_tokens}")
        self.client, self.max_tokens = client, max_tokens

    def run(self, question: str, language: str = "en") -> Rewrite:
        reply = _ask(self.client, "hyde", language, Passage, self.max_tokens, question=question)
        if reply.value is None:
            return Rewrite(fault=f"HyDE failed: {reply.error}")
        return Rewrite(hypothesis=reply.value.passage.strip())


class QueryRewriter:
    """Both steps for one question, as `[retrieval] query_variants` and `hyde` ask; faults joined for the trace."""

    def __init__(self, client: ChatClient, variants: int = 0, hyde: bool = False) -> None:
        if variants < 0 or (not variants and not hyde):
            raise ValueError("a query rewriter needs query_variants >= 1 or hyde = true")
        self.client, self.variants, self.hyde = client, variants, hyde
        self.expander = QueryExpander(client, variants) if variants else None
        self.hypothesis = HypotheticalAnswer(client) if hyde else None

    def run(self, question: str, language: str = "en") -> Rewrite:
        """`language` (en, zh): the question's, which picks the prompts."""
        expanded = self.expander.run(question, language) if self.expander else Rewrite()
        imagined = self.hypothesis.run(question, language) if self.hypothesis else Rewrite()
        fault = "; ".join(f for f in (expanded.fault, imagined.fault) if f)
        return Rewrite(expanded.variants, imagined.hypothesis, fault)

    def to_dict(self) -> dict[str, int | bool]:
        return {"variants": self.variants, "hyde": self.hyde}
