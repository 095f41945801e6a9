from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
_CACHE_KEY = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Every test session gets a cache folder of its own, before anything reads `XDG_CACHE_HOME` (the embedding
    vectors, derived tiers, model replies, the ONNX graph and the demo knowledge base live there), and the commands
    tests start inherit it. The user's `~/.cache/ebmrag` is never touched, and two sessions at once never share a
    cache: a run once failed with `database disk image is malformed` while other processes used the user's."""
    folder = Path(tempfile.mkdtemp(prefix="ebmrag-test-cache-"))
    config.stash[_CACHE_KEY] = folder
    os.environ["XDG_CACHE_HOME"] = str(folder)


TESTS = Path(__file__).resolve().parent
# What makes a test `integration` without a mark of its own: a fixture that starts a server or reaches one outside
# the process (the Node FHIR server, PostgreSQL, a Milvus process), or a folder whose tests run real HTTP servers,
# brokers and subprocesses throughout. A test that starts one itself is marked where it is written.
INTEGRATION_FIXTURES = frozenset({"fhir", "fhir_server", "any_store", "store", "serve", "running", "hostile",
                                  "milvus_uri", "pair"})
INTEGRATION_FOLDERS = frozenset({"serve", "gateway", "observe"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.resolve().relative_to(TESTS).parts[0]
        if folder in INTEGRATION_FOLDERS or INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_CACHE_KEY, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} not present beside the checkout")
    return SHARED_DATA


@pytest.fixture(scope="session")
def resources():  # type: ignore[no-untyped-def]
    """The shared models of the default settings, built once for the whole session (loading takes a few seconds)."""
    from ebmrag.compose import Resources
    from ebmrag.config import Settings

    built = Resources(Settings())
    built.warm_up()
    return built


@pytest.fixture(scope="session")
def context_packer(resources):  # type: ignore[no-untyped-def]
    """One loaded model for the whole session, packing with the default [packing] settings."""
    from ebmrag.compose import build_packer

    return build_packer(resources)


@pytest.fixture(scope="session")
def tiering(resources):  # type: ignore[no-untyped-def]
    """The tiering step of the default settings: what every caller runs on a record before the packer packs it."""
    from ebmrag.compose import build_tiering

    return build_tiering(resources)


@pytest.fixture(scope="session")
def extractor():  # type: ignore[no-untyped-def]
    """The entity extractor of the bundled lexicon, which components receive from the composition root."""
    from ebmrag.evidence.entities import default_extractor

    return default_extractor()


@pytest.fixture(scope="session")
def embedder(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The bundled model at the knowledge base's default profile, loaded once, with an on-disk cache."""
    from ebmrag.index.kb import kb_embedder
    from ebmrag.index.params import KnowledgeBaseConfig

    model = kb_embedder(KnowledgeBaseConfig(), tmp_path_factory.mktemp("embedding-cache"))
    model.warm_up()
    return model


def make_pdf(text: str) -> bytes:
    """A minimal one-page PDF with a real text layer (Helvetica), offsets computed for a valid xref table."""
    escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    stream = f"BT /F1 12 Tf 72 712 Td ({escaped}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n".encode() + body + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{offset:010d} 00000 n \n".encode() for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


@pytest.fixture(scope="session")
def demo_voter(tmp_path_factory: pytest.TempPathFactory, embedder):  # type: ignore[no-untyped-def]
    """The bundled demo corpus in a real knowledge base on disk, searched hybrid as `ask` does by default."""
    from ebmrag.demo import DEMO_CORPUS
    from ebmrag.index.kb import KnowledgeBase
    from ebmrag.index.sync import ingest_paths
    from ebmrag.retrieve.params import RetrievalParams
    from ebmrag.retrieve.search import HybridRetriever
    from ebmrag.retrieve.vote import DocumentVoter

    kb = KnowledgeBase(tmp_path_factory.mktemp("demo-kb") / "kb", embedder=embedder)
    report = ingest_paths(kb, [Path(DEMO_CORPUS)])
    assert not report.errors and report.chunks_written >= 18
    return DocumentVoter(HybridRetriever(kb, RetrievalParams(mode="hybrid", fusion="score", bm25_weight=0.3,
                                                            dense_weight=0.7)))
