"""`[llm]`: the answering model."""

from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("extractive", "openai", "local")


@dataclass(frozen=True)
class LLMParams:
    """The answering model. The key is better left out of the file: OPENAI_API_KEY is read when it is empty."""

    backend: str = "extractive"  # or "openai": any OpenAI-compatible endpoint; "local": a GGUF file (llama.cpp)
    base_url: str = ""
    model: str = ""
    api_key: str = ""
    timeout: float = 60.0
    max_retries: int = 2
    model_path: str = ""  # backend "local": the .gguf file
    context_tokens: int = 4096  # backend "local": the model's context window

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be 'extractive', 'openai' or 'local', got {self.backend!r}")
