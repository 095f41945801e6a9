"""C-CDA R2.1 documents -> FHIR R4-shaped Bundles (plain dicts) that the FHIR chart reader renders.

`is_ccda` sniffs, `bundle_from_ccda` converts, `ccda_narrative` gives each section's narrative as plain text (for a
C-CDA that arrives inside a FHIR attachment). Package layout: `document` (header, sections, Bundle), `entries`
(allergies, problems, medications, immunizations), `observations` (results, vitals, social history, procedures,
encounters), `narrative` (CDA narrative -> XHTML and text), `values` (HL7 data types and vocabulary tables).
"""

from ebmrag.records.ccda.document import bundle_from_ccda, ccda_narrative, ccda_patient, is_ccda

__all__ = ["bundle_from_ccda", "ccda_narrative", "ccda_patient", "is_ccda"]
