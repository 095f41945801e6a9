"""Haystack drop-in (`pip install 'ebmrag[haystack]'`): EBM-Pack as a pipeline component.

    pipeline.add_component("retriever", InMemoryBM25Retriever(store, top_k=10))
    pipeline.add_component("pack", EbmPack(budget=600, record="patient.json"))
    pipeline.connect("retriever.documents", "pack.documents")
    pipeline.run({"retriever": {"query": q}, "pack": {"query": q}})

`documents` comes back in context order: the patient's fragments EBM-Pack keeps (new `Document`s, id
`patient:<fragment id>`) and the retrieved documents it keeps, each with `ebmrag_kind`, `ebmrag_tier`,
`ebmrag_state` and `ebmrag_reason` in `meta`; `dropped` lists every left-out fragment or document with its reason.
The record is a file path or a bundled demo name, so the component serialises with the pipeline
(`to_dict` / `from_dict`); `run(record=...)` packs another patient for one call.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ebmrag.errors import require_extra

require_extra("haystack", "haystack", "the Haystack drop-in")

from haystack import Document, component, default_from_dict, default_to_dict  # noqa: E402

from ebmrag.config import load_settings  # noqa: E402
from ebmrag.integrations.core import PATIENT, EvidencePacker, Passage, Placed, resolve_record  # noqa: E402
from ebmrag.packing.types import validate_window  # noqa: E402


@component
class EbmPack:
    """Keeps what EBM-Pack places within `budget` tokens: the record's critical facts first, then evidence."""

    def __init__(self, budget: int, record: str | None = None, config: str | None = None,
                 strategy: str | None = None, authority_key: str = "authority") -> None:
        validate_window(budget)
        if record is not None:
            resolve_record(record)  # a wrong path or a broken record fails here, not at the first query
        self.budget, self.record, self.config, self.strategy = budget, record, config, strategy
        self.authority_key = authority_key
        self._packer: EvidencePacker | None = None

    def warm_up(self) -> None:
        """Loads the embedding model (Haystack calls this before the pipeline's first run)."""
        if self._packer is None:
            self._packer = EvidencePacker(self.budget, self.record, load_settings(self.config),
                                          strategy=self.strategy)
        self._packer.warm_up()

    @component.output_types(documents=list[Document], dropped=list[dict[str, str]])
    def run(self, query: str, documents: list[Document], record: str | None = None) -> dict[str, Any]:
        self.warm_up()
        assert self._packer is not None
        keyed = {d.id: d for d in documents}
        passages = [Passage(d.id, d.content or "", str((d.meta or {}).get(self.authority_key, "")))
                    for d in documents]
        selection = self._packer.run(query, passages, record)
        return {"documents": [self._document(p, keyed) for p in selection.placed],
                "dropped": [asdict(left) for left in selection.dropped]}

    @staticmethod
    def _document(placed: Placed, keyed: dict[str, Document]) -> Document:
        meta = {"ebmrag_kind": placed.kind, "ebmrag_tier": placed.tier, "ebmrag_state": placed.state,
                "ebmrag_reason": placed.reason}
        if placed.kind == PATIENT:
            return Document(id=f"patient:{placed.id}", content=placed.text, meta=meta)
        original = keyed[placed.id]
        return Document(id=original.id, content=original.content, meta={**(original.meta or {}), **meta},
                        score=original.score)

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, budget=self.budget, record=self.record, config=self.config,
                               strategy=self.strategy, authority_key=self.authority_key)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EbmPack:
        return default_from_dict(cls, data)
