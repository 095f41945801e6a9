"""`ebmrag serve`, `ebmrag keys ...` and `ebmrag audit ...`: run the service and manage who may use it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ebmrag.cli.common import ConfigOption, JsonOption, console, stderr, user_errors
from ebmrag.config import Settings, load_settings, with_overrides
from ebmrag.errors import require_extra

if TYPE_CHECKING:
    from ebmrag.store.patients import PatientStore

DataDirOption = Annotated[Path, typer.Option("--data-dir", help="Where the service keeps its store and audit log.")]
StoreOption = Annotated[str, typer.Option("--store-url", help="postgresql://… (default: [serve] store_url, "
                                                              "EBMRAG_STORE_URL, else SQLite in --data-dir).")]
ExpiresInOption = Annotated[str, typer.Option("--expires-in", help="The key ends this long from now: 90d, 12h, "
                                                                  "2w (default and longest: [serve] key_max_days).")]
ExpiresOption = Annotated[str, typer.Option("--expires", help="The key ends at this ISO 8601 date or time (UTC "
                                                              "without an offset).")]
ServeKbOption = Annotated[Path | None, typer.Option(
    "--kb", help="The knowledge base to answer from, which /v1/kb/documents changes (default: [serve] kb; without "
                 "either, the bundled demo knowledge base, read-only).")]
keys_app = typer.Typer(help="API keys of the service (stored hashed).", no_args_is_help=True)
audit_app = typer.Typer(help="The service's access log.", no_args_is_help=True)


def _store_url(settings_url: str, flag: str) -> str:
    return flag or os.environ.get("EBMRAG_STORE_URL", "") or settings_url


def serve_settings(config: Path | None, kb: Path | None) -> Settings:
    """The TOML file with --kb applied over [serve] kb (the flag wins)."""
    return with_overrides(load_settings(config), serve={"kb": str(kb) if kb else None})


def kb_label(settings: Settings) -> str:
    return settings.serve.kb or "the bundled demo (read-only)"


def serve(
    data_dir: DataDirOption,
    host: Annotated[str, typer.Option(help="Interface to bind; 127.0.0.1 keeps the service on this machine.")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    workers: Annotated[int, typer.Option(help="Worker processes, each with its own engine and model (~200 MB "
                                               "each). The threads of one process share one core's worth of "
                                               "Python: one worker per core serves on every core. Rate limits, "
                                               "queues and fair shares are per worker.")] = 1,
    store_url: StoreOption = "",
    kb: ServeKbOption = None,
    config: ConfigOption = None,
) -> None:
    """Run the multi-tenant HTTP service (OpenAPI at /openapi.json, everything else under /v1)."""
    with user_errors():
        require_extra("fastapi", "serve", "ebmrag serve")
        require_extra("uvicorn", "serve", "ebmrag serve")
        import uvicorn

        from ebmrag.serve.app import serve_app
        from ebmrag.serve.clients import SERVER_OPTIONS

        if not 1 <= workers <= 64:
            raise ValueError(f"--workers must be 1 to 64, got {workers}")
        settings = serve_settings(config, kb)
        url = _store_url(settings.serve.store_url, store_url)
        app = serve_app(data_dir, settings, url)  # checks store, knowledge base and settings before any worker starts
        stderr.print(f"ebmrag serve on http://{host}:{port} (store: {app.state.service.store.backend}, "
                     f"knowledge base: {kb_label(settings)}, {workers} worker{'s' if workers > 1 else ''})",
                     highlight=False, soft_wrap=True)
    if workers == 1:
        uvicorn.run(app, host=host, port=port, log_level="warning", **SERVER_OPTIONS)  # no proxy rewriting
        return
    os.environ.update({"EBMRAG_SERVE_DATA_DIR": str(data_dir), "EBMRAG_STORE_URL": url,
                       "EBMRAG_SERVE_CONFIG": str(config or ""), "EBMRAG_SERVE_KB": settings.serve.kb})
    uvicorn.run("ebmrag.serve.app:app_from_environment", factory=True, host=host, port=port, workers=workers,
                log_level="warning", **SERVER_OPTIONS)


def mcp(
    data_dir: DataDirOption,
    transport: Annotated[str, typer.Option(help="stdio (one local client, --key) or http (streamable HTTP at "
                                                "/mcp, a key in every request).")] = "stdio",
    key: Annotated[str, typer.Option(help="stdio: the API key every call acts with (default: EBMRAG_API_KEY).")]
    = "",
    host: Annotated[str, typer.Option(help="http: interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="http: TCP port.")] = 8090,
    store_url: StoreOption = "",
    kb: ServeKbOption = None,
    config: ConfigOption = None,
) -> None:
    """Expose pack, ask, search, ddx and a patient's fragments as MCP tools, with the service's keys and scopes."""
    with user_errors():
        require_extra("mcp", "mcp", "ebmrag mcp")
        from ebmrag.compose import ServiceParts
        from ebmrag.serve.mcp import build_mcp_server, http_app
        from ebmrag.serve.service import Service
        from ebmrag.store.access import authenticate

        if transport not in ("stdio", "http"):
            raise ValueError(f"--transport must be stdio or http, got {transport!r}")
        settings = serve_settings(config, kb)
        store = open_store_for(data_dir, store_url, config)
        service = Service(store, settings, ServiceParts(settings))  # checks the knowledge base
        if transport == "stdio":
            stdio_key = key or os.environ.get("EBMRAG_API_KEY", "")
            authenticate(service.store, f"Bearer {stdio_key}")  # a wrong key fails now, in one line
            server = build_mcp_server(service, stdio_key)
    if transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    from ebmrag.serve.clients import SERVER_OPTIONS

    stderr.print(f"ebmrag mcp on http://{host}:{port}/mcp (store: {service.store.backend}, knowledge base: "
                 f"{kb_label(settings)})", highlight=False, soft_wrap=True)
    uvicorn.run(http_app(service), host=host, port=port, log_level="warning", **SERVER_OPTIONS)


def open_store_for(data_dir: Path, store_url: str, config: Path | None) -> PatientStore:
    from ebmrag.store.patients import open_store

    settings = load_settings(config)
    return open_store(data_dir, _store_url(settings.serve.store_url, store_url), settings.serve.audit_key_file)


@keys_app.command("create")
def keys_create(
    data_dir: DataDirOption,
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for.")],
    role: Annotated[str, typer.Option(help="clinician, service or admin.")],
    patient: Annotated[list[str] | None, typer.Option("--patient", help="Limit the key to this patient "
                                                                         "(repeat for more).")] = None,
    expires_in: ExpiresInOption = "",
    expires: ExpiresOption = "",
    store_url: StoreOption = "",
    config: ConfigOption = None,
) -> None:
    """Create a key; the key itself is the only line on stdout (it is shown once, stored hashed)."""
    with user_errors():
        from ebmrag.store.access import create_key, key_expiry

        ends = key_expiry(expires_in, expires, load_settings(config).serve.key_max_days)
        secret, key = create_key(open_store_for(data_dir, store_url, config), tenant, role, tuple(patient or ()),
                                 ends)
    stderr.print(f"key {key.key_id}: tenant {key.tenant}, role {key.role}"
                 + (f", patients {', '.join(key.patients)}" if key.patients else "")
                 + f", expires {key.expires or 'never'}", highlight=False, soft_wrap=True)
    typer.echo(secret)


@keys_app.command("rotate")
def keys_rotate(
    data_dir: DataDirOption,
    key_id: Annotated[str, typer.Argument(help="The key id to replace.")],
    grace: Annotated[str, typer.Option(help="How long the old key keeps working: 7d, 12h, 0s.")] = "7d",
    expires_in: ExpiresInOption = "",
    expires: ExpiresOption = "",
    store_url: StoreOption = "",
    config: ConfigOption = None,
) -> None:
    """Replace a key: a new one (the only line on stdout) for the same tenant, role and patients; the old one
    keeps working for the grace period, then is refused (401)."""
    with user_errors():
        from ebmrag.store.access import duration, key_expiry, rotate_key

        ends = key_expiry(expires_in, expires, load_settings(config).serve.key_max_days)
        secret, new, old = rotate_key(open_store_for(data_dir, store_url, config), key_id,
                                      duration(grace, "--grace"), ends)
    stderr.print(f"key {new.key_id} replaces {old.key_id} (tenant {new.tenant}, role {new.role}), expires "
                 f"{new.expires or 'never'}; {old.key_id} ends {old.expires}", highlight=False, soft_wrap=True)
    typer.echo(secret)


@keys_app.command("list")
def keys_list(data_dir: DataDirOption, tenant: Annotated[str, typer.Option(help="Only this tenant.")] = "",
              store_url: StoreOption = "", as_json: JsonOption = False, config: ConfigOption = None) -> None:
    """Key ids, tenants, roles and patient limits (never the keys)."""
    with user_errors():
        keys = open_store_for(data_dir, store_url, config).keys(tenant or None)
    rows = [{"key_id": k.key_id, "tenant": k.tenant, "role": k.role, "patients": list(k.patients),
             "created": k.created, "expires": k.expires or None, "revoked": k.revoked, "expired": k.expired()}
            for k in keys]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    for k in keys:
        state = "  revoked" if k.revoked else "  expired" if k.expired() else ""
        console.print(f"{k.key_id}  {k.tenant}  {k.role}  {','.join(k.patients) or '*'}  {k.created}  "
                      f"expires {k.expires or 'never'}{state}", highlight=False, soft_wrap=True)


@keys_app.command("revoke")
def keys_revoke(data_dir: DataDirOption, key_id: Annotated[str, typer.Argument(help="The key id.")],
                store_url: StoreOption = "", config: ConfigOption = None) -> None:
    """Revoke a key: every later request with it is refused (401)."""
    with user_errors():
        if not open_store_for(data_dir, store_url, config).revoke(key_id):
            raise ValueError(f"no key with id {key_id!r}")
    stderr.print(f"key {key_id} revoked")


@audit_app.command("verify")
def audit_verify(
    data_dir: DataDirOption,
    expect_head: Annotated[str, typer.Option("--expect-head", help="SEQ:HASH from an earlier `ebmrag audit head`, "
                                                                   "kept outside: the log must still reach it.")]
    = "",
    store_url: StoreOption = "",
    config: ConfigOption = None,
) -> None:
    """Check the access log with the audit key: exit 0 when intact, 1 with the problems when it was tampered
    with, 2 when the keyed entries cannot be checked (no key file, or another key)."""
    with user_errors():
        from ebmrag.store.audit import parse_head, verify

        expected = parse_head(expect_head) if expect_head else None
        report = verify(open_store_for(data_dir, store_url, config), expected)
    for problem in report.problems:
        stderr.print(f"[bold red]audit:[/] {problem}", highlight=False, soft_wrap=True)
    if report.cannot_check:
        stderr.print(f"[bold yellow]audit: cannot check:[/] {report.cannot_check}", highlight=False, soft_wrap=True)
    if report.problems:
        raise typer.Exit(code=1)
    if report.cannot_check:
        raise typer.Exit(code=2)
    console.print(f"audit log intact: {report.summary()}", highlight=False, soft_wrap=True)


@audit_app.command("head")
def audit_head(data_dir: DataDirOption, store_url: StoreOption = "", config: ConfigOption = None) -> None:
    """Print the log's last entry as SEQ:HASH (the only line on stdout). Keep it outside the server (a ticket, a
    log host); `audit verify --expect-head SEQ:HASH` later finds a log cut back or rewritten past it."""
    with user_errors():
        from ebmrag.store.audit import current_head

        seq, digest = current_head(open_store_for(data_dir, store_url, config))
    typer.echo(f"{seq}:{digest}")
