"""The answer to one question about one patient: `Engine` (gate -> retrieve -> pack -> answer -> grounding), the
retrieval gate, the relevance filter and `AskResult`."""
