"""Talking to a model: the OpenAI-compatible client, the in-process GGUF client, typed JSON completions and every
LLM step's prompts (data files, English and Chinese)."""
