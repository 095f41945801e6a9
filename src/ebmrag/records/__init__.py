"""The chart: `Fragment` and `PatientRecord` (one patient, checked), and the readers that turn a chart into one:
FHIR R4/R4B (any Bundle, JSON or XML, Bulk Data NDJSON; `fhir/`), C-CDA R2.1 (`ccda/`), ebmrag JSON, AgentClinic
cases and free text (`loaders`). The rules that judge the fragments live in `evidence/`, not here."""
