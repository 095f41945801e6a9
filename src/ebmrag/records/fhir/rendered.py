"""What a renderer returns: the fragments a resource yields, or why it yields none; and status codes read
whatever shape the chart gave them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ebmrag.records.fhir.coding import concepts, obj, objects


@dataclass(frozen=True)
class Rendered:
    section: str
    text: str
    id_suffix: str = ""  # "#allergies" for one section of a note
    timestamp: str | None = None  # overrides the resource's default time keys


@dataclass(frozen=True)
class Skip:
    reason: str  # "refuted or entered in error", ... (counted per resource type in the trace)


def status_code(concept: Any) -> str:
    """A status's code; DSTU2/STU3 exports write statuses as bare strings ("active"), R4 as CodeableConcepts."""
    if isinstance(concept, str):
        return concept
    return next((str(c.get("code")) for c in objects(obj(concept).get("coding")) if c.get("code")), "")


def codes_of(items: Any) -> list[str]:
    return [str(c.get("code")) for concept in concepts(items) for c in objects(concept.get("coding")) if c.get("code")]
