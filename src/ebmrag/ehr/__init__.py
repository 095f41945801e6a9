"""The EHR side: charts pulled from FHIR servers (SMART Backend Services, paging, `_since`, Bulk Data $export).

`params` ([ehr] and its connections), `keys` (the client's key pair), `smart` (discovery and tokens), `fhir` (the
REST client and `EhrError`), `pull` (one patient), `bulk` (a Group's $export). Behind the `ehr` extra (httpx, PyJWT).
"""
