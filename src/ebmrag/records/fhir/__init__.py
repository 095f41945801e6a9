"""FHIR R4/R4B charts: any Bundle type or Bulk Data NDJSON, read leniently one resource at a time."""
