"""Measurements of ebmrag on public data (tier agreement now; packing and retrieval experiments later)."""
