"""Measurements of ebmrag on public data: tier agreement and labelled corpora, the gate, packing, retrieval,
generation and the differential, each a documented command writing its report."""
