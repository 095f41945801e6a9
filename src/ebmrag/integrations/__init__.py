"""Drop-ins for the frameworks teams already use: EBM-Pack behind LlamaIndex's, LangChain's and Haystack's own
interfaces (one module each, each behind its pip extra), over one framework-neutral core (`core`)."""

from ebmrag.integrations.core import EvidencePacker, Passage, Placed, Selection

__all__ = ["EvidencePacker", "Passage", "Placed", "Selection"]
