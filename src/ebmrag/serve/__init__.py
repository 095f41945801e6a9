"""`ebmrag serve`: the multi-tenant service (store, access, audit, HTTP app)."""
