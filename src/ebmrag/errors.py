"""Error hierarchy: every error names the input at fault so a user can fix it without reading our code."""

import importlib
from types import ModuleType


class EbmragError(Exception):
    """Base class of every error ebmrag raises on purpose."""


class _LocatedError(EbmragError, ValueError):
    """An error about one place in the input (`where`), with the `problem` kept apart for reports."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        """Rebuilt from (where, problem) when it crosses a process boundary (a worker's read error)."""
        return type(self), (self.where, self.problem)


class RecordError(_LocatedError):
    """A patient record is malformed; the message names the file and the field."""


class ConfigError(EbmragError, ValueError):
    """A configuration value or rule file is invalid."""


class ModelUnavailableError(EbmragError, RuntimeError):
    """A model or tokenizer could not be loaded from a local path (we never download)."""


class IngestError(_LocatedError):
    """One source file (or one line of it) could not be ingested; the rest of the batch goes on."""


class KnowledgeBaseError(EbmragError, RuntimeError):
    """A knowledge-base directory is missing, locked, or was built with an incompatible configuration."""


class LLMError(EbmragError):
    """The model could not give a usable reply; the message says why (status, timeout, bad JSON)."""


class MissingExtraError(EbmragError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def require_extra(module: str, extra: str, purpose: str) -> ModuleType:
    """Import an optional dependency, or fail with one line naming the pip extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(f"{purpose} needs the '{extra}' extra ({module} is missing): "
                                f"pip install 'ebmrag[{extra}]'") from exc
