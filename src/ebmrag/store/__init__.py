"""What the service and the results gateway keep: the patient store (SQLite / PostgreSQL, scoped by tenant and
patient), API keys and access decisions, the hash-chained audit log, and result messages into the store."""
