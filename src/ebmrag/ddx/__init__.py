"""Bayesian differential diagnosis, P(D | findings) ∝ Π_i P(s_i | D) · P(D): the condition knowledge base, the
engine and the free-text finding mapper. Below the research agent, which calls it as its `ddx` tool."""
