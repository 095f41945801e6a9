"""The chart: `Fragment` and `PatientRecord` (one patient, checked), and the readers that turn ebmrag JSON, FHIR R4
Bundles, AgentClinic cases and free text into one."""
