"""Bayesian differential diagnosis (SPEC §6): the condition knowledge base, the engine and the free-text
finding mapper. Below the research agent, which calls it as its `ddx` tool."""
