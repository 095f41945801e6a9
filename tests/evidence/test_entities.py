from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.evidence.entities import EntityCompressor, EntityExtractor, EntityKind, default_extractor


@pytest.fixture(scope="module")
def compressor() -> EntityCompressor:
    return EntityCompressor(default_extractor())


@pytest.mark.parametrize(
    ("text", "must_contain"),
    [
        (
            "The biopsy, which was reviewed twice by the department, showed no evidence of malignancy.",
            "no evidence of malignancy",
        ),
        (
            "Urine culture was sent this morning. The patient denies fever, chills or dysuria at this time.",
            "denies fever, chills or dysuria",
        ),
        (
            "Chest radiograph today: no pleural effusion, but a new right lower lobe consolidation.",
            "no pleural effusion",
        ),
        ("病理示中分化腺癌，未见脉管侵犯。", "未见脉管侵犯"),
    ],
)
def test_negation_survives_compression(compressor: EntityCompressor, text: str, must_contain: str) -> None:
    assert must_contain.lower() in compressor.compress(text).text.lower()


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("Creatinine was 2.8 mg/dL, up from 1.1 mg/dL.", "2.8 mg/dL"),
        ("Mass measuring 8 mm × 6 mm in the left lobe.", "8 mm × 6 mm"),
        ("WBC 15.2 x10^9/L and CRP 148 mg/L.", "15.2 x10^9/L"),
        ("Blood pressure 152/90 mmHg at rest.", "152/90 mmHg"),
    ],
)
def test_values_keep_their_units(compressor: EntityCompressor, text: str, value: str) -> None:
    values = [e.text for e in default_extractor().extract(text) if e.kind is EntityKind.VALUE]
    assert value in values or value.split(" ×")[0] in values
    assert value in compressor.compress(text).text


def test_compression_drops_filler_and_reports_fidelity(compressor: EntityCompressor) -> None:
    text = (
        "Seen on the ward round this morning with his daughter present, who asked about parking. "
        "It was noted that creatinine was 2.8 mg/dL, taken in March 2026. He enjoyed his breakfast."
    )
    result = compressor.compress(text)
    assert "2.8 mg/dL" in result.text and "creatinine" in result.text.lower()
    assert "parking" not in result.text and "breakfast" not in result.text
    assert len(result.text) < len(text) / 2
    assert result.entities_total > result.entities_kept, "the dropped date lowers fidelity"
    assert 0 < result.fidelity_ratio < 1


def test_negated_entities_are_marked() -> None:
    entities = EntityExtractor().extract("No evidence of malignancy; lymphoma confirmed.")
    polarity = {e.text.lower(): e.negated for e in entities if e.kind is EntityKind.FINDING}
    assert polarity == {"malignancy": True, "lymphoma": False}, "a semicolon ends the negation scope"


def test_drug_allergen_names_found() -> None:
    kinds = {e.text.lower(): e.kind for e in default_extractor().extract("Anaphylaxis to amoxicillin and latex.")}
    assert kinds["amoxicillin"] is EntityKind.DRUG and kinds["latex"] is EntityKind.DRUG


def test_thousands_separators_never_split_a_value() -> None:
    """Before the fix, the clause cut at "1," and state B could read "100/mm3" for a count of 1,100/mm3."""
    text = "Laboratory studies show a leukocyte count of 1,100/mm3 with 20,000/mm3 platelets, and the family is here."
    state_b = EntityCompressor(default_extractor()).compress(text).text
    assert "1,100/mm3" in state_b and "20,000/mm3" in state_b


def test_state_b_is_stored_on_disk_and_read_back_without_computing(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from ebmrag.kvcache import KeyValueCache

    texts = ["Patient seen. Creatinine 2.1 mg/dL, up from 1.2; no known drug allergies.", "Walked well today."]
    store = KeyValueCache(tmp_path / "derived.sqlite", "compressions")
    first = EntityCompressor(default_extractor(), store=store).compress_many(texts)
    monkeypatch.setattr(EntityCompressor, "_compress", lambda *a: pytest.fail("computed again"))
    again = EntityCompressor(default_extractor(), store=store)
    assert again.compress_many([texts[1], texts[0], texts[1]]) == [first[1], first[0], first[1]]
