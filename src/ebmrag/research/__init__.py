"""Questions that need several look-ups: the research agent (ReAct loop, typed tools, a memory packed by EBM-Pack,
trajectories as fine-tuning data) and KISA synthesis of multi-hop questions from the knowledge base."""
