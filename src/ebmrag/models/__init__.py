"""The local models every stage shares: the sentence embedder (bundled MiniLM, deltas over it), token counters and
the linear classifiers that run on its vectors. Nothing here downloads anything."""
