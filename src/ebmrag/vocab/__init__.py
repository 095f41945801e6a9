"""The shared clinical vocabulary: which drug a text or a code names, which words negate, which genetic result a
text states.

One drug vocabulary (`drugs`: INN ingredients, ATC classes and families, brand and other names, SNOMED CT and
RxNorm codes, Chinese names; `lexicon`: the 27,000-name lexicon that only says a drug is named; `drug_words`: how
chart words are compared with the tables' names), one negation vocabulary (`negation`) and one gene vocabulary
(`genes`: HGNC gene symbols, a grammar of variant notations and result words, CPIC's gene-drug pairs), each read
from data files under src/ebmrag/rules/ with their provenance. Tiering, the ADR recogniser, medication
reconciliation and the CDS cards all read them here, so "Lipitor" and "atorvastatin", or "阿莫西林" and
"amoxicillin", are one drug to each of them.

A low layer: it imports only `errors` and the standard library, so every reader above may use it.
"""
