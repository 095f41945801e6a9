"""The shared knowledge base over HTTP: stats for any admin, changes only for the admins of
[serve] kb_admin_tenant (one tenant's administrator must not rewrite every tenant's guidelines), and only to the
operator's knowledge base ([serve] kb, `serve --kb DIR`): the bundled demo one is a cache, refused 409."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from ebmrag.index.backend import KnowledgeStore
from ebmrag.ingest.documents import Document, normalize_text
from ebmrag.serve.models import UploadBody
from ebmrag.serve.problems import ProblemError
from ebmrag.serve.service import NO_OPERATOR_KB, Service, caller
from ebmrag.store.access import KB_ADMIN, AccessError, require
from ebmrag.store.keys import ApiKey


def install_kb(app: FastAPI, service: Service) -> None:
    """The shared knowledge base: stats for any admin, changes only for the admins of [serve] kb_admin_tenant
    (one tenant's administrator must not rewrite every tenant's guidelines)."""

    def knowledge_base() -> KnowledgeStore:
        return service.knowledge_base()

    async def kb_admin(request: Request, change: bool) -> ApiKey:
        key = await caller(request, service)
        require(key, KB_ADMIN)
        if change and key.tenant != service.settings.serve.kb_admin_tenant:
            raise AccessError(403, f"only admins of tenant {service.settings.serve.kb_admin_tenant!r} change the "
                                   "shared knowledge base")
        return key

    async def changeable(key: ApiKey, request: Request, route: str) -> None:
        """Before any work is queued, so a refused change builds and writes nothing; refused attempts are audited."""
        if not service.kb_changeable:
            await run_in_threadpool(service.audit_refused, key, 409, route, request.state.request_id)
            raise ProblemError(409, "no-knowledge-base", NO_OPERATOR_KB)

    @app.get("/v1/kb/stats", tags=["knowledge base"])
    async def kb_stats(request: Request) -> dict[str, Any]:
        key = await kb_admin(request, change=False)
        return dict(asdict(await service.run(lambda: knowledge_base().stats(), tenant=key.tenant, engine=False)))

    @app.post("/v1/kb/documents", tags=["knowledge base"])
    async def kb_upload(body: UploadBody, request: Request) -> dict[str, Any]:
        key = await kb_admin(request, change=True)
        await changeable(key, request, "/v1/kb/documents")
        documents = [Document(d.doc_id, normalize_text(d.text), d.source, "upload", d.title, date=d.date,
                              authority=d.authority) for d in body.documents]
        report = await service.run(lambda: service.change_knowledge_base(documents), tenant=key.tenant)
        service.audit(key, "", "kb_upload", request, tuple(d.doc_id for d in documents))
        return {"added": report.added, "updated": report.updated, "unchanged": report.unchanged}

    @app.delete("/v1/kb/documents/{doc_id:path}", tags=["knowledge base"])  # file-ingested ids hold "/"
    async def kb_delete(doc_id: str, request: Request) -> dict[str, Any]:
        key = await kb_admin(request, change=True)
        await changeable(key, request, "/v1/kb/documents/{doc_id}")
        report = await service.run(lambda: service.change_knowledge_base([], [doc_id]), tenant=key.tenant)
        if not report.deleted:
            await run_in_threadpool(service.audit_refused, key, 404, "/v1/kb/documents/{doc_id}",
                                    request.state.request_id)
            raise ProblemError(404, "not-found", f"no document {doc_id!r} in the knowledge base")
        service.audit(key, "", "kb_delete", request, (doc_id,))
        return {"deleted": report.deleted}
