"""ebmrag: evidence-graded retrieval and context packing for medical LLMs."""

from ebmrag.errors import ConfigError, EbmragError, RecordError

__all__ = ["ConfigError", "EbmragError", "RecordError"]
__version__ = "0.1.0"
