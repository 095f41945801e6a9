"""The test FHIR server (tests/fhir_server/server.mjs) as a subprocess, and its admin endpoints as methods.

The server is Medplum's in-memory FHIR router behind SMART Backend Services auth, paging, Patient/$everything,
`_since` and Bulk $export (tests/fhir_server/README.md). Tests reach it over real HTTP: FHIR requests with a bearer
token at `base`, the test's own bookkeeping (load, reset, clients, faults, request log) at `/_admin/*` without auth.
"""

from __future__ import annotations

import json
import selectors
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

SERVER_DIR = Path(__file__).resolve().parents[1] / "fhir_server"
NOT_INSTALLED = "the test FHIR server is not installed: run `make fhir-server`"
START_TIMEOUT_S = 15.0

Json = dict[str, Any]


class FhirServer:
    """One `node server.mjs --port 0` process; `start()` waits for its `listening <port>` line."""

    def __init__(self, server_dir: Path = SERVER_DIR) -> None:
        self._dir = server_dir
        self._process: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None
        self._origin = ""
        self._admin: httpx.Client | None = None

    def start(self) -> FhirServer:
        """Starts the server on a free port; raises RuntimeError naming the cause when it cannot."""
        node = shutil.which("node")
        if not (self._dir / "node_modules" / "@medplum" / "fhir-router").is_dir() or node is None:
            raise RuntimeError(NOT_INSTALLED)
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115 (closed by stop())
        self._process = subprocess.Popen(
            [node, str(self._dir / "server.mjs"), "--port", "0"], cwd=self._dir, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True)
        port = self._wait_for_port()
        self._origin = f"http://127.0.0.1:{port}"
        self._admin = httpx.Client(base_url=f"{self._origin}/_admin", timeout=30.0)
        return self

    def _wait_for_port(self) -> int:
        assert self._process is not None and self._process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._process.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + START_TIMEOUT_S
            while (left := deadline - time.monotonic()) > 0 and selector.select(left):
                line = self._process.stdout.readline()
                if line.startswith("listening "):
                    return int(line.split()[1])
                if not line:  # stdout closed: the process ended
                    break
        reason = self._stderr_tail()
        self.stop()
        raise RuntimeError(f"the test FHIR server did not start: {reason}")

    def _stderr_tail(self) -> str:
        if self._stderr is None or self._stderr.closed:
            return "(no output)"
        self._stderr.seek(0)
        return self._stderr.read()[-2000:].strip() or "(no output)"

    @property
    def base(self) -> str:
        """The FHIR base URL, `http://127.0.0.1:<port>/fhir`."""
        return f"{self._origin}/fhir"

    @property
    def token_url(self) -> str:
        """The SMART token endpoint, also the `aud` a client assertion must carry."""
        return f"{self._origin}/auth/token"

    def _post(self, name: str, body: Any = None) -> Any:
        if self._admin is None:
            raise RuntimeError("the test FHIR server is not started")
        response = self._admin.post(f"/{name}", content=json.dumps(body if body is not None else {}))
        if response.status_code != 200:
            raise RuntimeError(f"/_admin/{name} answered {response.status_code}: {response.text[:500]}")
        return response.json()

    def reset(self) -> None:
        """Empties the repository, clients, tokens, faults and the request log."""
        self._post("reset")

    def load(self, bundle_or_path: Mapping[str, Any] | Sequence[Mapping[str, Any]] | str | Path) -> list[str]:
        """Stores a Bundle (any type), a list of resources or a JSON file of either; returns the Patient ids loaded.

        Ids are kept (PUT semantics: loading again makes a new version); see the README for id-less resources.
        """
        body = json.loads(Path(bundle_or_path).read_text("utf-8")) if isinstance(bundle_or_path, str | Path) \
            else bundle_or_path
        answer = self._post("load", body)
        if answer.get("skipped"):
            raise RuntimeError(f"the test FHIR server could not store: {answer['skipped']}")
        return [str(patient) for patient in answer["patients"]]

    def register_client(self, client_id: str, jwks: Mapping[str, Any], scope: str = "system/*.rs") -> None:
        """Registers a SMART Backend Services client: its public JWKS (`{"keys": [...]}`) and allowed scopes."""
        self._post("clients", {"client_id": client_id, "jwks": dict(jwks), "scope": scope})

    def mint_token(self, scope: str = "system/*.rs") -> str:
        """An access token issued without the OAuth dance (as a CDS Hooks `fhirAuthorization` would carry)."""
        return str(self._post("token", {"scope": scope})["access_token"])

    def faults(self, **faults: Any) -> None:
        """Injects faults: token_ttl_seconds, rate_limit={count, retry_after}, fail_page={n, status},
        everything=False, export_polls, export_retry_after, expire_tokens=True, token_endpoint=url, bad_gzip=True,
        next_link=url, drip_ms=n, manifest_file={url, requires_token}, no_patient_search=[types] (README lists their
        effect)."""
        self._post("faults", faults)

    def requests(self) -> list[Json]:
        """Every non-admin request since the last reset: `{method, path, query, status}` (query as a dict)."""
        if self._admin is None:
            raise RuntimeError("the test FHIR server is not started")
        return list(self._admin.get("/requests").json())

    def stop(self) -> None:
        """Stops the process (idempotent)."""
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._process = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> FhirServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
