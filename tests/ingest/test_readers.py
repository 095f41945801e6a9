from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebmrag.errors import IngestError
from ebmrag.ingest.documents import Document, normalize_text
from ebmrag.ingest.pipeline import collect
from ebmrag.ingest.readers import FieldMap, html_to_markdown, read_file
from tests.conftest import make_pdf


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return path


def test_normalize_text_applies_nfkc_and_collapses_whitespace() -> None:
    raw = "Ｃｒｅａｔｉｎｉｎｅ\x07  2.8\u00a0mg/dL\r\n\r\n\r\n\r\nnext   line  \n"
    assert normalize_text(raw) == "Creatinine 2.8 mg/dL\n\nnext line"


def test_content_hash_changes_with_text_and_metadata_only() -> None:
    base = Document("d1", "Penicillin anaphylaxis.", "src", "txt", title="Allergy")
    same = Document("d1", "Penicillin anaphylaxis.", "src", "txt", title="Allergy")
    assert base.content_hash == same.content_hash
    assert base.content_hash != Document("d1", "Penicillin rash.", "src", "txt", title="Allergy").content_hash
    assert base.content_hash != Document("d1", "Penicillin anaphylaxis.", "src", "txt", title="Rash").content_hash


def test_markdown_sections_follow_headings(tmp_path: Path) -> None:
    path = write(tmp_path / "guide.md", "Intro line.\n\n# Sepsis\n\nGive antibiotics.\n\n## Fluids\n\n30 mL/kg.\n")
    (doc,) = read_file(path, "guide.md").documents
    assert [s.title for s in doc.sections] == ["", "Sepsis", "Fluids"]
    fluids = doc.sections[-1]
    assert doc.text[fluids.start:fluids.end].endswith("30 mL/kg.")


def test_html_boilerplate_is_stripped_and_headings_kept() -> None:
    html = ("<html><head><title>Allergy guide</title><style>p{}</style></head><body><nav>Home | Login</nav>"
            "<h2>Penicillin</h2><p>Anaphylaxis: avoid beta-lactams.</p><script>track()</script>"
            "<footer>Copyright</footer></body></html>")
    title, text = html_to_markdown(html)
    assert title == "Allergy guide"
    assert "## Penicillin" in text and "Anaphylaxis: avoid beta-lactams." in text
    assert "Home" not in text and "track" not in text and "Copyright" not in text


def test_pdf_text_layer_is_read(tmp_path: Path) -> None:
    path = write(tmp_path / "report.pdf", make_pdf("Biopsy shows adenocarcinoma (grade 2)"))
    (doc,) = read_file(path, "report.pdf").documents
    assert "adenocarcinoma (grade 2)" in doc.text
    assert doc.source_type == "pdf"


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("broken.pdf", b"%PDF-1.4\nthis is not a pdf body", "unreadable PDF"),
        ("latin1.txt", "Fièvre".encode("latin-1"), "not valid UTF-8 (byte 0xe8 at offset 2)"),
        ("empty.md", b"", "empty file"),
        ("blank.txt", b"   \n\n  ", "empty file"),
        ("slides.pptx", b"PK", "unsupported file type"),
    ],
)
def test_bad_files_raise_a_clear_error(tmp_path: Path, name: str, content: bytes, problem: str) -> None:
    path = write(tmp_path / name, content)
    with pytest.raises(IngestError, match="^" + str(path).replace(".", r"\.")) as info:
        read_file(path, name)
    assert problem in info.value.problem


def test_pdf_without_text_layer_is_named(tmp_path: Path) -> None:
    path = write(tmp_path / "scan.pdf", make_pdf(""))
    with pytest.raises(IngestError, match="no text layer"):
        read_file(path, "scan.pdf")


def test_oversized_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "huge.txt"
    with path.open("wb") as handle:  # a sparse 200 MB file: costs no disk
        handle.truncate(200 * 2**20)
    with pytest.raises(IngestError, match="200 MB, over the 50 MB limit"):
        read_file(path, "huge.txt")


def test_jsonl_bad_lines_are_reported_and_good_lines_kept(tmp_path: Path) -> None:
    lines = ['{"id": "a", "text": "Aspirin inhibits COX-1."}', "{not json", '["a list"]',
             '{"id": "b", "body": "no text field"}', '{"id": "c", "text": "Metformin lowers glucose.", '
             '"authority": "guideline", "date": "2024-03-01", "section": "Therapy"}']
    path = write(tmp_path / "kb.jsonl", "\n".join(lines) + "\n")
    result = read_file(path, "kb.jsonl")
    assert [d.doc_id for d in result.documents] == ["a", "c"]
    assert result.documents[1].authority == "guideline"
    assert result.documents[1].sections[0].title == "Therapy"
    assert [e.where for e in result.errors] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert "not JSON" in result.errors[0].problem and "field 'text'" in result.errors[2].problem


def test_field_map_renames_fields(tmp_path: Path) -> None:
    path = write(tmp_path / "x.jsonl", json.dumps({"pmid": "7", "abstract": "Statins reduce LDL."}) + "\n")
    (doc,) = read_file(path, "x.jsonl", FieldMap.parse(["text=abstract", "id=pmid"])).documents
    assert (doc.doc_id, doc.text) == ("7", "Statins reduce LDL.")
    with pytest.raises(ValueError, match="bad field mapping"):
        FieldMap.parse(["body"])


def test_a_batch_goes_on_past_bad_files(tmp_path: Path) -> None:
    write(tmp_path / "docs" / "good.md", "# Gout\n\nColchicine for flares.")
    write(tmp_path / "docs" / "bad.txt", b"\xff\xfe\x00")
    write(tmp_path / "docs" / ".hidden.md", "ignored")
    batch = collect([tmp_path / "docs", tmp_path / "missing"])
    assert [d.doc_id for d in batch.documents] == ["docs/good.md"]
    assert sorted(e.problem.split(" (")[0] for e in batch.errors) == ["no such file or folder", "not valid UTF-8"]
    assert str((tmp_path / "docs" / "bad.txt").resolve()) in batch.failed_files


@pytest.mark.data
def test_shared_corpus_shapes_are_recognised(shared_data: Path, tmp_path: Path) -> None:
    samples = {
        "medquad": shared_data / "medquad" / "medquad_docs.jsonl",
        "judged_answer": shared_data / "liveqa_med_2017" / "judged_answers_medquad_2479.jsonl",
        "pubmed_abstract": shared_data / "pubmedqa" / "pubmedqa_corpus_contexts.jsonl",
    }
    for kind, source in samples.items():
        with source.open(encoding="utf-8") as handle:
            head = [next(handle) for _ in range(5)]
        result = read_file(write(tmp_path / f"{kind}.jsonl", "".join(head)), kind)
        assert not result.errors
        assert {d.source_type for d in result.documents} == {kind}
        first = result.documents[0]
        assert first.sections and all(s.section_id for s in first.sections)
    medquad = read_file(tmp_path / "medquad.jsonl", "m").documents[0]
    record = json.loads((tmp_path / "medquad.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert [s.section_id for s in medquad.sections] == [qa["answer_id"] for qa in record["qa"] if qa["answer"].strip()]
    assert all(qa["question"] not in medquad.text for qa in record["qa"])  # questions are the MedQuAD eval queries
    judged = read_file(tmp_path / "judged_answer.jsonl", "j").documents[0]
    assert not judged.text.startswith("Question:") and judged.title


def test_a_read_error_survives_pickling_to_another_process() -> None:
    """Worker processes and Ray tasks hand read errors back as values."""
    import pickle

    from ebmrag.errors import IngestError

    error = pickle.loads(pickle.dumps(IngestError("notes/a.pdf", "not a PDF")))
    assert (error.where, error.problem, str(error)) == ("notes/a.pdf", "not a PDF", "notes/a.pdf: not a PDF")
