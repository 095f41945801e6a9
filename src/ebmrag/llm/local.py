"""A local model for air-gapped sites: a GGUF file run in this process by llama.cpp (`pip install 'ebmrag[local]'`).

`--llm local --model-path FILE.gguf` (or `[llm] backend = "local"`, `model_path`). The client is a `ChatClient` and
a `SchemaChatClient`: every typed step (the four answer stages, the relevance filter, query rewriting) decodes
under its JSON schema as a grammar, so even a very small model returns the stage's shape, cites only the
context's numbers and closes its strings (`generate.staged.stage_schema`). Nothing leaves the machine, so `auto`
redaction does not apply. Replies are not cached (a local call costs no money; decoding at temperature 0 with a
fixed seed repeats itself).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from ebmrag.errors import LLMError, ModelUnavailableError, require_extra
from ebmrag.observe.instruments import model_call
from ebmrag.protocols import ChatMessage, LLMReply

PROVIDER = "llama.cpp"  # gen_ai.provider.name of a model run in this process


class LlamaCppChatClient:
    """Chat completions from a local GGUF model; the model loads in `warm_up()` (on first use otherwise)."""

    in_process = True  # the engine's redaction treats it as local

    def __init__(self, model_path: str | Path, context_tokens: int = 4096, threads: int | None = None,
                 seed: int = 0) -> None:
        path = Path(model_path)
        if not path.is_file():
            raise ModelUnavailableError(f"local model file not found: {path}")
        if path.suffix.lower() != ".gguf":
            raise ModelUnavailableError(f"{path}: the local backend reads GGUF files (.gguf)")
        if context_tokens < 512:
            raise ValueError(f"context_tokens must be >= 512, got {context_tokens}")
        self.model_path, self.context_tokens, self.threads, self.seed = path, context_tokens, threads, seed
        self.model = path.stem
        self._llama: Any = None
        self._lock = threading.Lock()  # one llama.cpp context is not safe to share between threads

    def warm_up(self) -> None:
        if self._llama is not None:
            return
        llama_cpp = require_extra("llama_cpp", "local", "the local model backend")
        try:
            self._llama = llama_cpp.Llama(model_path=str(self.model_path), n_ctx=self.context_tokens,
                                          n_threads=self.threads, seed=self.seed, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ModelUnavailableError(f"could not load {self.model_path}: {exc}") from exc

    def complete(self, messages: list[ChatMessage], temperature: float = 0.0, max_tokens: int = 512) -> LLMReply:
        return self._chat(messages, temperature, max_tokens, None)

    def complete_schema(self, messages: list[ChatMessage], schema: dict[str, Any], temperature: float = 0.0,
                        max_tokens: int = 512) -> LLMReply:
        return self._chat(messages, temperature, max_tokens, {"type": "json_object", "schema": schema})

    def _chat(self, messages: list[ChatMessage], temperature: float, max_tokens: int,
              response_format: dict[str, Any] | None) -> LLMReply:
        self.warm_up()
        chat = [{"role": m.role, "content": m.content} for m in messages]
        with model_call(PROVIDER, self.model, temperature=temperature, max_tokens=max_tokens) as call:
            try:
                with self._lock:
                    reply = self._llama.create_chat_completion(messages=chat, temperature=temperature,
                                                               max_tokens=max_tokens, seed=self.seed,
                                                               response_format=response_format)
            except (ValueError, RuntimeError) as exc:  # e.g. the prompt is longer than the context
                raise LLMError(f"local model {self.model}: {exc}") from exc
            usage = reply.get("usage") or {}
            call.replied(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
        return LLMReply(str(reply["choices"][0]["message"].get("content") or ""), call.input_tokens,
                        call.output_tokens, False, self.model)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "llama.cpp", "model_path": str(self.model_path), "context_tokens": self.context_tokens,
                "threads": self.threads, "seed": self.seed}
